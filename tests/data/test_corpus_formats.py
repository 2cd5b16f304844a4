"""Tests for the corpus formats of retromae.trainers.data.reading: Hub datasets with a configuration, split, revision
and text column (``datasets.load_dataset`` monkeypatched: no Hub here), Parquet and compressed files, a text column
other than ``text``, and the fast path through ``datasets``' builders (the same passages as our line reader, and its
file:line errors where a builder fails)."""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import os
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import retromae.trainers.data.arrow_reading as arrow_reading
import retromae.trainers.data.reading as reading_module
import zstandard
from retromae.trainers.data.passages import numbered_passages
from retromae.trainers.data.reading import read_corpus

from ..builders import jsonl_text, texts_of, write_file

pytestmark = pytest.mark.usefixtures("datasets_cache")


def line_reader(path: Path, text_format: str = "auto", text_column: str = "text") -> list[str]:
    """The passages of our own line-by-line reader (the reference the builders must match)."""
    return [text for _, text in numbered_passages(path, text_format, text_column)]


class FakeHub:
    """Stands in for ``datasets.load_dataset`` on Hub names; records the call."""

    def __init__(self, result=None, error: Exception | None = None):
        self.result, self.error, self.calls = result, error, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.error is not None:
            raise self.error
        return self.result


# ---------------------------------------------------------------------------------------------------------------------
# Hub datasets
# ---------------------------------------------------------------------------------------------------------------------

def test_hub_dataset_with_config_split_revision_and_column(monkeypatch):
    hub = FakeHub(datasets.Dataset.from_dict({"id": [1, 2], "body": ["first  passage", "second"]}))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    corpus = read_corpus("owner/papers", config="abstracts", split="validation", revision="v1.0", text_column="body")
    assert hub.calls == [(("owner/papers", "abstracts"), {"split": "validation", "revision": "v1.0",
                                                           "streaming": False})]
    assert corpus.column_names == ["text"]
    assert texts_of(corpus) == ["first  passage", "second"]  # a Hub dataset's text is used as it is
    assert corpus.info.dataset_name == "owner/papers"


def test_hub_dataset_defaults(monkeypatch):
    hub = FakeHub(datasets.Dataset.from_dict({"text": ["a"], "title": ["T"]}))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    assert texts_of(read_corpus("owner/name", streaming=True)) == ["a"]
    assert hub.calls == [(("owner/name", None), {"split": "train", "revision": None, "streaming": True})]


def test_hub_dataset_that_needs_a_configuration(monkeypatch):
    error = ValueError("Config name is missing.\nPlease pick one among the available configs: ['en', 'fr']\n"
                       "Example of usage:\n\t`load_dataset('owner/wiki', 'en')`")
    monkeypatch.setattr(datasets, "load_dataset", FakeHub(error=error))
    with pytest.raises(ValueError, match=r"corpus 'owner/wiki' has several configurations: \['en', 'fr'\]; pick one "
                                        r"with --corpus-config") as info:
        read_corpus("owner/wiki")
    assert "\n" not in str(info.value)


def test_hub_dataset_without_the_split(monkeypatch):
    error = ValueError("Unknown split \"train\". Should be one of ['test'].")
    monkeypatch.setattr(datasets, "load_dataset", FakeHub(error=error))
    with pytest.raises(ValueError, match=r"'owner/name' has no split 'train' \(splits: \['test'\]\); pick one with "
                                        r"--corpus-split"):
        read_corpus("owner/name")


