"""Whole corpus files read by `datasets`' own builders (json, text, parquet) and formed into passages as our
line-by-line reader forms them; where the two could differ, `ReadLineByLine` sends the file back to that reader."""

from __future__ import annotations

import codecs
import dataclasses
import logging
import re
from concurrent.futures import ThreadPoolExecutor

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets.exceptions import DatasetGenerationError
from datasets.packaged_modules.json.json import Json
from datasets.packaged_modules.parquet.parquet import Parquet
from datasets.packaged_modules.text.text import Text

from .passages import ENCODING_PROBE_BYTES, CorpusError, check_title_column, is_string_type, open_binary


def select_text_column(
    dataset: datasets.Dataset | datasets.IterableDataset, where: str, column: str = "text"
) -> datasets.Dataset | datasets.IterableDataset:
    """Keeps only the ``column`` column, renamed ``"text"``, or raises ``CorpusError`` when there is none or it does
    not hold strings (a list of two strings would be tokenized as a sentence pair)."""
    columns = dataset.column_names
    if columns is None:  # a streaming dataset with unknown features: checked when iterating
        selected = dataset.select_columns([column])
        return selected.rename_column(column, "text") if column != "text" else selected
    check_text_column(dataset.features, where, column)
    if columns != [column]:
        dataset = dataset.select_columns([column])
    return dataset.rename_column(column, "text") if column != "text" else dataset


def check_text_column(features: datasets.Features, where: str, column: str) -> None:
    """Raises ``CorpusError`` when `features` (a dataset's or a file's columns) have no `column` or it does not hold
    strings (a list of two strings would be tokenized as a sentence pair)."""
    if column not in features:
        hint = ("rename the passage column to 'text', e.g. dataset.rename_column('<column>', 'text'), or name it "
                "with --text-column" if column == "text" else "name the passage column with --text-column")
        raise CorpusError(f"dataset {where!r} has no {column!r} column (columns: {list(features)}); {hint}")
    feature = features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise CorpusError(
            f"dataset {where!r}: the {column!r} column holds {feature!r}, not strings; save one passage string per "
            f"row in {column!r} (e.g. join a list of sentences with a space), or name another with --text-column"
        )


PASSAGE_FEATURES = datasets.Features({"text": datasets.Value("string")})


PARQUET_BATCH_ROWS = 100_000


class ReadLineByLine(Exception):
    """A builder's reading of a file cannot be trusted to match ours: read it line by line instead."""


def read_with_builder(sources: list[tuple[str, str, int, str]], column: str, code: str) -> datasets.Dataset:
    """Files of one format through ``datasets``' own json, text or parquet builder, each table formed into passages
    as our reader forms them (title joined, whitespace collapsed, blank ones dropped) before the builder writes it:
    the cache holds one copy of the corpus. `code` (the readers' fingerprint) and `column` key that cache.

    Raises ``ReadLineByLine`` where the builder's reading could differ from ours: a ``.jsonl`` line that is not
    one JSON object (a JSON array file, two objects on a line), a missing, null or non-string field, bytes that are
    not UTF-8, a ``.txt`` file with a carriage return that does not end a line (the builder would split lines
    there); ``CorpusError`` for a ``.parquet`` file without a string `column`, with null rows in it or with a
    ``title`` column of another type."""
    fmt = sources[0][1]
    paths = [source[0] for source in sources]
    options: dict = {}
    if fmt == "jsonl":
        if any(first_text_byte(path) not in (b"{", b"") for path in paths):
            raise ReadLineByLine("a line that is not a JSON object")
        options = {"on_mixed_types": None, "count_lines": True}
    elif fmt in ("lines", "blocks"):
        options = {"encoding": "utf-8-sig" if any(map(starts_with_bom, paths)) else "utf-8",
                   "sample_by": "line" if fmt == "lines" else "paragraph", "check_carriage_returns": True}
        column = "text"
    else:
        check_parquet_column(paths, column)
        options = {"batch_size": PARQUET_BATCH_ROWS}  # not a whole row group (up to 1M rows by default) at once
    kind = PASSAGE_BUILDERS[fmt]
    builder = kind(data_files=paths, features=PASSAGE_FEATURES, dataset_name=f"retromae_passages_{kind.packaged}",
                   passage_column=column, passage_code=":".join([code, *(str(source[3]) for source in sources)]),
                   **options)  # the files' stamps (`describe_file`): datasets keys its cache by path and mtime only
    json_logger = logging.getLogger("datasets.packaged_modules.json.json")
    json_logger.addFilter(_no_builder_errors)  # a failed read goes line by line, which names the line at fault
    try:
        builder.download_and_prepare()
    except DatasetGenerationError as error:  # datasets wraps what our checks raise while it generates
        if isinstance(error.__cause__, (ReadLineByLine, CorpusError)):
            raise error.__cause__ from None
        raise
    finally:
        json_logger.removeFilter(_no_builder_errors)
    return builder.as_dataset(split="train")


