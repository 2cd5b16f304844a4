"""Passages of one corpus file, line by line, with the file:line of every problem: text lines and blank-line blocks,
JSONL and Parquet records, compressed files, and the UTF-16/32 detection that runs first."""

from __future__ import annotations

import bz2
import codecs
import functools
import gzip
import hashlib
import io
import json
import logging
import lzma
import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from ..inputs.extras import ZSTANDARD_HINT
from ..inputs.io import iter_jsonl, json_type


class CorpusError(ValueError):
    """A problem in a corpus file, named by its file and line; the readers tell it from a library's failure, also
    where `datasets` wraps it."""

logger = logging.getLogger(__name__)


# Compressed .txt/.jsonl files (``name.jsonl.gz``): decompressed while read (``.zst`` by the zstandard package).
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


def split_name(path: Path) -> tuple[str, str]:
    """``(format suffix, compression suffix)`` of a file name, e.g. ``(".jsonl", ".gz")``; ``""`` for none."""
    stem, compression = os.path.splitext(path.name)
    if compression not in COMPRESSED_SUFFIXES:
        return compression, ""
    return os.path.splitext(stem)[1], compression


def open_binary(path: str | os.PathLike):
    """The file opened for reading bytes, decompressed when its name ends in a compression suffix."""
    compression = split_name(Path(path))[1]
    if compression == ".zst":
        return _open_zstandard(path)
    return {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(compression, open)(path, "rb")


def _open_zstandard(path: str | os.PathLike) -> io.BufferedReader:
    """A ``.zst`` file decompressed while read, as a buffered reader: zstandard's own reader has no ``readline``
    (iterating its lines fails), and it stops at the end of the first frame unless told to read across frames
    (``zstd`` of concatenated or multi-threaded output writes several)."""
    try:
        import zstandard
    except ImportError:  # a core dependency, but an install without dependencies lacks it
        raise CorpusError(f"{path}: a zstandard-compressed file, and the zstandard package is not installed; "
                          f"{ZSTANDARD_HINT}, or decompress it (zstd -d)") from None
    raw = open(path, "rb")  # noqa: SIM115 - the reader closes it (closefd), and the caller the reader
    reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return io.BufferedReader(reader, buffer_size=1 << 20)


# byte-order marks, UTF-32's first: its little-endian mark starts with UTF-16's
_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
              (codecs.BOM_UTF16_BE, "utf-16"))


ENCODING_PROBE_BYTES = 4096


