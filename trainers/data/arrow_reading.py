"""Whole corpus files read by `datasets`' own builders (json, text, parquet) and formed into passages as our
line-by-line reader forms them; where the two could differ, `ReadLineByLine` sends the file back to that reader."""

from __future__ import annotations

import codecs
import os
import re

import datasets
import pyarrow as pa
import pyarrow.compute as pc

from .passages import ENCODING_PROBE_BYTES, CorpusError, open_binary


def select_text_column(
    dataset: datasets.Dataset | datasets.IterableDataset, where: str, column: str = "text"
) -> datasets.Dataset | datasets.IterableDataset:
    """Keeps only the ``column`` column, renamed ``"text"``, or raises ``CorpusError`` when there is none or it does
    not hold strings (a list of two strings would be tokenized as a sentence pair)."""
    columns = dataset.column_names
    if columns is None:  # a streaming dataset with unknown features: checked when iterating
        selected = dataset.select_columns([column])
        return selected.rename_column(column, "text") if column != "text" else selected
    if column not in columns:
        hint = ("rename the passage column to 'text', e.g. dataset.rename_column('<column>', 'text'), or name it "
                "with --text-column" if column == "text" else "name the passage column with --text-column")
        raise CorpusError(f"dataset {where!r} has no {column!r} column (columns: {columns}); {hint}")
    feature = dataset.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise CorpusError(
            f"dataset {where!r}: the {column!r} column holds {feature!r}, not strings; save one passage string per "
            f"row in {column!r} (e.g. join a list of sentences with a space), or name another with --text-column"
        )
    if columns != [column]:
        dataset = dataset.select_columns([column])
    return dataset.rename_column(column, "text") if column != "text" else dataset


PASSAGE_FEATURES = datasets.Features({"text": datasets.Value("string")})


class ReadLineByLine(Exception):
    """A builder's reading of a file cannot be trusted to match ours: read it line by line instead."""


def read_with_builder(sources: list[tuple[str, str, int, int]], column: str, code: str) -> datasets.Dataset:
    """Files of one format through ``load_dataset("json" | "text" | "parquet")``, then one batched ``map`` that
    forms the passages as our reader does (title joined, whitespace collapsed, blank ones dropped); `code` is the
    readers' fingerprint, which keys the cache.

    Raises ``ReadLineByLine`` where the builder's reading could differ from ours: a ``.jsonl`` line that is not
    one JSON object (a JSON array file, two objects on a line), a missing or non-string field, a ``.txt`` file with
    a carriage return that does not end a line (the builder would split lines there)."""
    fmt = sources[0][1]
    paths = [source[0] for source in sources]
    title = False
    if fmt == "jsonl":
        if any(first_text_byte(path) not in (b"{", b"") for path in paths):
            raise ReadLineByLine("a line that is not a JSON object")
        loaded = datasets.load_dataset("json", data_files=paths, split="train", on_mixed_types=None)
        columns = loaded.column_names
        if (column not in columns or not is_string_column(loaded, column) or loaded.data.column(column).null_count
                or len(loaded) != sum(count_content_lines(path) for path in paths)):
            raise ReadLineByLine(f"a line without a string {column!r}, or with more than one JSON object")
    elif fmt in ("lines", "blocks"):
        if any(has_lone_carriage_return(path) for path in paths):
            raise ReadLineByLine("a carriage return that does not end a line")
        loaded = datasets.load_dataset("text", data_files=paths, split="train", encoding="utf-8-sig",
                                       sample_by="line" if fmt == "lines" else "paragraph")
        column = "text"
    else:  # parquet
        loaded = datasets.load_dataset("parquet", data_files=paths, split="train")
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more .parquet files)"
        select_text_column(loaded, where, column)  # the one-line errors of a missing or non-string column
        nulls = loaded.data.column(column).null_count
        if nulls:
            raise CorpusError(f"{where}: {nulls} row(s) have no text (null) in column {column!r}; drop them or fill "
                            "them in")
    if fmt in ("jsonl", "parquet"):  # the text builder decodes UTF-8 itself
        # a title of another type is no title (our reader's rule); mixed JSON types fail in the builder
        title = "title" in loaded.column_names and column != "title" and is_string_column(loaded, "title")
        if not all(is_valid_utf8(loaded, name) for name in ([column, "title"] if title else [column])):
            raise ReadLineByLine(f"bytes that are not UTF-8 in column {column!r} or 'title'")
    return loaded.with_format("arrow").map(
        passages_batch, batched=True, batch_size=50_000, remove_columns=loaded.column_names,
        features=PASSAGE_FEATURES, desc="Forming passages", num_proc=map_processes(len(loaded), PARALLEL_MAP_MIN_ROWS),
        fn_kwargs={"column": column, "title": bool(title), "code": code},
    ).with_format(None)


def is_string_column(dataset: datasets.Dataset, column: str) -> bool:
    return getattr(dataset.features[column], "dtype", None) in ("string", "large_string")


