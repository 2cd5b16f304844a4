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
    with pytest.raises(ValueError, match=r"^learning_rate=nan: give a finite learning rate"):
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


# ---- the Python API refuses values of the wrong type, naming the parameter ----------------------------------------


@pytest.mark.parametrize(("option", "value"), [("overwrite", "no"), ("use_cpu", "no"), ("gather_across_devices", 1)])
def test_finetune_refuses_bool_options_that_are_no_bools(tmp_path, option, value):
    """HEAD read the string "no" as true: `overwrite="no"` replaced an existing fine-tuned model."""
    with pytest.raises(TypeError, match=rf"^retromae.finetune: {option}={re.escape(repr(value))} is not a bool; give "
                                        r"True or False$"):
        retromae.finetune(tmp_path / "model", tmp_path / "data", tmp_path / "out", **{option: value})


def test_the_trainer_refuses_training_arguments_whose_bools_are_no_bools(tmp_path, tokenizer, bert_rows):
    from transformers import TrainingArguments

    args = TrainingArguments(str(tmp_path), report_to="none", use_cpu=True)
    args.disable_tqdm = "no"
    with pytest.raises(TypeError, match=r"^TrainingArguments: disable_tqdm='no' is not a bool; give True or False$"):
        retromae.RetroMAETrainer(model=tiny_model(), args=args, train_dataset=bert_rows,
                                 data_collator=retromae.PretrainingCollator(tokenizer))


@pytest.mark.parametrize(("call", "match"), [
    (lambda: retromae.read_corpus(123), r"^read_corpus: source=123 \(int\) is not a path; give one path or Hub dataset"),
    (lambda: retromae.read_corpus(["a.jsonl", "b.txt"]), r"^read_corpus: source=\['a.jsonl', 'b.txt'\] \(list\) "
                                                         r"is not a path; .*put them in one folder"),
    (lambda: retromae.read_corpus(None, streaming="no"), r"^read_corpus: streaming='no' is not a bool"),
    (lambda: retromae.export_sentence_transformer(5, "out"), r"^export_sentence_transformer: checkpoint=5 \(int\) "
                                                             r"is not a path; .*export_from_model"),
    (lambda: retromae.export_sentence_transformer("ckpt", "out", overwrite="no"),
     r"^export_sentence_transformer: overwrite='no' is not a bool"),
    (lambda: retromae.finetune(123, "data", "out"), r"^retromae.finetune: model=123 \(int\) is not a path"),
    (lambda: retromae.finetune("model", None, "out"), r"^retromae.finetune: train_data=None \(NoneType\) is not a path"),
    (lambda: retromae.finetune("model", "data", None), r"^retromae.finetune: output_dir=None \(NoneType\) is not a "
                                                       r"path; give a str or os.PathLike$"),
    (lambda: retromae.PretrainingCollator(None), r"^PretrainingCollator: tokenizer=None is not a tokenizer"),
    (lambda: retromae.PretrainingCollator("models/bert"), r"^PretrainingCollator: tokenizer='models/bert' is not a "
                                                          r"tokenizer; .*AutoTokenizer.from_pretrained\('models/bert'\)$"),
])
def test_wrong_types_name_the_parameter(call, match):
    """HEAD: pathlib's "expected str, bytes or os.PathLike object, not int", or the collator's misleading "the
    tokenizer has no pad_token_id"."""
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.parametrize(("option", "value", "kind"), [("mask_ratio", "0.3", "a number"),
                                                       ("whole_word_mask", "no", "a bool"),
                                                       ("max_length", 32.0, "a whole number")])
def test_the_collator_refuses_options_of_the_wrong_type(tokenizer, option, value, kind):
    """HEAD: mask_ratio="0.3" failed on `'<' not supported between instances of 'float' and 'str'`."""
    with pytest.raises(TypeError, match=rf"^PretrainingCollator: {option}={re.escape(repr(value))} is not {kind}"):
        retromae.PretrainingCollator(tokenizer, **{option: value})


def test_the_trainer_refuses_a_model_that_is_no_pretraining_model(tmp_path, tokenizer, bert_rows):
    """HEAD failed inside transformers: `unsupported operand type(s) for /: 'NoneType' and 'int'` for a
    BertForMaskedLM, `'str' object has no attribute 'to'` for a path."""
    from transformers import BertConfig, BertForMaskedLM

    from .builders import tiny_bert_kwargs

    for model, got in ((BertForMaskedLM(BertConfig(**tiny_bert_kwargs())), "BertForMaskedLM"),
                       ("models/bert", "str 'models/bert'")):
        with pytest.raises(TypeError, match=r"^RetroMAETrainer needs a retromae \*ForPretraining model \(e.g. "
                                            rf"RetroMAEForPretraining.from_encoder_checkpoint\(path\)\); got {got}$"):
            make_trainer(tmp_path, tokenizer, bert_rows, model=model)


def test_basic_decoding_with_another_mask_id_than_the_collator_is_refused(tmp_path, tokenizer, bert_rows):
    """HEAD trained: the decoder input was masked with [unused2] (id 7) instead of [MASK] (103)."""
    with pytest.raises(ValueError, match=r"^model.config.mask_token_id 7 is not the collator tokenizer's mask id 103 "
                                         r".*mask_token_id=tokenizer.mask_token_id$"):
        make_trainer(tmp_path, tokenizer, bert_rows, model=tiny_model(decoding="basic", mask_token_id=7))
    make_trainer(tmp_path, tokenizer, bert_rows, model=tiny_model(decoding="basic", mask_token_id=103))
    make_trainer(tmp_path, tokenizer, bert_rows, model=tiny_model(mask_token_id=7))  # enhanced decoding reads no id


def test_a_config_field_set_after_the_model_was_built_is_validated_by_the_trainer(tmp_path, tokenizer, bert_rows):
    """HEAD trained: `model.config.num_decoder_layers = 2` passes the field's type check on assignment, and only the
    class validator refuses it with enhanced decoding (which builds exactly one decoder layer)."""
    model = tiny_model()
    model.config.num_decoder_layers = 2
    with pytest.raises(ValueError, match=r"num_decoder_layers=2 with decoding='enhanced'"):
        make_trainer(tmp_path, tokenizer, bert_rows, model=model)
