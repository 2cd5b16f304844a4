"""`import retromae`: every public name resolves, and importing the package alone stays light."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
import retromae


@pytest.mark.parametrize("name", [name for name in retromae.__all__ if name != "__version__"])
def test_every_public_name_resolves(name):
    value = getattr(retromae, name)
    assert getattr(value, "__name__", name) == name or name == "METHODS"


def test_version_and_unknown_names():
    assert retromae.__version__ not in {"", "unknown"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        retromae.nope  # noqa: B018


def test_import_alone_loads_neither_torch_nor_transformers():
    code = "import sys, retromae; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


# ---- RetroMAETrainer refuses inputs that do not fit together, before training --------------------------------------


@pytest.fixture(scope="module")
def bert_rows(tokenizer):
    import datasets

    texts = ["Dense retrieval ranks passages by the inner product of their vectors."] * 4
    return retromae.tokenize_corpus(datasets.Dataset.from_dict({"text": texts}), tokenizer, max_seq_length=32)


@pytest.fixture(scope="module")
def small_tokenizer():
    """A RoBERTa-style byte-level BPE tokenizer of 300 tokens (<s> 0, <pad> 1, </s> 2, <mask> 299)."""
    from .builders import tiny_bpe_tokenizer

    return tiny_bpe_tokenizer("roberta")


def tiny_model(**config):
    import torch

    from .builders import tiny_bert_kwargs

    torch.manual_seed(0)
    return retromae.RetroMAEForPretraining(retromae.RetroMAEConfig(**tiny_bert_kwargs(**config)))  # 128 positions


def make_trainer(tmp_path, tokenizer, dataset, *, collator=None, model=None, **args):
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path), **{"max_steps": 1, "report_to": "none", "use_cpu": True,
                                               "remove_unused_columns": False, **args})
    return retromae.RetroMAETrainer(model=model or tiny_model(), args=args, train_dataset=dataset,
                                    data_collator=collator or retromae.PretrainingCollator(tokenizer),
                                    processing_class=tokenizer)


def test_a_collator_of_another_tokenizer_is_refused(tmp_path, tokenizer, small_tokenizer, bert_rows):
    """HEAD trained: the RoBERTa collator masked BERT's [SEP] (id 2 is RoBERTa's </s>, not special for BERT), put
    RoBERTa's mask id 299 in and padded with id 1."""
    with pytest.raises(ValueError, match=r"^data_collator's tokenizer TokenizersBackend \(300 tokens, mask 299, pad 1, "
                                         r"cls 0, sep 2\) is not processing_class BertTokenizer \(30522 tokens, mask "
                                         r"103, pad 0, cls 101, sep 102\); build the collator from the same tokenizer"):
        make_trainer(tmp_path, tokenizer, bert_rows, collator=retromae.PretrainingCollator(small_tokenizer))


def test_a_collator_of_an_equal_tokenizer_is_accepted(tmp_path, tokenizer, minilm_dir, bert_rows):
    from transformers import AutoTokenizer

    same = AutoTokenizer.from_pretrained(str(minilm_dir))  # another object, the same ids
    make_trainer(tmp_path, tokenizer, bert_rows, collator=retromae.PretrainingCollator(same))


def test_sequences_beyond_the_position_table_are_refused(tmp_path, tokenizer):
    """HEAD accepted rows of 1000 tokens for a model of 128 positions; training then failed inside torch."""
    import datasets

    long_text = " ".join(["retrieval"] * 1200)
    rows = retromae.tokenize_corpus(datasets.Dataset.from_dict({"text": [long_text] * 2}), tokenizer,
                                    max_seq_length=1000)
    with pytest.raises(ValueError, match=r"train_dataset's longest sequence: 1000 tokens.*--max-seq-length 1000 exceeds "
                                         r"the model's position limit \(128, max_position_embeddings"):
        make_trainer(tmp_path, tokenizer, rows)


