"""A tokenized `--corpus` folder trains only with the tokenizer and length that made it: `--save-tokenized` records
them (`retromae_tokenized.json`), a folder without the record must hold rows the run's tokenizer could have made, a
folder of text and ids is refused, and the span positives that need the text say so. The truncation warning's share
and text-format hint."""

from __future__ import annotations

import json
import logging
import shutil

import datasets
import pytest
from retromae.trainers.cli import main
from retromae.trainers.data.reading import read_corpus
from retromae.trainers.data.tokenize import load_tokenized_corpus, tokenize_corpus
from retromae.trainers.data.tokenized_record import TOKENIZED_RECORD
from transformers import AutoTokenizer

from ..builders import SENTENCES, pretrain_args, write_lines

pytestmark = pytest.mark.usefixtures("datasets_cache")

TRAIN = ("--no-export", "true", "--max-steps", "1")


def error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("retromae pretrain: error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def roberta_ids(tiny_roberta, corpus, tmp_path_factory):
    """`corpus` saved by `pretrain --save-tokenized` with the tiny RoBERTa's tokenizer (300 tokens, <s> 0), at 32."""
    folder = tmp_path_factory.mktemp("saved") / "roberta-ids"
    assert main(pretrain_args(tiny_roberta, corpus, folder.parent / "unused", "--save-tokenized", str(folder))) == 0
    return folder


@pytest.fixture(scope="module")
def bert_ids(tiny_bert, corpus, tmp_path_factory):
    """`corpus` saved by `pretrain --save-tokenized` with the tiny BERT's (MiniLM) tokenizer, at 32 tokens."""
    folder = tmp_path_factory.mktemp("saved") / "bert-ids"
    assert main(pretrain_args(tiny_bert, corpus, folder.parent / "unused", "--save-tokenized", str(folder))) == 0
    return folder


def test_save_tokenized_records_the_tokenizer_length_and_packing(bert_ids, tokenizer):
    record = json.loads((bert_ids / TOKENIZED_RECORD).read_text())
    assert record["max_seq_length"] == 32 and record["packing"] is False
    assert record["tokenizer"]["vocab_size"] == len(tokenizer)
    assert record["tokenizer"]["special_ids"]["cls"] == tokenizer.cls_token_id
    assert len(record["tokenizer"]["vocab_sha256"]) == 64
    assert datasets.load_from_disk(str(bert_ids)).column_names == ["input_ids", "word_starts"]


def test_a_run_from_a_packed_folder_records_packing(tiny_bert, corpus, tmp_path):
    """HEAD: the run record (and the card) said "packing": false for the packed rows it trained."""
    folder = tmp_path / "packed"
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "unused", "--save-tokenized", str(folder),
                              "--packing", "true")) == 0
    assert main(pretrain_args(tiny_bert, folder, tmp_path / "run", *TRAIN)) == 0
    assert json.loads((tmp_path / "run" / "retromae_run.json").read_text())["packing"] is True
    # --packing agrees with the folder: accepted (HEAD refused it as packing an already tokenized corpus)
    assert main(pretrain_args(tiny_bert, folder, tmp_path / "run2", *TRAIN, "--packing", "true")) == 0


def test_a_folder_saved_with_another_tokenizer_is_refused(tiny_bert, roberta_ids, tmp_path, capsys):
    """HEAD: the RoBERTa ids (all below BERT's 30,522) trained as BERT tokens, [PAD] at the sentence position."""
    assert main(pretrain_args(tiny_bert, roberta_ids, tmp_path / "run", *TRAIN)) == 2
    line = error_line(capsys)
    assert f"--corpus {roberta_ids} was tokenized with the tokenizer " in line
    assert "(300 tokens), whose size, vocabulary and special token ids differ from this run's" in line
    assert "(30522 tokens)" in line and "--save-tokenized FOLDER" in line
    assert not (tmp_path / "run").exists()


def test_the_record_compares_what_the_ids_mean_not_the_tokenizers_path(bert_ids, tokenizer, tmp_path):
    """The same tokenizer from another folder (a checkpoint's copy, here MiniLM's own folder) trains from it."""
    assert json.loads((bert_ids / TOKENIZED_RECORD).read_text())["tokenizer"]["name_or_path"] != tokenizer.name_or_path
    assert load_tokenized_corpus(str(bert_ids), tokenizer, max_seq_length=32).num_rows > 0
    other = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    other.add_tokens(["retromaeword"])  # one more token: another vocabulary
    with pytest.raises(ValueError, match=r"whose size and vocabulary differ from this run's"):
        load_tokenized_corpus(str(bert_ids), other, max_seq_length=32)


@pytest.mark.parametrize("asked", [64, 16])
def test_a_recorded_length_must_be_the_runs(bert_ids, tokenizer, asked):
    """HEAD: 64 trained the 32-token rows silently (and recorded 64); 16 was refused by the rows' length."""
    with pytest.raises(ValueError) as refused:
        load_tokenized_corpus(str(bert_ids), tokenizer, max_seq_length=asked)
    assert str(refused.value) == (
        f"--corpus {bert_ids} was tokenized at --max-seq-length 32 (longer passages were cut there), and this run asks "
        f"for {asked}: pass --max-seq-length 32, or tokenize the text again at {asked} with --save-tokenized FOLDER")


def test_a_longer_max_seq_length_is_refused_on_the_command_line(tiny_bert, bert_ids, tmp_path, capsys):
    assert main(pretrain_args(tiny_bert, bert_ids, tmp_path / "run", *TRAIN, "--max-seq-length", "64")) == 2
    assert "was tokenized at --max-seq-length 32" in error_line(capsys)