def test_hub_failure_is_one_line(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", FakeHub(error=ConnectionError("offline\nsecond line")))
    with pytest.raises(ValueError, match=r"not found locally .* \(ConnectionError: offline second line\)") as info:
        read_corpus("owner/name", revision="main")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("column", ["text", "abstract"])
def test_hub_dataset_without_the_text_column_lists_the_columns(monkeypatch, column):
    hub = FakeHub(datasets.Dataset.from_dict({"title": ["t"], "body": ["b"]}))
    monkeypatch.setattr(datasets, "load_dataset", hub)
    with pytest.raises(ValueError, match=rf"dataset 'owner/name' has no '{column}' column \(columns: \['title', "
                                        r"'body'\]\); .*--text-column") as info:
        read_corpus("owner/name", text_column=column)
    assert "\n" not in str(info.value)


def test_hub_options_are_refused_for_a_local_file(tmp_path):
    path = write_file(tmp_path / "c.txt", "a\n")
    with pytest.raises(ValueError, match="--corpus-config and --corpus-revision apply to a Hub dataset"):
        read_corpus(path, config="en", revision="main")
    with pytest.raises(ValueError, match=r"--corpus-split applies to a Hub dataset \(--corpus-split also a saved "
                                         r"DatasetDict\), not to corpus .*c.txt', a local file"):
        read_corpus(path, split="test")
    with pytest.raises(ValueError, match=r"--corpus-config applies to a Hub dataset, not to the built-in corpus"):
        read_corpus(None, config="en")


# ---------------------------------------------------------------------------------------------------------------------
# Saved datasets, Parquet, compressed files, other text columns
# ---------------------------------------------------------------------------------------------------------------------

def test_saved_dataset_dict_split_and_column(tmp_path):
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"body": ["train passage"]}),
        "dev": datasets.Dataset.from_dict({"body": ["dev passage"]}),
    }).save_to_disk(str(tmp_path / "ds"))
    assert texts_of(read_corpus(tmp_path / "ds", text_column="body")) == ["train passage"]
    assert texts_of(read_corpus(tmp_path / "ds", text_column="body", split="dev")) == ["dev passage"]
    with pytest.raises(ValueError, match=r"has no split 'test' \(splits: \['dev', 'train'\]\)"):
        read_corpus(tmp_path / "ds", text_column="body", split="test")
    with pytest.raises(ValueError, match=r"has no 'text' column \(columns: \['body'\]\)"):
        read_corpus(tmp_path / "ds")


def write_parquet(path: Path, columns: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize("streaming", [False, True])
def test_parquet_file_with_title(tmp_path, streaming):
    path = write_parquet(tmp_path / "c.parquet", {"_id": ["1", "2", "3"], "title": ["Title", None, " "],
                                                  "text": ["body  one", "body two", "  "]})
    assert texts_of(read_corpus(path, streaming=streaming)) == ["Title body one", "body two"]


def test_parquet_other_column_and_its_errors(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"abstract": ["one", "two"], "n": [1, 2]})
    assert texts_of(read_corpus(path, text_column="abstract")) == ["one", "two"]
    with pytest.raises(ValueError, match=r"has no 'text' column \(columns: \['abstract', 'n'\]\)"):
        read_corpus(path)
    with pytest.raises(ValueError, match="the 'n' column holds .*, not strings"):
        read_corpus(path, text_column="n")
    nulls = write_parquet(tmp_path / "nulls.parquet", {"text": ["one", None]})
    with pytest.raises(ValueError, match=r"nulls\.parquet: 1 row\(s\) have no text \(null\) in column 'text'"):
        read_corpus(nulls)


COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


@pytest.mark.parametrize("suffix", sorted(COMPRESSORS))
def test_compressed_files_read_as_the_file_they_hold(tmp_path, suffix):
    records = jsonl_text({"title": "T", "text": "one"}, {"text": "two"})
    jsonl_path = write_file(tmp_path / f"c.jsonl{suffix}", COMPRESSORS[suffix](records.encode()))
    assert texts_of(read_corpus(jsonl_path)) == ["T one", "two"]
    blocks = "first block\nline\n\nsecond\n"
    txt_path = write_file(tmp_path / f"c.txt{suffix}", COMPRESSORS[suffix](blocks.encode()))
    assert texts_of(read_corpus(txt_path)) == ["first block line", "second"]  # auto: blocks, read through the file
    assert texts_of(read_corpus(txt_path, streaming=True)) == ["first block line", "second"]


def test_bad_line_in_a_compressed_file_is_named(tmp_path):
    path = write_file(tmp_path / "c.jsonl.gz", gzip.compress(b'{"text": "fine"}\n{not json}\n'))
    with pytest.raises(ValueError, match=r"c\.jsonl\.gz:2: not valid JSON"):
        read_corpus(path)
    latin = write_file(tmp_path / "l.txt.gz", gzip.compress(b"fine\ncaf\xe9\n"))
    with pytest.raises(ValueError, match=r"l\.txt\.gz:2: bytes that are not valid UTF-8"):
        read_corpus(latin)