def is_valid_utf8(dataset: datasets.Dataset, column: str) -> bool:
    """Whether a string column holds valid UTF-8: pyarrow's JSON reader does not check (a Latin-1 "é" passes), and
    forming the passages only looks into the strings it changes."""
    try:
        dataset.data.column(column).validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


# The characters Python's str.split() splits on (str.isspace), as an RE2 class: collapsing runs of them in Arrow
# gives " ".join(text.split()) without a Python loop.
PYTHON_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                     "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


_WHITESPACE_CLASS = "[" + "".join(f"\\x{{{ord(char):x}}}" for char in PYTHON_WHITESPACE) + "]"


# a run of two or more, or one other than a space: replacing every single space too is several times slower
_WHITESPACE_RUN = f"{_WHITESPACE_CLASS}{{2,}}|{_WHITESPACE_CLASS.replace(chr(92) + 'x{20}', '')}"


def collapse_whitespace(texts: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``" ".join(text.split())`` for every string of an Arrow array (nulls stay null)."""
    if isinstance(texts, pa.ChunkedArray):
        return pa.chunked_array([_collapse_array(chunk) for chunk in texts.chunks], type=texts.type)
    return _collapse_array(texts)


def _collapse_array(texts: pa.Array) -> pa.Array:
    """Only the strings that collapsing changes (a whitespace run or character other than a single space, or a space
    at either end) go through the replacement: finding them costs a fraction of replacing in every string, and in
    real text they are few (about 1% of Wikipedia's passages)."""
    changes = pc.or_(pc.match_substring_regex(texts, _WHITESPACE_RUN),
                     pc.or_(pc.starts_with(texts, " "), pc.ends_with(texts, " ")))
    changes = pc.fill_null(changes, False)
    if not pc.any(changes).as_py():
        return texts
    collapsed = pc.utf8_trim(pc.replace_substring_regex(pc.filter(texts, changes), _WHITESPACE_RUN, " "), " ")
    return pc.replace_with_mask(texts, changes, collapsed)


def passages_batch(batch: pa.Table, column: str, title: bool, code: str = "") -> pa.Table:
    """The passages of a batch of rows (an Arrow table): ``title + " " + text`` where a title is given, whitespace
    collapsed, blank ones dropped (``iter_jsonl_passages``'s rule). ``code`` is part of the cache fingerprint only."""
    batch = batch.combine_chunks()  # one array: the builders' 1,000-row chunks cost a compute call each per step
    texts = batch.column(column)
    if title:
        titles = batch.column("title")
        has_title = pc.fill_null(pc.greater(pc.utf8_length(collapse_whitespace(titles)), 0), False)
        texts = pc.if_else(has_title, pc.binary_join_element_wise(titles, texts, " "), texts)
    texts = collapse_whitespace(texts)
    return pa.table({"text": pc.filter(texts, pc.greater(pc.utf8_length(texts), 0))})


def first_text_byte(path: str) -> bytes:
    """The first byte after a UTF-8 byte-order mark and whitespace, ``b""`` for an empty file."""
    with open_binary(path) as handle:
        head = handle.read(ENCODING_PROBE_BYTES)
        while head:
            stripped = head.removeprefix(codecs.BOM_UTF8).lstrip()
            if stripped:
                return stripped[:1]
            head = handle.read(ENCODING_PROBE_BYTES)
    return b""


_CHUNK_BYTES = 1 << 24


def count_content_lines(path: str) -> int:
    """The lines with something other than whitespace on them (our JSONL reader's records). Iterating the lines is
    as fast as counting line ends and blank lines a block at a time with ``bytes.count`` and ``re`` (measured)."""
    with open_binary(path) as handle:
        return sum(map(bool, map(bytes.strip, handle)))  # no Python-level loop per line, unlike a generator


def has_lone_carriage_return(path: str) -> bool:
    """Whether the file has a ``\r`` not followed by ``\n``: our reader keeps it inside the line, the ``text``
    builder (universal newlines) ends the line there."""
    previous_ends_in_cr = False
    with open_binary(path) as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            if previous_ends_in_cr and not chunk.startswith(b"\n"):
                return True
            if b"\r" in chunk and re.search(rb"\r(?!\n)", chunk[:-1] if chunk.endswith(b"\r") else chunk):
                return True
            previous_ends_in_cr = chunk.endswith(b"\r")
    return previous_ends_in_cr


PARALLEL_MAP_MIN_ROWS = 100_000  # forming passages: up to this many rows, starting processes costs more than it saves


def map_processes(num_rows: int, min_rows: int, num_proc: int | None = None) -> int | None:
    """Processes for a ``Dataset.map`` over `num_rows` rows: only for more than `min_rows`, `num_proc` or by default
    ``min(4, cpus)``; None (in process) otherwise or when that is 1."""
    if num_rows <= min_rows:
        return None
    chosen = num_proc if num_proc is not None else min(4, os.cpu_count() or 1)
    return chosen if chosen > 1 else None