def _no_builder_errors(record: logging.LogRecord) -> bool:
    """False for the json builder's "Failed to load JSON / convert" errors."""
    return not str(record.msg).startswith("Failed to")


def check_parquet_column(paths: list[str], column: str) -> None:
    """``check_text_column`` and ``check_title_column`` on each ``.parquet`` file's schema, before any row is read."""
    for path in paths:
        schema = pq.read_schema(path)
        check_text_column(datasets.Features.from_arrow_schema(schema), path, column)
        check_title_column(schema, path, column)


class FormsPassages:
    """Mixed into a ``datasets`` packaged builder: every table it reads becomes the passages of its rows
    (``passages_batch``), formed in a second thread while the builder reads and writes the next ones, so what it
    writes is the passage corpus."""

    config: datasets.BuilderConfig
    packaged: str  # the builder's name in `datasets` (json, text, parquet): its cache folder's suffix

    def _generate_tables(self, *args, **kwargs):
        self.rows_read, self.null_rows = 0, 0
        files = [str(file) for files in self.config.data_files.values() for file in files]
        with ThreadPoolExecutor(2) as pool:  # the files' checks and the forming run beside the builder
            lines = pool.submit(sum, map(count_content_lines, files)) if self.config.count_lines else None
            lone_cr = (pool.submit(any, map(has_lone_carriage_return, files))
                       if self.config.check_carriage_returns else None)
            formed = None
            for key, (table, title) in super()._generate_tables(*args, **kwargs):
                forming = pool.submit(passages_batch, table, self.config.passage_column, title)
                if formed is not None:
                    yield formed[0], formed[1].result()
                formed = (key, forming)
            if formed is not None:
                yield formed[0], formed[1].result()
            if lone_cr is not None and lone_cr.result():  # the text builder splits lines there; ours does not
                raise ReadLineByLine("a carriage return that does not end a line")
            if lines is not None and self.rows_read != lines.result():
                raise ReadLineByLine(f"{self.rows_read} JSON objects on {lines.result()} lines")
        if self.null_rows:
            where = files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more .parquet files)"
            raise CorpusError(f"{where}: {self.null_rows} row(s) have no text (null) in column "
                              f"{self.config.passage_column!r}; drop them or fill them in")

    def _cast_table(self, pa_table: pa.Table, *args, **kwargs) -> tuple[pa.Table, bool]:
        """Checks a table the builder read; returns it with whether it has a title to join."""
        column = self.config.passage_column
        self.rows_read += pa_table.num_rows
        nulls = pa_table.column(column).null_count if column in pa_table.column_names else 0
        if (column not in pa_table.column_names or not is_string_type(pa_table.schema.field(column).type)
                or (nulls and not isinstance(self, Parquet))):  # a Parquet file's null rows are named at the end
            raise ReadLineByLine(f"a row without a string {column!r}")
        self.null_rows += nulls
        title = "title" in pa_table.column_names and column != "title"
        kind = pa_table.schema.field("title").type if title else None
        if title and not (is_string_type(kind) or pa.types.is_null(kind)):  # our reader names the line at fault
            raise ReadLineByLine("a 'title' that is not a string")
        title = title and is_string_type(kind)  # a column of nulls: no title
        if not isinstance(self, Text) and not all(is_valid_utf8(pa_table.column(name))
                                                  for name in ([column, "title"] if title else [column])):
            raise ReadLineByLine(f"bytes that are not UTF-8 in column {column!r} or 'title'")
        return pa_table, title