def zstd_frames(content: bytes) -> bytes:
    """`content` in two zstd frames (as `zstd` of concatenated files or multi-threaded `zstd -T` writes)."""
    half = len(content) // 2
    return b"".join(zstandard.ZstdCompressor().compress(part) for part in (content[:half], content[half:]))


ZSTD_CORPORA = {
    "jsonl": jsonl_text({"title": "T", "text": " one  a"}, {"text": "two"}, {"text": " "}, {"text": "3"}, {"text": "4"}),
    "txt": "first block\nline\n\nsecond\n \nthird\n\n\nfourth\n\nfifth",
}


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("fmt", sorted(ZSTD_CORPORA))
def test_zstandard_files_read_as_the_file_they_hold(tmp_path, fmt, streaming):
    plain = write_file(tmp_path / f"plain.{fmt}", ZSTD_CORPORA[fmt])
    packed = write_file(tmp_path / f"c.{fmt}.zst", zstd_frames(ZSTD_CORPORA[fmt].encode()))
    expected = texts_of(read_corpus(plain))
    assert len(expected) == 4
    assert texts_of(read_corpus(packed, streaming=streaming)) == expected
    assert line_reader(packed) == expected


def test_bad_line_in_a_zstandard_file_is_named(tmp_path):
    path = write_file(tmp_path / "c.jsonl.zst", zstd_frames(b'{"text": "fine"}\n{not json}\n'))
    with pytest.raises(ValueError, match=r"c\.jsonl\.zst:2: not valid JSON"):
        read_corpus(path)


@pytest.mark.parametrize("streaming", [False, True])
def test_zstandard_file_without_the_package_names_the_install(tmp_path, monkeypatch, streaming):
    path = write_file(tmp_path / "c.jsonl.zst", zstd_frames(b'{"text": "one"}\n'))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # `import zstandard` raises ImportError
    with pytest.raises(ValueError, match="the zstandard package is not installed; pip install zstandard") as error:
        read_corpus(path, streaming=streaming)
    assert "\n" not in str(error.value)


def test_folder_of_mixed_formats_keeps_path_order(tmp_path):
    write_file(tmp_path / "a.jsonl.gz", gzip.compress(jsonl_text({"text": "a1"}, {"text": "a2"}).encode()))
    write_parquet(tmp_path / "b.parquet", {"text": ["b1"]})
    write_file(tmp_path / "c.txt", "c1\nc2\n")
    write_file(tmp_path / "d.jsonl", jsonl_text({"text": "d1"}))
    assert texts_of(read_corpus(tmp_path)) == ["a1", "a2", "b1", "c1", "c2", "d1"]
    assert texts_of(read_corpus(tmp_path, streaming=True)) == ["a1", "a2", "b1", "c1", "c2", "d1"]


def test_compressed_parquet_is_refused_in_a_folder(tmp_path):
    write_file(tmp_path / "a.txt", "a\n")
    write_file(tmp_path / "b.parquet.gz", b"x")
    with pytest.raises(ValueError, match=r"not a corpus format: b\.parquet\.gz"):
        read_corpus(tmp_path)


@pytest.mark.parametrize("streaming", [False, True])
def test_jsonl_text_column(tmp_path, streaming):
    path = write_file(tmp_path / "c.jsonl", jsonl_text({"title": "T", "body": "one"}, {"body": "two", "text": "ignored"}))
    assert texts_of(read_corpus(path, text_column="body", streaming=streaming)) == ["T one", "two"]


def test_jsonl_missing_text_column_names_the_line(tmp_path):
    path = write_file(tmp_path / "c.jsonl", jsonl_text({"body": "one"}, {"text": "two"}))
    with pytest.raises(ValueError, match=r"c\.jsonl:2: no \"body\" field \(keys: \['text'\]\); give every line a "
                                        r"string \"body\" field"):
        read_corpus(path, text_column="body")


# ---------------------------------------------------------------------------------------------------------------------
# The builders' fast path: the same passages as our reader, and its errors
# ---------------------------------------------------------------------------------------------------------------------

class BuilderSpy:
    """Records the ``datasets`` packaged builders (json, text, parquet) that read the corpus."""

    def __init__(self, monkeypatch):
        self.builders: list[str] = []
        real = datasets.DatasetBuilder.download_and_prepare

        def spy(builder, *args, **kwargs):
            if isinstance(builder, arrow_reading.FormsPassages):
                self.builders.append(builder.packaged)
            return real(builder, *args, **kwargs)

        monkeypatch.setattr(datasets.DatasetBuilder, "download_and_prepare", spy)