def wide_encoding(head: bytes) -> str | None:
    """The ``iconv`` name of the UTF-16 or UTF-32 encoding of a file that starts with ``head``, or None: read off a
    byte-order mark, else off the NUL bytes that UTF-8 text lacks: UTF-32 has two in each 4-byte unit of a character
    below U+10000 (the last two little-endian), UTF-16 one in each 2-byte unit of a character below U+0100."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            return name
    if len(head) < 4:
        return None
    nul_share = [head[i::4].count(0) / len(head[i::4]) for i in range(4)]  # by position in a 4-byte unit
    if min(nul_share[2:]) > 0.9:
        return "utf-32le"
    if min(nul_share[:2]) > 0.9:
        return "utf-32be"
    odd, even = (nul_share[1] + nul_share[3]) / 2, (nul_share[0] + nul_share[2]) / 2
    if max(odd, even) > 0.5:
        return "utf-16le" if odd > even else "utf-16be"
    return None


# the first bytes of compressed data, and the suffix under which `open_binary` decompresses it
_COMPRESSION_MAGIC = ((b"\x1f\x8b", "gzip", ".gz"), (b"BZh", "bzip2", ".bz2"), (b"\xfd7zXZ\x00", "xz", ".xz"),
                      (b"\x28\xb5\x2f\xfd", "zstandard", ".zst"))


def check_text_encoding(path: str | os.PathLike) -> None:
    """Refuse compressed data under a plain name, naming the suffix that reads it, and a UTF-16 or UTF-32 file
    (``wide_encoding``), naming the ``iconv`` call that converts it: decoded as UTF-8 it fails at the first byte or,
    without a byte-order mark, reads as text full of NUL characters."""
    with open_binary(path) as handle:
        head = handle.read(ENCODING_PROBE_BYTES)
    packed = next(((kind, suffix) for magic, kind, suffix in _COMPRESSION_MAGIC if head.startswith(magic)), None)
    if packed is not None:
        raise CorpusError(f"{path}: {packed[0]}-compressed data, not text; name the file {Path(path).name}{packed[1]} "
                          f"(retromae decompresses .gz, .bz2, .xz and .zst) or decompress it")
    encoding = wide_encoding(head)
    if encoding is not None:
        raise CorpusError(f"{path}: {encoding.upper()} text, not UTF-8; re-encode the file as UTF-8, e.g. iconv -f "
                        f"{encoding} -t utf-8 in > out")


def iter_decoded_lines(path: str) -> Iterator[tuple[int, str]]:
    """Yields ``(1-based line number, line without its end)``, raising ``CorpusError`` on bytes that are not UTF-8
    (``check_text_encoding`` first, so that UTF-16 and UTF-32 are named as such)."""
    check_text_encoding(path)
    with open_binary(path) as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(
                    f"{path}:{line_no}: bytes that are not valid UTF-8 ({exc.reason} at column {exc.start + 1}); "
                    f"re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out"
                ) from None
            yield line_no, line.rstrip("\r\n")


def numbered_passages(
    path: str | os.PathLike, text_format: TextFormat = "auto", text_column: str = "text"
) -> Iterator[tuple[int, str]]:
    """``(line, passage)`` for each passage of one ``.txt`` or ``.jsonl`` file, as ``read_corpus`` reads it; ``line``
    is the 1-based line the passage starts on (an id that blank passages, which are skipped, do not shift)."""
    fmt = describe_file(Path(path), text_format)[1]
    if text_format == "auto" and fmt == "blocks":
        logger.warning("%s", auto_blocks_note([Path(path)]))
    return file_passages(str(path), fmt, text_column)


def iter_text_lines(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per non-empty line (whitespace collapsed), with its line number."""
    for line_no, line in iter_decoded_lines(path):
        text = " ".join(line.split())
        if text:
            yield line_no, text


