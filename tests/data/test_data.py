"""Tests for retromae.trainers.data (reading, builtin, tokenize, collator): corpus readers, tokenization and the
encoder MLM collator."""

from __future__ import annotations

import json
import logging
import os
import re

import datasets
import numpy as np
import pytest
import retromae.trainers.data.reading as reading_module
import retromae.trainers.data.tokenize as tokenize_module
import torch
from retromae.trainers.data.builtin import builtin_corpus
from retromae.trainers.data.collator import PretrainingCollator
from retromae.trainers.data.passages import CorpusError
from retromae.trainers.data.reading import read_corpus
from retromae.trainers.data.tokenize import NUM_PROC_MIN_ROWS, map_processes, tokenize_corpus

from ..builders import jsonl_text, texts_of, write_file

pytestmark = pytest.mark.usefixtures("datasets_cache")


# ---------------------------------------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------------------------------------


def test_txt_lines(tmp_path):
    path = write_file(tmp_path / "c.txt", "first passage\nsecond   passage \n\n  third\n")
    corpus = read_corpus(path, text_format="lines")
    assert isinstance(corpus, datasets.Dataset)
    assert corpus.column_names == ["text"]
    assert texts_of(corpus) == ["first passage", "second passage", "third"]


def test_txt_blocks(tmp_path):
    path = write_file(tmp_path / "c.txt", "Title one\nline a\nline b\n\n\nTitle two\r\nline c\n")
    assert texts_of(read_corpus(path, text_format="blocks")) == ["Title one line a line b", "Title two line c"]


def test_txt_blocks_whitespace_only_line_does_not_split(tmp_path):
    # As in ../shared/data/enwiki-sample: a line holding a space sits inside an article.
    path = write_file(tmp_path / "c.txt", "Article one\nSection.\n \nMore text.\n\nArticle two\n")
    assert texts_of(read_corpus(path)) == ["Article one Section. More text.", "Article two"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a b\nc d\n\ne f\n", ["a b c d", "e f"]),  # blank line between non-empty lines -> blocks
        ("\n\na b\nc d\n\n\n", ["a b", "c d"]),  # blank lines only at the edges -> lines
        ("a b\nc d\n", ["a b", "c d"]),  # no blank line -> lines
    ],
)
def test_txt_auto_detection(tmp_path, content, expected):
    assert texts_of(read_corpus(write_file(tmp_path / "c.txt", content))) == expected