def test_well_formed_files_go_through_the_builders(tmp_path, monkeypatch):
    spy = BuilderSpy(monkeypatch)
    monkeypatch.setattr(reading_module, "_generate_passages", None)  # our reader is not used
    write_file(tmp_path / "a.jsonl", jsonl_text({"text": "a"}))
    write_file(tmp_path / "b.txt", "b\n")
    write_parquet(tmp_path / "c.parquet", {"text": ["c"]})
    assert texts_of(read_corpus(tmp_path)) == ["a", "b", "c"]
    assert spy.builders == ["json", "text", "parquet"]


def test_files_with_different_fields_are_read_in_one_builder_call(tmp_path, monkeypatch):
    """Each table is formed into passages on its own, so other fields that differ between files do not matter
    (before: the builder failed on the second file's fields, and each file was read again in a call of its own)."""
    spy = BuilderSpy(monkeypatch)
    monkeypatch.setattr(reading_module, "_generate_passages", None)  # our reader is not used
    write_file(tmp_path / "a.jsonl", jsonl_text({"text": "a", "n": 1}))
    write_file(tmp_path / "b.jsonl", jsonl_text({"text": "b", "tags": ["x"]}))
    assert texts_of(read_corpus(tmp_path)) == ["a", "b"]
    assert spy.builders == ["json"]


TRICKY_TEXTS = {
    "bom_crlf": b"\xef\xbb\xbf  first   line \r\n\r\nsecond\tline\r\n \r\n\r\n\r\nthird\r\n",
    "space_lines": b"a\n   \nb\n\n\n\n\t\nc\n\nd",
    "lone_cr": b"one\rtwo\n\nthree\r\n\rfour\n",
    "no_final_newline": b"x y\n\nz",
    "unicode_space": "a\u00a0b\u2003c\n\u3000\n\nd\u2028e\n".encode(),
    "only_blank": b"\n \n\t\n",
}


@pytest.mark.parametrize("text_format", ["lines", "blocks"])
@pytest.mark.parametrize("name", sorted(TRICKY_TEXTS))
def test_txt_passages_equal_the_line_reader(tmp_path, name, text_format):
    path = write_file(tmp_path / "c.txt", TRICKY_TEXTS[name])
    expected = line_reader(path, text_format)
    if not expected:
        with pytest.raises(ValueError, match="the corpus is empty"):
            read_corpus(path, text_format=text_format)
    else:
        assert texts_of(read_corpus(path, text_format=text_format)) == expected


TRICKY_JSONL = {
    "blank_lines": '\n{"text": " a  b "}\n   \n\n{"text": "c", "title": "T"}\n',
    "bom": '\ufeff{"text": "a"}\n{"text": "b"}\n',
    # a title of another type is refused (test_pretrain_refusals.py); a null one is no title
    "titles_null": '{"text": "a", "title": null}\n{"text": "b", "title": null}\n',
    "titles_null_and_strings": '{"text": "a", "title": null}\n{"text": "b", "title": "T"}\n',
    "blank_title": '{"text": "a", "title": "  "}\n{"text": "  "}\n{"text": "b"}\n',
    "other_fields_mixed": '{"text": "a", "x": 1}\n{"text": "b", "x": "s"}\n{"text": "c", "x": [1]}\n',
}


@pytest.mark.parametrize("name", sorted(TRICKY_JSONL))
def test_jsonl_passages_equal_the_line_reader(tmp_path, name):
    path = write_file(tmp_path / "c.jsonl", TRICKY_JSONL[name])
    assert texts_of(read_corpus(path)) == line_reader(path)


@pytest.mark.parametrize(("content", "message"), [
    ('{"text": "a"} {"text": "b"}\n', r"c\.jsonl:1: not valid JSON"),  # two objects on a line
    ('[{"text": "a"}]\n', r"c\.jsonl:1: expected a JSON object, found a JSON array"),  # the builder reads arrays
    ('{"text": "a"}\n{"body": "b"}\n', r"c\.jsonl:2: no \"text\" field"),
    ('{"text": "a"}\n{"text": ["b"]}\n', r"c\.jsonl:2: the \"text\" field must be a string"),
])
def test_what_the_json_builder_would_accept_is_refused_as_before(tmp_path, content, message):
    with pytest.raises(ValueError, match=message):
        read_corpus(write_file(tmp_path / "c.jsonl", content))