def iter_text_blocks(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """Passages separated by empty lines, with the line each starts on; the lines of a block are joined with a space.

    A line of only spaces or tabs is skipped without ending the block (Wikipedia-style dumps keep such lines inside
    articles; ``awk`` paragraph mode counts the same way).
    """
    block: list[str] = []
    start = 0
    for line_no, line in iter_decoded_lines(path):
        text = " ".join(line.split())
        if text:
            start = start if block else line_no
            block.append(text)
        elif not line and block:
            yield start, " ".join(block)
            block = []
    if block:
        yield start, " ".join(block)


def iter_jsonl_passages(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per JSON line, with its line number: ``column``, or ``title + " " + text`` when a title is
    given. A compressed file is decompressed into a temporary file first (messages name the file given)."""
    check_text_encoding(path)
    if not split_name(Path(path))[1]:
        yield from _iter_jsonl_plain(path, path, column)
        return
    with tempfile.TemporaryDirectory() as folder:
        plain = os.path.join(folder, "corpus.jsonl")
        with open_binary(path) as source, open(plain, "wb") as target:
            shutil.copyfileobj(source, target)
        try:
            yield from _iter_jsonl_plain(plain, path, column)
        except CorpusError as exc:
            raise CorpusError(str(exc).replace(plain, str(path))) from None


def _iter_jsonl_plain(path: str, shown: str, column: str) -> Iterator[tuple[int, str]]:
    for where, record in iter_jsonl(path, error=CorpusError, example=f'{{"{column}": "..."}}'):
        check_jsonl_record(record, where, column)
        title = record.get("title") if column != "title" else None
        text = f"{title} {record[column]}" if isinstance(title, str) and title.strip() else record[column]
        text = " ".join(text.split())
        if text:
            yield int(where.rsplit(":", 1)[1]), text


def iter_parquet_passages(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per row of a ``.parquet`` file (streaming), with its 1-based row number."""
    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    if column not in names:
        raise CorpusError(f"dataset {path!r} has no {column!r} column (columns: {names}); name the passage column "
                        "with --text-column")
    check_title_column(parquet.schema_arrow, path, column)
    title = "title" in names and column != "title"
    row = 0
    for batch in parquet.iter_batches(columns=[column, "title"] if title else [column]):
        table = batch.to_pydict()
        for index, text in enumerate(table[column]):
            row += 1
            if not isinstance(text, str):
                raise CorpusError(f"{path}: row {row}: the {column!r} column holds {text!r}, not a string; save one "
                                f"passage string per row")
            head = table["title"][index] if title else None
            text = " ".join((f"{head} {text}" if isinstance(head, str) and head.strip() else text).split())
            if text:
                yield row, text


PASSAGE_READERS = {"jsonl": iter_jsonl_passages, "lines": iter_text_lines, "blocks": iter_text_blocks,
                   "parquet": iter_parquet_passages}

try:
    from zstandard import ZstdError
except ImportError:  # no .zst file can be read then (`_open_zstandard` says so)
    ZstdError = OSError

# what reading a truncated or corrupt file raises part-way (gzip and bz2: EOFError, OSError; Parquet: ArrowException)
READ_FAILURES = (EOFError, OSError, zlib.error, lzma.LZMAError, ZstdError, pa.ArrowException)


def file_passages(path: str, fmt: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """``PASSAGE_READERS[fmt]``; a file that fails part-way (truncated, corrupt) raises one ``CorpusError`` naming it
    and the last line (row) read, instead of the decompressor's or pyarrow's exception."""
    last = 0
    try:
        for last, text in PASSAGE_READERS[fmt](path, column):
            yield last, text
    except READ_FAILURES as exc:
        raise unreadable_file(path, exc, f" after {'row' if fmt == 'parquet' else 'line'} {last}" if last else "") \
            from None


def unreadable_file(path: str | os.PathLike, exc: BaseException, reached: str = "") -> CorpusError:
    """The one-line error for a file that failed part-way (one of ``READ_FAILURES``)."""
    return CorpusError(f"{path}: could not be read{reached} ({type(exc).__name__}: {' '.join(str(exc).split())}); "
                       f"the file is truncated or corrupt: re-create or re-download it")


def check_jsonl_record(record: dict[str, Any], where: str, column: str = "text") -> None:
    """Raises ``CorpusError`` unless ``record`` has a string ``column``; ``where`` is ``file:line``."""
    if column not in record:
        title = ' (and optionally a "title")' if column != "title" else ""
        other = "; or name the passage field with --text-column" if column == "text" and record else ""
        raise CorpusError(
            f'{where}: no "{column}" field (keys: {sorted(record)}); give every line a string "{column}" field'
            f"{title}{other}"
        )
    if not isinstance(record[column], str):
        raise CorpusError(
            f'{where}: the "{column}" field must be a string, found {_shown(record[column])} (JSON '
            f'{json_type(record[column])}); write the passage in quotes, e.g. {{"{column}": "..."}}'
        )
    title = record.get("title") if column != "title" else None
    if title is not None and not isinstance(title, str):  # prepended only when a string: else dropped silently
        raise CorpusError(
            f'{where}: the "title" field must be a string or null, found {_shown(title)} (JSON {json_type(title)}); '
            f'write the title in quotes, e.g. {{"title": "...", "{column}": "..."}}, or drop it'
        )


def _shown(value: Any) -> str:
    """A JSON value as a message shows it: at most 40 characters."""
    found = json.dumps(value)
    return found if len(found) <= 40 else found[:37] + "..."


def is_string_type(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def check_title_column(schema: pa.Schema, path: str, column: str = "text") -> None:
    """Raises ``CorpusError`` when a ``.parquet`` file's ``title`` column (prepended to ``column``) holds neither
    strings nor only nulls: its titles would be dropped silently."""
    if "title" not in schema.names or column == "title":
        return
    kind = schema.field("title").type
    if not (is_string_type(kind) or pa.types.is_null(kind)):
        raise CorpusError(f"dataset {path!r}: the 'title' column holds {kind}, not strings; save each title as a "
                          "string (or null), or drop the column")


TextFormat = Literal["auto", "lines", "blocks"]


TEXT_FORMATS = ("auto", "lines", "blocks")


def describe_file(path: Path, text_format: TextFormat) -> tuple[str, str, int, str]:
    """``(path, format, size, stamp)``: the format resolved; size and stamp (mtime and a digest of the file's first and
    last 64 KiB) so that edits invalidate the cache, also those that keep size and mtime (``cp -p`` of an edited copy)."""
    stat = path.stat()
    suffix, compression = split_name(path)
    if suffix == ".jsonl":
        fmt = "jsonl"
    elif suffix == ".txt":
        try:
            fmt = _text_layout(path, text_format)
        except READ_FAILURES as exc:  # a truncated or fake .gz fails while the layout is sniffed
            raise unreadable_file(path, exc) from None
    elif suffix == ".parquet" and not compression:
        fmt = "parquet"
    else:
        raise CorpusError(f"{str(path)!r}: unsupported file type {suffix + compression!r}; use a .txt, .jsonl or "
                        f".parquet file (.txt and .jsonl may be compressed: {', '.join(COMPRESSED_SUFFIXES)})")
    return str(path.resolve()), fmt, stat.st_size, f"{stat.st_mtime_ns}:{_ends_digest(path, stat.st_size)}"


def _text_layout(path: Path, text_format: TextFormat) -> str:
    """The layout a .txt is read in ("lines" or "blocks"), logged; `auto` reads blocks when an empty line stands
    between text lines (``auto_blocks_note`` names it)."""
    fmt = text_format if text_format != "auto" else ("blocks" if _blank_separator(path) else "lines")
    logger.info("%s: one passage per %s (text format %s)", path,
                "line" if fmt == "lines" else "block of lines between empty lines", text_format)
    return fmt


def auto_blocks_note(paths: list[Path]) -> str:
    """The warning for .txt files that ``--text-format auto`` reads as blocks, naming the empty line of the first: one
    stray empty line makes a file of a passage per line a few passages of thousands of tokens."""
    more = f" (and {len(paths) - 1} more .txt file(s) read as blocks)" if len(paths) > 1 else ""
    return (f"{paths[0]}: one passage per block of lines between empty lines (--text-format auto: line "
            f"{_blank_separator(paths[0])} is empty between text lines){more}; --text-format lines reads one passage "
            "per line, --text-format blocks keeps the blocks without this warning")


def _ends_digest(path: Path, size: int, span: int = 1 << 16) -> str:
    """sha256 of the first and last `span` bytes: a cheap content check (128 KiB read) for a file of any size."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        digest.update(file.read(span))
        if size > span:
            file.seek(max(size - span, span))
            digest.update(file.read(span))
    return digest.hexdigest()[:16]


def _blank_separator(path: Path) -> int | None:
    stat = path.stat()
    return _first_blank_separator(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _first_blank_separator(path: str, _size: int, _mtime_ns: int) -> int | None:
    """The 1-based line of the file's first empty line between two non-empty lines (which makes ``auto`` read the
    ``"blocks"`` layout); None when there is none. Cached (the note reads it again) by path, size and mtime, which an
    edit changes."""
    seen_text = False
    blank_at = None
    with open_binary(path) as handle:
        for line_no, raw in enumerate(handle, start=1):
            line = raw.rstrip(b"\r\n")
            if not line:
                blank_at = blank_at or (line_no if seen_text else None)
            elif not line.strip():
                continue  # whitespace only: neither text nor a separator
            elif blank_at:
                return blank_at
            else:
                seen_text = True
    return None


__all__ = ["TEXT_FORMATS", "TextFormat", "check_text_encoding", "iter_decoded_lines", "numbered_passages", "wide_encoding"]