def test_auto_detected_blocks_name_the_empty_line(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    path = write_file(tmp_path / "c.txt", "one\ntwo\nthree\n\nfour\n")
    assert texts_of(read_corpus(path)) == ["one two three", "four"]
    assert f"{path}: one passage per block of lines between empty lines (--text-format auto: line 4 is empty " \
        "between text lines); --text-format lines reads one passage per line" in caplog.text


def test_jsonl_with_and_without_title(tmp_path):
    content = jsonl_text(
        {"_id": "1", "title": "A title", "text": "the body."},
        {"_id": "2", "title": "", "text": "no title here."},
        {"_id": "3", "text": "no title key."},
    )
    path = write_file(tmp_path / "corpus.jsonl", content.replace("\n", "\n\n", 1))  # a blank line is skipped
    assert texts_of(read_corpus(path)) == ["A title the body.", "no title here.", "no title key."]


def test_jsonl_with_a_byte_order_mark(tmp_path):
    """Windows editors start UTF-8 files with a byte order mark; it is not part of the first record."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + jsonl_text({"text": "first"}, {"text": "second"}).encode())
    assert texts_of(read_corpus(path)) == ["first", "second"]


def test_beir_folder_reads_corpus_jsonl_only(tmp_path):
    write_file(tmp_path / "beir" / "corpus.jsonl", jsonl_text({"_id": "d1", "title": "T", "text": "doc"}))
    write_file(tmp_path / "beir" / "queries.jsonl", jsonl_text({"_id": "q1", "text": "a query"}))
    write_file(tmp_path / "beir" / "qrels" / "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert texts_of(read_corpus(tmp_path / "beir")) == ["T doc"]


def test_a_folder_with_corpus_jsonl_but_no_queries_or_qrels_is_a_folder_corpus(tmp_path):
    """Not a BEIR folder: every file is read, corpus.jsonl included (it used to be read alone)."""
    write_file(tmp_path / "mixed" / "corpus.jsonl", jsonl_text({"text": "alpha"}))
    write_file(tmp_path / "mixed" / "more.jsonl", jsonl_text({"text": "beta"}))
    write_file(tmp_path / "mixed" / "notes.txt", "gamma\n")
    assert texts_of(read_corpus(tmp_path / "mixed")) == ["alpha", "beta", "gamma"]


def test_save_to_disk_dataset_and_dataset_dict(tmp_path):
    rows = {"id": ["1", "2"], "text": ["alpha beta", "gamma delta"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict({"id": ["3"], "text": ["x"]})}
    ).save_to_disk(str(tmp_path / "dd"))
    for folder in ("ds", "dd"):
        corpus = read_corpus(tmp_path / folder)
        assert corpus.column_names == ["text"]
        assert texts_of(corpus) == ["alpha beta", "gamma delta"]


@pytest.mark.parametrize(("values", "shown"), [([1, 2], "Value('int64')"),
                                               ([["dense retrieval", "is fun"]] * 2, "List(Value('string'))")])
def test_save_to_disk_text_column_of_non_strings_is_refused(tmp_path, values, shown):
    """A list of two strings would silently train on the sentence pair [CLS] A [SEP] B [SEP]."""
    datasets.Dataset.from_dict({"text": values}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=rf"the 'text' column holds {re.escape(shown)}, not strings"):
        read_corpus(tmp_path / "ds")


def test_save_to_disk_without_text_column(tmp_path):
    datasets.Dataset.from_dict({"body": ["a"]}).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"no 'text' column .*body.*rename_column"):
        read_corpus(tmp_path / "ds")


def test_directory_of_files_sorted(tmp_path):
    write_file(tmp_path / "b" / "2.jsonl", jsonl_text({"text": "from jsonl"}))
    write_file(tmp_path / "a.txt", "from a\n")
    write_file(tmp_path / "c.txt", "c block one\nstill one\n\nc block two\n")
    write_file(tmp_path / ".hidden.txt", "ignored\n")
    corpus = read_corpus(tmp_path)
    assert texts_of(corpus) == ["from a", "from jsonl", "c block one still one", "c block two"]


def test_a_folder_corpus_reads_symlinked_subfolders(tmp_path):
    """HEAD: `Path.rglob` did not descend into the link, so the run trained on a.jsonl's 30 passages of 70."""
    write_file(tmp_path / "corpus" / "a.jsonl", jsonl_text(*({"text": f"a {i}"} for i in range(30))))
    write_file(tmp_path / "elsewhere" / "b.jsonl", jsonl_text(*({"text": f"b {i}"} for i in range(40))))
    (tmp_path / "corpus" / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert len(read_corpus(tmp_path / "corpus")) == 30 + 40


@pytest.mark.parametrize("target", ["..", "."], ids=["parent", "itself"])
def test_a_symlink_loop_in_a_corpus_folder_is_refused(tmp_path, target):
    write_file(tmp_path / "corpus" / "sub" / "a.txt", "one passage\n")
    (tmp_path / "corpus" / "sub" / "loop").symlink_to(target, target_is_directory=True)
    with pytest.raises(ValueError, match=r"sub/loop is a symbolic link to .*, a folder that holds it \(a loop\); "
                                          r"remove the link$"):
        read_corpus(tmp_path / "corpus")


def test_a_folder_reached_twice_through_a_symlink_is_refused(tmp_path):
    write_file(tmp_path / "corpus" / "real" / "a.txt", "one passage\n")
    (tmp_path / "corpus" / "again").symlink_to(tmp_path / "corpus" / "real", target_is_directory=True)
    with pytest.raises(ValueError, match=r"real and again are the same folder through a symbolic link, so its files "
                                          r"would be read twice; remove the link$"):
        read_corpus(tmp_path / "corpus")


def test_streaming_yields_the_same_texts(tmp_path):
    write_file(tmp_path / "a.txt", "one\ntwo\n")
    write_file(tmp_path / "b.jsonl", jsonl_text({"title": "T", "text": "three"}))
    streamed = read_corpus(tmp_path, streaming=True)
    assert isinstance(streamed, datasets.IterableDataset)
    assert texts_of(streamed) == texts_of(read_corpus(tmp_path)) == ["one", "two", "T three"]


def test_none_reads_the_builtin_corpus():
    corpus = read_corpus(None)
    assert texts_of(corpus)[:3] == texts_of(builtin_corpus())[:3]
    assert isinstance(read_corpus(None, streaming=True), datasets.IterableDataset)


def test_edited_file_is_not_served_from_cache(tmp_path):
    path = write_file(tmp_path / "c.txt", "old text\n")
    assert texts_of(read_corpus(path)) == ["old text"]
    write_file(path, "new text\n")  # same size: only the mtime tells the edit apart
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert texts_of(read_corpus(path)) == ["new text"]


def test_code_change_invalidates_caches(tmp_path, tokenizer, monkeypatch):
    """datasets does not hash the helpers a generator / map function calls; our code fingerprint must."""
    path = write_file(tmp_path / "c.txt", "some text\n")
    corpus = read_corpus(path)
    tokenized = tokenize_corpus(corpus, tokenizer, max_seq_length=16)
    monkeypatch.setattr(reading_module, "_reader_fingerprint", lambda: "changed reader code")
    monkeypatch.setattr(tokenize_module, "_tokenizer_fingerprint", lambda: "changed tokenizer code")
    assert read_corpus(path).cache_files != corpus.cache_files
    assert tokenize_corpus(corpus, tokenizer, max_seq_length=16).cache_files != tokenized.cache_files


def test_invalid_text_format(tmp_path):
    with pytest.raises(ValueError, match="text_format"):
        read_corpus(write_file(tmp_path / "c.txt", "a\n"), text_format="paragraphs")


# ---------------------------------------------------------------------------------------------------------------------
# Bad input -> CorpusError naming the file and line
# ---------------------------------------------------------------------------------------------------------------------

GOOD_LINE = json.dumps({"text": "fine"}) + "\n"
BAD_FILES = {
    "not_json": ("c.jsonl", (GOOD_LINE + "{not json}\n").encode(), ":2:", "not valid JSON"),
    "no_text": ("c.jsonl", (GOOD_LINE * 2 + '{"title": "t", "body": "x"}\n').encode(), ":3:",
                'no "text" field (keys: [\'body\', \'title\']); give every line a string "text" field'),
    "text_null": ("c.jsonl", (GOOD_LINE + '{"text": null}\n').encode(), ":2:",
                  'the "text" field must be a string, found null (JSON null)'),
    "text_number": ("c.jsonl", (GOOD_LINE + '{"text": 123}\n').encode(), ":2:",
                    'the "text" field must be a string, found 123 (JSON number); write the passage in quotes'),
    "not_object": ("c.jsonl", (GOOD_LINE + '["a", "b"]\n').encode(), ":2:", 'found a JSON array'),
    "truncated": ("c.jsonl", (GOOD_LINE + '{"text": "fine"\n').encode(), ":2:",
                  "not valid JSON (Expecting ',' delimiter at column 16)"),  # HEAD: "column 1", of the newline
    "too_deep": ("c.jsonl", (GOOD_LINE + "[" * 100_000 + "]" * 100_000 + "\n").encode(), ":2:",
                 "JSON nested too deeply to read"),  # HEAD: a RecursionError inside datasets' generator
    "latin1_jsonl": ("c.jsonl", (GOOD_LINE * 2).encode() + '{"text": "café"}\n'.encode("latin-1"), ":3:", "UTF-8"),
    "latin1_txt": ("c.txt", b"ok\nok\ncaf\xe9 au lait\n", ":3:", "UTF-8"),
}


@pytest.mark.parametrize("streaming", [False, True], ids=["dataset", "streaming"])
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_names_file_and_line(tmp_path, case, streaming):
    name, content, line, reason = BAD_FILES[case]
    path = write_file(tmp_path / name, content)
    with pytest.raises(ValueError) as excinfo:
        corpus = read_corpus(path, streaming=streaming)
        list(corpus)  # streaming: errors surface while iterating
    # Exactly our error, not datasets' DatasetGenerationError wrapping it.
    assert type(excinfo.value) is CorpusError
    message = str(excinfo.value)
    assert f"{path.resolve()}{line}" in message
    assert reason in message


@pytest.mark.parametrize(("codec", "iconv"), [
    ("utf-16", "utf-16"),  # with a byte-order mark
    ("utf-16-le", "utf-16le"), ("utf-16-be", "utf-16be"),  # without one: NUL bytes beside the ASCII characters
    ("utf-32", "utf-32"), ("utf-32-le", "utf-32le"),
])
@pytest.mark.parametrize("name", ["c.txt", "c.jsonl"])
def test_a_utf16_or_utf32_corpus_names_its_encoding(tmp_path, codec, iconv, name):
    """HEAD: a UTF-16 .txt was told "iconv -f latin1" (with a BOM) or read as text full of NULs (without one)."""
    content = "first passage\nsecond passage\n" if name.endswith(".txt") else jsonl_text({"text": "first"}, {"text": "x"})
    path = write_file(tmp_path / name, content.encode(codec))
    with pytest.raises(ValueError) as excinfo:
        read_corpus(path)
    message = str(excinfo.value)
    assert message.startswith(str(path.resolve())) and f"iconv -f {iconv} -t utf-8" in message
    assert "latin1" not in message


def test_missing_path(tmp_path):
    missing = tmp_path / "nope" / "corpus.jsonl"
    with pytest.raises(ValueError, match=r"corpus\.jsonl.* does not exist"):
        read_corpus(missing)


def test_unknown_hub_name_offline():
    with pytest.raises(ValueError, match=r"'no-such-owner/no-such-corpus' was not found locally .* or on the Hub"):
        read_corpus("no-such-owner/no-such-corpus")


@pytest.mark.parametrize("streaming", [False, True])
def test_empty_file(tmp_path, streaming):
    path = write_file(tmp_path / "empty.txt", "\n  \n\n")
    with pytest.raises(ValueError, match=r"empty\.txt.* holds no non-blank line"):
        read_corpus(path, streaming=streaming)


def test_directory_without_corpus_files(tmp_path):
    write_file(tmp_path / "notes.csv", "a,b\n")
    with pytest.raises(ValueError, match="holds no corpus"):
        read_corpus(tmp_path)


def test_all_blank_passages_fail_in_read_corpus(tmp_path):
    """Whitespace-only JSONL passages are skipped by read_corpus, which then reports the empty corpus."""
    path = write_file(tmp_path / "blank.jsonl", jsonl_text({"text": "   "}, {"title": "", "text": "\t"}))
    with pytest.raises(ValueError, match=r"blank\.jsonl.* is blank"):
        read_corpus(path)


def test_all_blank_passages_fail_in_tokenize_corpus(tokenizer):
    """A Dataset built by the user skips read_corpus; tokenize_corpus reports that nothing is left."""
    corpus = datasets.Dataset.from_dict({"text": ["", "   ", None]})
    with pytest.raises(ValueError, match="every passage is empty"):
        tokenize_corpus(corpus, tokenizer, max_seq_length=16)


# ---------------------------------------------------------------------------------------------------------------------
# Tokenization
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def passages() -> datasets.Dataset:
    return builtin_corpus().select(range(200))


def expected_word_starts(tokenizer, ids: list[int]) -> list[int]:
    """For BERT WordPiece a token continues a word exactly when it is a '##' piece."""
    return [0 if token.startswith("##") else 1 for token in tokenizer.convert_ids_to_tokens(ids)]


def test_truncation(tokenizer, passages):
    tokenized = tokenize_corpus(passages, tokenizer, max_seq_length=32)
    assert tokenized.column_names == ["input_ids", "word_starts"]
    assert len(tokenized) == len(passages)
    lengths = [len(row["input_ids"]) for row in tokenized]
    assert max(lengths) == 32  # the long passages are cut at exactly max_seq_length
    for row in tokenized:
        ids = row["input_ids"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert row["word_starts"] == expected_word_starts(tokenizer, ids)


def test_the_share_of_text_truncation_drops_is_reported(tokenizer, caplog):
    """HEAD: silent, also when a stray empty line made a one-passage-per-line .txt two blocks of thousands of tokens."""
    caplog.set_level(logging.INFO)
    long_passages = [" ".join(["word"] * 400)] * 2  # 400 text tokens each, 30 kept
    tokenize_corpus(long_passages, tokenizer, max_seq_length=32)
    (record,) = [r for r in caplog.records if "truncation" in r.getMessage()]
    assert record.levelno == logging.WARNING and "drops 92.5% of the text tokens" in record.getMessage()
    assert "--packing" in record.getMessage()
    assert "--text-format" not in record.getMessage(), "a list of passages was read from no .txt"
    caplog.clear()
    tokenize_corpus([" ".join(["word"] * 60), "word"], tokenizer, max_seq_length=32)
    (record,) = [r for r in caplog.records if "truncation" in r.getMessage()]
    assert record.levelno == logging.INFO and "drops 49.2% of the text tokens" in record.getMessage()  # 30 of 61
    caplog.clear()
    tokenize_corpus(long_passages, tokenizer, max_seq_length=32, packing=True)
    tokenize_corpus(["word"] * 4, tokenizer, max_seq_length=32)
    assert not [r for r in caplog.records if "truncation" in r.getMessage()]


def test_word_starts_of_multi_piece_word(tokenizer):
    corpus = datasets.Dataset.from_dict({"text": ["unbelievably good tokenization"]})
    row = tokenize_corpus(corpus, tokenizer, max_seq_length=64)[0]
    tokens = tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert tokens == ["[CLS]", "un", "##bel", "##ie", "##va", "##bly", "good", "token", "##ization", "[SEP]"]
    assert row["word_starts"] == [1, 1, 0, 0, 0, 0, 1, 1, 0, 1]


def test_empty_passages_are_dropped(tokenizer):
    corpus = datasets.Dataset.from_dict({"text": ["hello world", "", "  ", "again"], "id": [1, 2, 3, 4]})
    tokenized = tokenize_corpus(corpus, tokenizer, max_seq_length=16)
    assert tokenized.column_names == ["input_ids", "word_starts"]
    assert [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in tokenized] == [
        "hello world",
        "again",
    ]


def test_packing(tokenizer, passages):
    max_len = 64
    packed = tokenize_corpus(passages, tokenizer, max_seq_length=max_len, packing=True)
    rows = list(packed)
    lengths = [len(row["input_ids"]) for row in rows]
    assert all(length == max_len for length in lengths[:-1]) and 8 + 2 <= lengths[-1] <= max_len
    inner = []
    for row in rows:
        ids, starts = row["input_ids"], row["word_starts"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert tokenizer.cls_token_id not in ids[1:-1] and tokenizer.sep_token_id not in ids[1:-1]
        expected = expected_word_starts(tokenizer, ids)
        expected[1] = 1  # a word cut at the block edge starts a new unit
        assert starts == expected
        inner.extend(ids[1:-1])
    # Nothing lost but a tail shorter than 8 tokens (200 passages: one map batch).
    flat = [i for text in texts_of(passages) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert flat[: len(inner)] == inner and len(flat) - len(inner) < 8
    assert len(rows) == len(flat) // (max_len - 2) + (len(flat) % (max_len - 2) >= 8)


@pytest.mark.parametrize("packing", [False, True])
def test_streaming_tokenization_matches(tokenizer, tmp_path, packing):
    path = write_file(tmp_path / "c.txt", "\n".join(texts_of(builtin_corpus().select(range(30)))) + "\n")
    streamed = tokenize_corpus(read_corpus(path, streaming=True), tokenizer, max_seq_length=48, packing=packing)
    assert isinstance(streamed, datasets.IterableDataset)
    eager = tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=48, packing=packing)
    streamed_rows = [{key: list(value) for key, value in row.items()} for row in streamed]
    assert streamed_rows == [dict(row) for row in eager]


def test_tokenization_is_cached(tokenizer, tmp_path):
    path = write_file(tmp_path / "c.txt", "one passage\nanother passage\n")
    first = tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=16)
    second = tokenize_corpus(read_corpus(path), tokenizer, max_seq_length=16)
    assert first.cache_files and first.cache_files == second.cache_files  # same fingerprint: tokenizer hashes stably


def test_tokenize_needs_fast_tokenizer_and_room():
    class SlowTokenizer:
        is_fast = False

    corpus = datasets.Dataset.from_dict({"text": ["a"]})
    with pytest.raises(ValueError, match="fast tokenizer"):
        tokenize_corpus(corpus, SlowTokenizer(), max_seq_length=16)


def test_tokenize_needs_text_column(tokenizer):
    with pytest.raises(ValueError, match=r"no 'text' column .*'body'"):
        tokenize_corpus(datasets.Dataset.from_dict({"body": ["a"]}), tokenizer, max_seq_length=16)


def test_tokenize_refuses_a_text_column_of_no_strings_as_the_command_line_does(tokenizer):
    """HEAD: transformers' "text input must be of type `str`"; the command line named the column's type."""
    with pytest.raises(CorpusError, match=r"^dataset 'the corpus': the 'text' column holds Value\('int64'\), not "
                                          r"strings; save one passage string per row"):
        tokenize_corpus(datasets.Dataset.from_dict({"text": [1, 2]}), tokenizer, max_seq_length=32)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_tokenize_packing_must_be_a_bool(tokenizer, value):
    """HEAD packed with packing="no" (a non-empty string is true)."""
    with pytest.raises(TypeError, match=rf"^tokenize_corpus: packing={re.escape(repr(value))} is not a bool; give "
                                        r"True or False$"):
        tokenize_corpus(datasets.Dataset.from_dict({"text": ["a b"] * 8}), tokenizer, max_seq_length=32, packing=value)


def test_tokenize_max_seq_length_too_small(tokenizer):
    with pytest.raises(ValueError, match="max_seq_length=2"):
        tokenize_corpus(datasets.Dataset.from_dict({"text": ["a"]}), tokenizer, max_seq_length=2)


@pytest.mark.parametrize("value", ["32", 32.0, None, True])
def test_tokenize_max_seq_length_must_be_a_whole_number(tokenizer, value):
    """HEAD: "32" failed on `'<=' not supported between instances of 'str' and 'int'`."""
    with pytest.raises(TypeError, match=rf"^tokenize_corpus: max_seq_length={re.escape(repr(value))} is not a whole "
                                        r"number .*max_seq_length=256$"):
        tokenize_corpus(datasets.Dataset.from_dict({"text": ["a"]}), tokenizer, max_seq_length=value)


def test_tokenize_corpus_takes_a_list_of_strings(tokenizer):
    """HEAD: `AttributeError: 'list' object has no attribute 'column_names'`."""
    passages = ["one passage", "another passage"]
    from_list = tokenize_corpus(passages, tokenizer, max_seq_length=16)
    from_dataset = tokenize_corpus(datasets.Dataset.from_dict({"text": passages}), tokenizer, max_seq_length=16)
    assert from_list["input_ids"] == from_dataset["input_ids"]


@pytest.mark.parametrize("corpus", ["one passage", [1, 2], {"text": ["a"]}], ids=["str", "ints", "dict"])
def test_tokenize_corpus_refuses_other_inputs_naming_the_accepted_types(tokenizer, corpus):
    with pytest.raises(TypeError, match=r"^tokenize_corpus takes a datasets.Dataset, datasets.IterableDataset or a list "
                                        r"of strings .*, got "):
        tokenize_corpus(corpus, tokenizer, max_seq_length=16)


def test_num_proc_only_for_large_datasets():
    assert map_processes(10_000, NUM_PROC_MIN_ROWS, 4) is None
    assert map_processes(10_001, NUM_PROC_MIN_ROWS, 3) == 3
    assert map_processes(50_000, NUM_PROC_MIN_ROWS, 1) is None
    cpus = os.cpu_count() or 1
    assert map_processes(50_000, NUM_PROC_MIN_ROWS, None) == (min(4, cpus) if cpus > 1 else None)


# ---------------------------------------------------------------------------------------------------------------------
# Collator
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def features(tokenizer) -> list[dict]:
    """32 real rows of different lengths (truncated at 16..512 tokens)."""
    tokenized = tokenize_corpus(builtin_corpus().select(range(400, 432)), tokenizer, max_seq_length=512)
    rows = [dict(row) for row in tokenized]
    for i, row in enumerate(rows):
        cut = 16 + (i * 37) % 200
        if len(row["input_ids"]) > cut:
            row["input_ids"] = row["input_ids"][: cut - 1] + [tokenizer.sep_token_id]
            row["word_starts"] = row["word_starts"][: cut - 1] + [1]
    return rows


def ordinary_mask(tokenizer, batch_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return attention_mask.bool() & ~torch.isin(batch_ids, torch.tensor(tokenizer.all_special_ids))


def original_ids(batch: dict) -> torch.Tensor:
    return torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["input_ids"])


def n_mask_expected(n_ordinary: int, ratio: float) -> int:
    return max(1, round(ratio * n_ordinary)) if n_ordinary else 0


@pytest.mark.parametrize("whole_word_mask", [True, False])
@pytest.mark.parametrize("mask_ratio", [0.15, 0.3, 0.5])
def test_exact_mask_count_per_row(tokenizer, features, whole_word_mask, mask_ratio):
    collator = PretrainingCollator(tokenizer, mask_ratio=mask_ratio, whole_word_mask=whole_word_mask)
    assert len({len(f["input_ids"]) for f in features}) > 10  # rows of many lengths
    for seed in range(3):
        torch.manual_seed(seed)
        batch = collator(features)
        counts = (batch["encoder_labels"] != -100).sum(dim=1).tolist()
        expected = [n_mask_expected(len(f["input_ids"]) - 2, mask_ratio) for f in features]
        assert counts == expected


@pytest.mark.parametrize("mask_ratio", [0.15, 0.3, 0.7])
def test_mask_count_rounds_like_python(tokenizer, mask_ratio):
    # Single-token words, 1..200 ordinary tokens: float32 arithmetic would differ from round() at some .5 ties.
    rows = [{"input_ids": [101] + [2000] * n + [102]} for n in range(1, 201)]
    torch.manual_seed(0)
    counts = (PretrainingCollator(tokenizer, mask_ratio=mask_ratio)(rows)["encoder_labels"] != -100).sum(dim=1)
    assert counts.tolist() == [max(1, round(mask_ratio * n)) for n in range(1, 201)]



def test_mask_counts_follow_a_longer_batch(tokenizer):
    """The per-length count table is built for the first batch's length: a longer batch later still gets round()."""
    collator = PretrainingCollator(tokenizer, mask_ratio=0.3, pad_to_multiple_of=None)
    collator([{"input_ids": [101, 2000, 2000, 102]}])
    rows = [{"input_ids": [101] + [2000] * n + [102]} for n in (5, 40, 300)]
    counts = (collator(rows)["encoder_labels"] != -100).sum(dim=1)
    assert counts.tolist() == [round(0.3 * n) for n in (5, 40, 300)]


def test_pad_takes_lists_arrays_and_tensors_alike(tokenizer, features):
    """A `datasets` row holds lists, its numpy format int32 or int64 arrays, its torch format tensors."""
    as_lists = PretrainingCollator(tokenizer).pad(features)
    for convert in (lambda v: np.asarray(v, dtype=np.int32), np.asarray, torch.tensor):
        rows = [{key: convert(value) for key, value in f.items() if key in ("input_ids", "word_starts")}
                for f in features]
        padded = PretrainingCollator(tokenizer).pad(rows)
        assert all(torch.equal(padded[key], as_lists[key]) and padded[key].dtype == torch.long for key in as_lists)

def test_specials_and_padding_never_masked(tokenizer, features):
    torch.manual_seed(0)
    batch = PretrainingCollator(tokenizer)(features)
    original = original_ids(batch)
    padded = torch.full_like(original, tokenizer.pad_token_id)
    for i, f in enumerate(features):
        padded[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
    assert torch.equal(original, padded)  # the labels restore the input exactly
    outside = ~ordinary_mask(tokenizer, padded, batch["attention_mask"])
    assert (batch["encoder_labels"][outside] == -100).all()
    assert torch.equal(batch["input_ids"][outside], padded[outside])
    assert torch.equal(batch["attention_mask"].sum(dim=1), torch.tensor([len(f["input_ids"]) for f in features]))


def test_padding_to_a_multiple_of_8_stops_at_max_length(tokenizer):
    """L = 11 (a position limit, not a multiple of 8): a row of 10 tokens pads to 11, not 16; where the multiple fits
    (max_length 16) the batch is the uncapped one, bit for bit."""
    rows = [{"input_ids": [tokenizer.cls_token_id, *range(2000, 2008), tokenizer.sep_token_id]}]
    assert PretrainingCollator(tokenizer, max_length=11).pad(rows)["input_ids"].shape == (1, 11)
    capped, uncapped = (PretrainingCollator(tokenizer, max_length=length, generator=torch.Generator().manual_seed(0))
                        for length in (16, None))
    assert all(torch.equal(a, b) for a, b in zip(capped(rows).values(), uncapped(rows).values(), strict=True))


def test_whole_words_masked_together(tokenizer, features):
    collator = PretrainingCollator(tokenizer, mask_ratio=0.4)
    n_multi_piece = 0
    for seed in range(5):
        torch.manual_seed(seed)
        masked = collator(features)["encoder_labels"] != -100
        for i, f in enumerate(features):
            word_first = [j for j, start in enumerate(f["word_starts"]) if start] + [len(f["input_ids"])]
            for begin, end in zip(word_first[:-1], word_first[1:], strict=True):
                pieces = masked[i, begin:end]
                assert pieces.all() or not pieces.any(), (i, begin, end)
                n_multi_piece += int(end - begin > 1 and bool(pieces.all()))
    assert n_multi_piece > 50  # multi-piece words were actually chosen


def test_only_multi_piece_words_never_exceed_budget(tokenizer):
    # 5 two-piece words and no single-token word: n_mask = round(0.3 * 10) = 3 cannot be hit with whole words.
    ids = [tokenizer.cls_token_id] + [2000, 2001] * 5 + [tokenizer.sep_token_id]
    starts = [1] + [1, 0] * 5 + [1]
    torch.manual_seed(0)
    batch = PretrainingCollator(tokenizer)([{"input_ids": ids, "word_starts": starts}] * 64)
    counts = (batch["encoder_labels"] != -100).sum(dim=1)
    assert (counts == 2).all()  # one whole word; the documented shortfall, never more than n_mask


def test_decoder_labels(tokenizer, features):
    torch.manual_seed(0)
    batch = PretrainingCollator(tokenizer)(features)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        expected = torch.full((batch["input_ids"].shape[1],), -100)
        expected[1 : n - 1] = torch.tensor(f["input_ids"][1:-1])  # all but [CLS] ... [SEP] and padding
        assert torch.equal(batch["decoder_labels"][i], expected)


def test_80_10_10_proportions(tokenizer, features):
    torch.manual_seed(0)
    collator = PretrainingCollator(tokenizer, mask_ratio=0.5)
    batch = collator(features * 12)  # ~10k masked positions: standard error of a 10% share ~0.3%
    masked = batch["encoder_labels"] != -100
    new, old = batch["input_ids"][masked], batch["encoder_labels"][masked]
    share_mask = (new == tokenizer.mask_token_id).float().mean().item()
    share_kept = (new == old).float().mean().item()
    share_random = 1 - share_mask - share_kept
    assert masked.sum() > 8000
    assert abs(share_mask - 0.8) < 0.02 and abs(share_kept - 0.1) < 0.015 and abs(share_random - 0.1) < 0.015
    random_ids = new[(new != tokenizer.mask_token_id) & (new != old)]
    assert not torch.isin(random_ids, torch.tensor(tokenizer.all_special_ids)).any()
    assert random_ids.min() >= 0 and random_ids.max() < len(tokenizer)
    assert random_ids.unique().numel() > 0.8 * random_ids.numel()  # spread over the vocabulary


class TinyTokenizer:
    """A 10-id vocabulary whose ids 0-4 are special: random replacements must come from 5-9."""

    pad_token_id, mask_token_id, all_special_ids = 0, 4, [0, 1, 2, 3, 4]

    def __len__(self) -> int:
        return 10


def test_random_replacement_never_special():
    torch.manual_seed(0)
    collator = PretrainingCollator(TinyTokenizer(), mask_ratio=0.5, replace_with_mask=0.0, replace_with_random=1.0)
    batch = collator([{"input_ids": [1] + [5, 6, 7, 8, 9] * 20 + [2]}] * 50)
    masked = batch["encoder_labels"] != -100
    replaced = batch["input_ids"][masked]
    assert masked.sum() == 50 * 50  # round(0.5 * 100) per row
    assert set(replaced.unique().tolist()) == {5, 6, 7, 8, 9}


def test_shapes_and_dtypes_padded_to_multiple_of_8(tokenizer, features):
    batch = PretrainingCollator(tokenizer)(features)
    longest = max(len(f["input_ids"]) for f in features)
    B, L = batch["input_ids"].shape
    assert len(features) == B and L % 8 == 0 and longest <= L < longest + 8
    for key in ("input_ids", "attention_mask", "encoder_labels", "decoder_labels"):
        assert batch[key].shape == (B, L) and batch[key].dtype == torch.long
    unpadded = PretrainingCollator(tokenizer, pad_to_multiple_of=None)([{"input_ids": [101, 7592, 2088, 999, 102]}])
    assert unpadded["input_ids"].shape == (1, 5)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("mask_ratio", 0.0, r"mask_ratio=0.0 .*\(0, 1\)"),
        ("mask_ratio", 1.0, r"mask_ratio=1.0 .*\(0, 1\)"),
        ("mask_ratio", -0.2, "mask_ratio"),
        ("replace_with_mask", 1.2, r"replace_with_mask=1.2 .*\[0, 1\]"),
        ("replace_with_random", -0.1, "replace_with_random"),
        ("replace_with_random", 0.3, "exceeds 1"),  # 0.8 + 0.3
        ("pad_to_multiple_of", 0, "pad_to_multiple_of"),
    ],
)
def test_invalid_settings_raise(tokenizer, field, value, match):
    with pytest.raises(ValueError, match=match):
        PretrainingCollator(tokenizer, **{field: value})


def test_batch_of_one_tensor_ids_no_word_starts_extra_keys(tokenizer):
    ids = tokenizer("a short passage of text")["input_ids"]
    feature = {"input_ids": torch.tensor(ids), "id": "doc-7", "text": "ignored"}
    torch.manual_seed(0)
    batch = PretrainingCollator(tokenizer)([feature])
    assert set(batch) == {"input_ids", "attention_mask", "encoder_labels", "decoder_labels"}
    assert batch["input_ids"].shape == (1, 8)
    assert (batch["encoder_labels"] != -100).sum() == n_mask_expected(len(ids) - 2, 0.3)  # round(0.3 * 5) = 2


def test_row_without_ordinary_tokens(tokenizer):
    rows = [{"input_ids": [101, 102]}, {"input_ids": [101, 7592, 102]}]
    batch = PretrainingCollator(tokenizer)(rows)
    assert (batch["encoder_labels"] != -100).sum(dim=1).tolist() == [0, 1]  # nothing to mask; max(1, round(0.3))


def test_pad_then_mask_batch_equals_a_call(tokenizer, features):
    """The Trainer runs `pad` in DataLoader workers and `mask_batch` in the training process: together they are
    exactly `collator(features)`, and `pad` draws nothing."""
    collator = PretrainingCollator(tokenizer, generator=torch.Generator().manual_seed(3))
    whole = collator(features)
    global_state = torch.random.get_rng_state()
    padded = collator.pad(features)
    assert torch.equal(torch.random.get_rng_state(), global_state), "pad is deterministic"
    assert set(padded) == {"input_ids", "attention_mask", "word_starts"}
    assert torch.equal(padded["input_ids"], original_ids(whole)), "pad leaves the ids uncorrupted"
    split = collator.mask_batch(padded, torch.Generator().manual_seed(3))
    assert all(torch.equal(whole[key], split[key]) for key in whole)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mask_batch_on_gpu_draws_the_cpu_masks(tokenizer, features):
    collator = PretrainingCollator(tokenizer)
    padded = collator.pad(features)
    on_gpu = collator.mask_batch({k: v.cuda() for k, v in padded.items()}, torch.Generator().manual_seed(3))
    on_cpu = collator.mask_batch(padded, torch.Generator().manual_seed(3))
    assert all(on_gpu[key].is_cuda and torch.equal(on_gpu[key].cpu(), on_cpu[key]) for key in on_cpu)


def test_global_rng_makes_masking_reproducible(tokenizer, features):
    collator = PretrainingCollator(tokenizer)
    torch.manual_seed(123)
    first = collator(features)
    torch.manual_seed(123)
    second = collator(features)
    third = collator(features)
    assert all(torch.equal(first[key], second[key]) for key in first)
    assert not torch.equal(first["encoder_labels"], third["encoder_labels"])


# ---------------------------------------------------------------------------------------------------------------------
# Built-in and real corpora
# ---------------------------------------------------------------------------------------------------------------------


def test_builtin_corpus():
    corpus = builtin_corpus()
    passages = texts_of(corpus)
    assert corpus.column_names == ["text"]
    assert len(passages) >= 1500
    assert all(isinstance(p, str) and len(p) >= 150 and p == " ".join(p.split()) for p in passages)
    assert len(set(passages)) == len(passages)
    assert sum(">>>" in p for p in passages) == 0


def test_scifact_corpus(shared_data, tokenizer):
    corpus = read_corpus(shared_data / "scifact" / "corpus.jsonl")
    assert len(corpus) == 5183
    first = json.loads((shared_data / "scifact" / "corpus.jsonl").open(encoding="utf-8").readline())
    assert corpus[0]["text"] == " ".join(f"{first['title']} {first['text']}".split())
    assert len(read_corpus(shared_data / "scifact")) == 5183  # the BEIR folder


def test_enwiki_blocks(shared_data):
    corpus = read_corpus(shared_data / "enwiki-sample" / "valid.txt")  # auto-detected blocks, one per article
    assert len(corpus) == 429
    assert corpus[0]["text"].startswith("2018–19 Celtic F.C. season The 2018–19 season")