def test_latin1_title_is_named_although_the_json_builder_reads_it(tmp_path):
    path = write_file(tmp_path / "c.jsonl", b'{"text": "a"}\n{"text": "b", "title": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not UTF-8 text"):
        read_corpus(path)


def test_utf16_without_a_bom_is_still_refused(tmp_path):
    path = write_file(tmp_path / "c.txt", "plain ascii text\n".encode("utf-16-le"))
    with pytest.raises(ValueError, match="UTF-16LE text, not UTF-8"):
        read_corpus(path)


@pytest.mark.parametrize(("name", "compress", "kind", "suffix"), [
    ("c.txt", gzip.compress, "gzip", ".gz"), ("c.jsonl", bz2.compress, "bzip2", ".bz2"),
    ("c.txt", lzma.compress, "xz", ".xz"),
])
def test_compressed_data_under_a_plain_name_names_the_suffix(tmp_path, name, compress, kind, suffix):
    """HEAD called it "bytes that are not valid UTF-8" and suggested iconv -f latin1."""
    path = write_file(tmp_path / name, compress(b'{"text": "a"}\n' * 3))
    with pytest.raises(ValueError, match=rf"{name}: {kind}-compressed data, not text; name the file {name}{suffix} "):
        read_corpus(path)


def test_edited_jsonl_is_not_served_from_the_builders_cache(tmp_path):
    import os

    path = write_file(tmp_path / "c.jsonl", jsonl_text({"text": "old"}))
    assert texts_of(read_corpus(path)) == ["old"]
    write_file(path, jsonl_text({"text": "new"}))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert texts_of(read_corpus(path)) == ["new"]


def test_real_corpora_equal_the_line_reader(shared_data):
    for path in (shared_data / "scifact" / "corpus.jsonl", shared_data / "enwiki-sample" / "valid.txt"):
        assert texts_of(read_corpus(path)) == line_reader(path)
    assert texts_of(read_corpus(shared_data / "enwiki-sample" / "valid.txt", text_format="lines")) == line_reader(
        shared_data / "enwiki-sample" / "valid.txt", "lines")


def test_arrow_whitespace_collapse_is_pythons_split_join():
    import sys

    python_whitespace = "".join(chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace())
    assert python_whitespace == arrow_reading.PYTHON_WHITESPACE
    samples = [f"{w}a{w}{w}b {w}c{w}" for w in arrow_reading.PYTHON_WHITESPACE] + [
        "", " ", "x\u200by", "a" + arrow_reading.PYTHON_WHITESPACE + "b", "é  ü\t"]
    collapsed = arrow_reading.collapse_whitespace(pa.array(samples)).to_pylist()
    assert collapsed == [" ".join(sample.split()) for sample in samples]


def test_arrow_whitespace_collapse_replaces_only_the_strings_it_changes():
    """Most strings need no change and are kept as they are; the others are collapsed in place (order kept)."""
    samples = ["plain text", " lead", "trail ", "two  spaces", None, "a\u00a0b", "", "x\u2010y", "ok", "\u3000", "é ü"]
    expected = [None if text is None else " ".join(text.split()) for text in samples]
    assert arrow_reading.collapse_whitespace(pa.array(samples)).to_pylist() == expected
    chunked = pa.chunked_array([samples[:4], samples[4:8], [], samples[8:]], type=pa.string())
    collapsed = arrow_reading.collapse_whitespace(chunked)
    assert collapsed.num_chunks == 4 and collapsed.to_pylist() == expected
    unchanged = pa.array(["a b", "c"])
    assert arrow_reading.collapse_whitespace(unchanged) is unchanged  # nothing to replace: no copy


def test_blank_and_empty_files_beside_passages(tmp_path):
    write_file(tmp_path / "a.jsonl", "\n  \n")
    write_file(tmp_path / "b.txt", "x\n")
    write_file(tmp_path / "c.jsonl", "")
    write_file(tmp_path / "d.txt", "  \n")
    write_file(tmp_path / "e.jsonl", '{"text": " ", "x": 1}\n{"text": " ", "x": "s"}\n')  # the json builder fails
    write_file(tmp_path / "f.parquet.d/g.jsonl", jsonl_text({"text": "y"}))
    write_file(tmp_path / "h.txt", "\u3000\r\u3000\n")  # read line by line (a lone \r), no passage: blank to Python
    assert texts_of(read_corpus(tmp_path)) == ["x", "y"]
    assert texts_of(read_corpus(tmp_path, streaming=True)) == ["x", "y"]


def test_the_builder_forms_the_passages_as_it_writes_one_copy(tmp_path, monkeypatch):
    """The builder writes the passages themselves, formed table by table, so the cache holds one copy of the corpus
    (before: the builder's copy of the raw rows, then a second written by a `map` forming the passages)."""
    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    rows = [{"title": f"t{i}", "text": f"passage  {i} ", "id": i} for i in range(300)]
    path = write_file(tmp_path / "c.jsonl", "".join(jsonl_text(row) for row in rows))
    corpus = read_corpus(path)
    assert texts_of(corpus) == line_reader(path) == [f"t{i} passage {i}" for i in range(300)]
    assert corpus.column_names == ["text"]
    written = sorted(file.name for file in cache.rglob("*.arrow"))
    assert len(written) == 1 and not written[0].startswith("cache-"), written


LINE_PIECES = [b'{"text": "a"}', b"", b"  ", b"\t", b"\r", b" x ", b"\x0b", b"\x0c"]


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 5, 64])
def test_content_lines_are_counted_across_blocks(tmp_path, monkeypatch, block_bytes):
    """The numpy count (lines split between blocks, blank lines of every whitespace byte ``bytes.strip`` removes,
    CRLF, no final newline) equals counting the stripped lines one by one."""
    import io
    import random

    monkeypatch.setattr(arrow_reading, "_CHUNK_BYTES", block_bytes)
    rng = random.Random(block_bytes)
    for case in range(40):
        lines = [b"".join(rng.choices(LINE_PIECES, k=rng.randint(0, 3))) for _ in range(rng.randint(0, 8))]
        content = b"\n".join(lines) + rng.choice([b"", b"\n", b"\r\n"])
        path = write_file(tmp_path / f"{case}.jsonl", content)
        assert arrow_reading.count_content_lines(str(path)) == sum(map(bool, map(bytes.strip, io.BytesIO(content))))