@pytest.mark.parametrize(("field", "value"), [("learning_rate", "fast"), ("max_steps", "10"),
                                              ("per_device_train_batch_size", 2.5), ("weight_decay", None)])
def test_training_arguments_that_are_no_numbers_are_refused(tmp_path, tokenizer, bert_rows, field, value):
    """HEAD: learning_rate="fast" failed on `'<=' not supported between 'float' and 'str'` inside torch's AdamW."""
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path), report_to="none", use_cpu=True)
    setattr(args, field, value)  # TrainingArguments itself compares some of them on construction
    with pytest.raises(TypeError, match=rf"^TrainingArguments {field}={re.escape(repr(value))} is not a"):
        retromae.RetroMAETrainer(model=tiny_model(), args=args, train_dataset=bert_rows,
                                 data_collator=retromae.PretrainingCollator(tokenizer))


def test_finetune_refuses_training_arguments_that_are_no_numbers(tmp_path):
    """HEAD: `'<=' not supported between instances of 'int' and 'str'`; the same check as the Trainer's, before any
    input is read."""
    with pytest.raises(TypeError, match=r"^TrainingArguments learning_rate='fast' is not a number"):
        retromae.finetune(tmp_path / "model", tmp_path / "data", tmp_path / "out", learning_rate="fast")


def test_training_arguments_are_checked_as_the_command_line_checks_them(tmp_path, tokenizer, bert_rows):
    with pytest.raises(ValueError, match=r"--learning-rate nan: give a finite learning rate"):
        make_trainer(tmp_path, tokenizer, bert_rows, learning_rate=float("nan"))


def test_an_untokenized_dataset_names_tokenize_corpus(tmp_path, tokenizer):
    """HEAD: transformers' "No columns in the dataset match the model's forward method signature" at train()."""
    import datasets

    text = datasets.Dataset.from_dict({"text": ["a passage"] * 4, "id": ["1", "2", "3", "4"]})
    with pytest.raises(ValueError, match=r"^train_dataset has no 'input_ids' column \(columns: \['text', 'id'\]\); "
                                         r"tokenize it first: retromae.tokenize_corpus\("):
        make_trainer(tmp_path, tokenizer, text)


def test_a_tokenizer_larger_than_the_embeddings_is_refused(tmp_path, tokenizer, bert_rows):
    """HEAD accepted 30522 token ids for 200 embedding rows; the first id above 199 failed inside torch."""
    with pytest.raises(ValueError, match=r"the tokenizer has 30522 tokens but the model .* has only 200 embedding rows"):
        make_trainer(tmp_path, tokenizer, bert_rows, model=tiny_model(vocab_size=200))


def test_a_tokenizer_much_smaller_than_the_embeddings_is_warned(tmp_path, small_tokenizer, caplog):
    """HEAD trained a 300-token tokenizer on 30522 embedding rows without a word."""
    import datasets

    rows = retromae.tokenize_corpus(datasets.Dataset.from_dict({"text": ["hello world"] * 4}), small_tokenizer,
                                    max_seq_length=32)
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.trainer"):
        make_trainer(tmp_path, small_tokenizer, rows)
    assert re.search(r"the tokenizer \(TokenizersBackend\) has 300 tokens but the model has 30522 embedding rows",
                     caplog.text)


def test_only_the_rows_of_a_selected_view_count_for_the_position_limit(tmp_path, tokenizer):
    import datasets
    from retromae.trainers.training.trainer import longest_sequence

    texts = [" ".join(["retrieval"] * 300), "a short passage", "another short one"]
    rows = retromae.tokenize_corpus(datasets.Dataset.from_dict({"text": texts}), tokenizer, max_seq_length=200)
    short = rows.select([2, 1])
    assert (longest_sequence(rows), longest_sequence(short)) == (200, 5)  # [CLS] another short one [SEP]
    make_trainer(tmp_path, tokenizer, short)
    with pytest.raises(ValueError, match="longest sequence: 200 tokens"):
        make_trainer(tmp_path, tokenizer, rows)