def test_an_unreadable_record_is_refused(bert_ids, tokenizer, tmp_path):
    folder = tmp_path / "ids"
    shutil.copytree(bert_ids, folder)
    (folder / TOKENIZED_RECORD).write_text("{")
    with pytest.raises(ValueError, match=rf"--corpus {folder}: its {TOKENIZED_RECORD} cannot be read"):
        load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)


@pytest.mark.parametrize("packing", [False, True])
def test_rows_of_another_tokenizer_without_a_record_are_refused(tiny_roberta, corpus, tokenizer, tmp_path, packing):
    """A folder saved in Python has no record: its rows must start and end as the run's tokenizer makes them."""
    roberta = AutoTokenizer.from_pretrained(str(tiny_roberta))
    folder = tmp_path / "ids"
    tokenize_corpus(read_corpus(corpus), roberta, max_seq_length=32, packing=packing).save_to_disk(str(folder))
    with pytest.raises(ValueError) as refused:
        load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)
    assert str(refused.value).startswith(f"--corpus {folder}: row 0 starts with [PAD] (0), not [CLS] (101), which "
                                         f"the tokenizer {tokenizer.name_or_path} starts every text with")
    assert "--save-tokenized FOLDER" in str(refused.value) and "\n" not in str(refused.value)


def test_rows_without_the_closing_special_token_are_refused(tokenizer, tmp_path):
    folder = tmp_path / "ids"
    datasets.Dataset.from_dict({"input_ids": [[101, 2000, 102]] * 3 + [[101, 2000, 2001]]}).save_to_disk(str(folder))
    with pytest.raises(ValueError, match=r"row 3 ends with \S+ \(2001\), not \[SEP\] \(102\)"):
        load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)


def test_rows_of_the_runs_tokenizer_without_a_record_train_with_a_note_on_their_length(tokenizer, corpus, tmp_path,
                                                                                      caplog):
    folder = tmp_path / "ids"
    tokenize_corpus(read_corpus(corpus), tokenizer, max_seq_length=32, packing=True).save_to_disk(str(folder))
    assert load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32).num_rows > 0
    assert "records no tokenized length" not in caplog.text
    assert load_tokenized_corpus(str(folder), tokenizer, max_seq_length=64).num_rows > 0
    assert (f"--corpus {folder} records no tokenized length (it was not saved by --save-tokenized) and its longest "
            "row has 32 tokens, under --max-seq-length 64") in caplog.text


def test_a_folder_of_text_and_ids_is_refused_naming_both_columns(tiny_bert, tokenizer, tmp_path, capsys):
    """HEAD: trained the ids ([unused0] [unused1], no [CLS]) and ignored the text."""
    folder = tmp_path / "both"
    datasets.Dataset.from_dict({"text": SENTENCES[:8], "input_ids": [[1, 2]] * 8}).save_to_disk(str(folder))
    message = (f"--corpus {folder} holds both a 'text' column and an 'input_ids' column, and either could be the "
               "corpus: to train the text, save it without the ids (dataset.remove_columns('input_ids')")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_tokenized_corpus(str(folder), tokenizer, max_seq_length=32)
    capsys.readouterr()  # save_to_disk's progress
    assert main(pretrain_args(tiny_bert, folder, tmp_path / "run", *TRAIN)) == 2
    assert message in error_line(capsys)


@pytest.mark.parametrize(("flags", "message"), [
    (("--method", "sentmae"), "SentMAE's span positives are two spans of each passage's text: pass the text corpus as "
                              "--corpus, or pairs with --pairs FILE.jsonl, or switch the contrastive loss off with "
                              "--method-options '{\"contrastive_loss_weight\": 0}'"),
    (("--contrastive-anchor-weight", "0.5"), "the anchor's positives are two spans of each passage's text: pass the "
                                             "text corpus as --corpus, or drop --contrastive-anchor-weight"),
], ids=["sentmae", "anchor"])
def test_span_positives_from_a_tokenized_folder_ask_for_the_text(tiny_bert, bert_ids, tmp_path, capsys, flags,
                                                                 message):
    """HEAD: "has no 'text' column ...; rename the passage column to 'text'", advice that renames the ids."""
    assert main(pretrain_args(tiny_bert, bert_ids, tmp_path / "run", *TRAIN, *flags)) == 2
    assert error_line(capsys).endswith(f"--corpus {bert_ids} is tokenized, and {message}")


# ---- the truncation warning ------------------------------------------------------------------------------------------


def truncation_record(caplog) -> logging.LogRecord:
    (record,) = [r for r in caplog.records if "truncation" in r.getMessage()]
    return record


def test_one_long_line_is_not_told_about_blocks(tokenizer, tmp_path, caplog):
    """HEAD: "drops 100.0% of the text tokens" (30 of 100,000 kept) and the hint about blocks, for a one-line file."""
    path = write_lines(tmp_path / "long.txt", [" ".join(["word"] * 100_000)])
    tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=32)
    message = truncation_record(caplog).getMessage()
    assert "drops over 99.9% of the text tokens" in message and "--text-format" not in message


def test_a_txt_read_as_blocks_is_told_once(tokenizer, tmp_path, caplog):
    """The reader's warning names the empty line; the truncation warning does not repeat the hint."""
    lines = [f"passage number {i} about dense retrieval" for i in range(200)]  # two blocks of ~700 tokens
    path = write_lines(tmp_path / "blocks.txt", [*lines[:100], "", *lines[100:]])
    tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=32)
    told = [r.getMessage() for r in caplog.records if "--text-format" in r.getMessage()]
    assert len(told) == 1 and "line 101 is empty" in told[0], told
    assert "--text-format" not in truncation_record(caplog).getMessage()