def test_a_cached_corpus_is_not_read_again_to_check_it(tmp_path, monkeypatch):
    """The whole-file checks (JSON objects per line, lone carriage returns) run while the builder reads the file,
    not on a read served from its cache (before: every line of a `.jsonl` file was counted on every read)."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    jsonl = write_file(tmp_path / "c.jsonl", "".join(jsonl_text({"text": f"p {i}"}) for i in range(50)))
    txt = write_file(tmp_path / "c.txt", "".join(f"q {i}\n" for i in range(50)))
    first = [texts_of(read_corpus(path)) for path in (jsonl, txt)]
    checked: list[str] = []
    for name in ("count_content_lines", "has_lone_carriage_return"):
        real = getattr(arrow_reading, name)
        monkeypatch.setattr(arrow_reading, name, lambda path, real=real, name=name: checked.append(name) or real(path))
    assert [texts_of(read_corpus(path)) for path in (jsonl, txt)] == first
    assert checked == []


def test_tables_formed_beside_the_builder_keep_their_order(tmp_path, monkeypatch):
    """Many tables, each formed in the second thread while the builder reads the next: the passages come out in
    file order, and a table the checks refuse half-way sends the file to the line reader, which names the line."""
    monkeypatch.setattr(arrow_reading, "PARQUET_BATCH_ROWS", 7)
    texts = [f" passage  {i}" for i in range(100)]
    path = tmp_path / "c.parquet"
    write_parquet(path, {"text": texts})
    assert texts_of(read_corpus(path)) == [" ".join(text.split()) for text in texts]
    rows = "".join(jsonl_text({"text": f"p{i}"}) for i in range(3000)) + '{"text": null}\n'
    with pytest.raises(ValueError, match=r"c\.jsonl:3001: .*text"):
        read_corpus(write_file(tmp_path / "c.jsonl", rows))


def truncated(content: bytes, compress) -> bytes:
    packed = compress(content)
    return packed[: len(packed) // 2]


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(("name", "compress"), [("c.jsonl.gz", gzip.compress), ("c.txt.bz2", bz2.compress),
                                                ("c.jsonl.xz", lzma.compress)])
def test_a_truncated_compressed_file_is_named_in_one_line(tmp_path, name, compress, streaming):
    """A download cut short fails part-way through the file: one line naming it (before: the decompressor's
    EOFError, or `datasets`' "An error occurred while generating the dataset")."""
    rows = "".join(jsonl_text({"text": f"passage {i} " * 8}) for i in range(3000))
    path = write_file(tmp_path / name, truncated(rows.encode(), compress))
    with pytest.raises(ValueError, match=rf"{name}: could not be read .*(EOFError|Error).*truncated or corrupt"):
        corpus = read_corpus(path, streaming=streaming, text_format="lines" if ".txt" in name else "auto")
        list(corpus)


@pytest.mark.parametrize(("content", "reason"), [(truncated(b"passage one\n" * 9000, gzip.compress),
                                                   "EOFError"), (b"plain text, not gzip\n", "BadGzipFile")])
def test_a_broken_gzip_text_file_fails_in_one_line_while_its_layout_is_sniffed(tmp_path, content, reason):
    """`text_format="auto"` reads a .txt file for blank lines before anything else (before: the gzip traceback)."""
    path = write_file(tmp_path / "c.txt.gz", content)
    with pytest.raises(ValueError, match=rf"c\.txt\.gz: could not be read \({reason}.*truncated or corrupt"):
        read_corpus(path)

@pytest.mark.parametrize("streaming", [False, True])
def test_a_corrupt_parquet_file_names_the_reason(tmp_path, streaming):
    """Half of the row groups cut out, the footer kept: pyarrow's reason is in the one line (before: `datasets`'
    "An error occurred while generating the dataset", or pyarrow's OSError when streaming)."""
    whole = write_parquet(tmp_path / "whole.parquet", {"text": [f"p {i} " * 20 for i in range(20000)]})
    content = whole.read_bytes()
    footer = 8 + int.from_bytes(content[-8:-4], "little")
    path = write_file(tmp_path / "c.parquet", content[: len(content) // 2] + content[-footer:])
    with pytest.raises(ValueError, match=r"c\.parquet: could not be read.*(corrupt|Invalid|invalid)"):
        list(read_corpus(path, streaming=streaming))


@pytest.mark.parametrize("streaming", [False, True])
def test_a_text_column_for_plain_text_files_is_refused(tmp_path, streaming):
    """HEAD: `--text-column body` on .txt files was accepted and ignored."""
    (tmp_path / "a.txt").write_text("first passage\nsecond passage\n")
    with pytest.raises(ValueError, match=r"--text-column body names a field of \.jsonl .*'.*a\.txt' holds plain "
                                         r"text .*drop --text-column"):
        read_corpus(tmp_path / "a.txt", text_column="body", streaming=streaming)
    (tmp_path / "b.jsonl").write_text('{"body": "third passage"}\n')  # a field of the .jsonl file: read
    assert len(list(read_corpus(tmp_path, text_column="body", streaming=streaming))) == 3


def test_a_bad_jsonl_line_is_one_error_without_the_builders_log(tmp_path, caplog):
    """HEAD: datasets' json builder logged "Failed to load JSON from file ..." at ERROR level before our reader named
    the line."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "a passage"}\n{bad\n{"text": "another"}\n')
    with caplog.at_level(logging.INFO), pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        read_corpus(path)
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert "Reading" in caplog.text and "line by line" in caplog.text  # the fallback did run


def test_an_edit_that_keeps_size_and_mtime_is_read_again(tmp_path):
    """HEAD keyed the cache by size and mtime only: a same-size edit copied with its mtime (`cp -p`) read the old text."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("apple banana cherry\ndog elephant fish\n")
    os.utime(corpus, ns=(1_577_836_800_000_000_000,) * 2)
    assert texts_of(read_corpus(str(corpus))) == ["apple banana cherry", "dog elephant fish"]
    corpus.write_text("grape horses cherry\ndog elephant bird\n")
    os.utime(corpus, ns=(1_577_836_800_000_000_000,) * 2)
    assert texts_of(read_corpus(str(corpus))) == ["grape horses cherry", "dog elephant bird"]