def passage_builder(base: type) -> type:
    """`base` (a packaged builder) forming passages (``FormsPassages``); its config takes `passage_column`,
    `passage_code` (the cache key of our code), `count_lines` (JSON: check one object per non-blank line) and
    `check_carriage_returns` (text: check that every carriage return ends a line)."""
    config = dataclasses.make_dataclass(
        f"Passage{base.BUILDER_CONFIG_CLASS.__name__}",
        [("passage_column", str, "text"), ("passage_code", str, ""), ("count_lines", bool, False),
         ("check_carriage_returns", bool, False)],
        bases=(base.BUILDER_CONFIG_CLASS,),
    )
    return type(f"Passage{base.__name__}", (FormsPassages, base),
                {"BUILDER_CONFIG_CLASS": config, "packaged": base.__name__.lower()})


PASSAGE_BUILDERS = {"jsonl": passage_builder(Json), "lines": passage_builder(Text), "blocks": passage_builder(Text),
                    "parquet": passage_builder(Parquet)}


def is_valid_utf8(texts: pa.ChunkedArray) -> bool:
    """Whether a string column holds valid UTF-8: pyarrow's JSON reader does not check (a Latin-1 "é" passes), and
    forming the passages only looks into the strings it changes."""
    try:
        texts.validate(full=True)
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
    at_ends = pc.or_(pc.starts_with(texts, " "), pc.ends_with(texts, " "))
    changes = pc.fill_null(pc.or_(pc.match_substring_regex(texts, _WHITESPACE_RUN), at_ends), False)
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
        has_title = pc.fill_null(pc.greater(pc.binary_length(collapse_whitespace(titles)), 0), False)
        texts = pc.if_else(has_title, pc.binary_join_element_wise(titles, texts, " "), texts)
    texts = collapse_whitespace(texts)
    lengths = pc.binary_length(texts)  # from the offsets alone: no pass over the characters
    if pc.min(lengths).as_py() == 0:
        texts = pc.filter(texts, pc.greater(lengths, 0))
    return pa.table({"text": texts})


def starts_with_bom(path: str) -> bool:
    with open_binary(path) as handle:
        return handle.read(len(codecs.BOM_UTF8)) == codecs.BOM_UTF8


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
_IS_STRIPPED = np.zeros(256, dtype=bool)  # the bytes bytes.strip() removes
_IS_STRIPPED[list(b" \t\n\r\x0b\x0c")] = True


def count_content_lines(path: str) -> int:
    """The lines with something other than whitespace on them (our JSONL reader's records), counted with numpy a
    block at a time: it releases the GIL, so the count runs beside a builder reading the same file."""
    count, open_line_has_content = 0, False
    with open_binary(path) as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            data = np.frombuffer(chunk, dtype=np.uint8)
            ends = np.flatnonzero(data == ord("\n"))
            if len(ends) == 0:
                open_line_has_content = open_line_has_content or bool(chunk.strip())
                continue
            starts = np.concatenate(([0], ends[:-1] + 1))
            blank = _IS_STRIPPED[data[starts]]  # a line is blank only where its first byte is whitespace
            for line in np.flatnonzero(blank):  # few in a JSONL file: each checked whole
                blank[line] = not chunk[starts[line]:ends[line]].strip()
            blank[0] = blank[0] and not open_line_has_content
            count += len(ends) - int(np.count_nonzero(blank))
            open_line_has_content = bool(chunk[ends[-1] + 1:].strip())
    return count + open_line_has_content


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
