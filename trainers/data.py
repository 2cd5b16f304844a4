"""Pre-training data: corpus readers, tokenization (truncation or packing) and the encoder MLM collator.

The pipeline is ``read_corpus`` -> ``tokenize_corpus`` -> ``PretrainingCollator``:

```python
corpus = read_corpus("corpus.jsonl")  # Dataset with one column "text"
tokenized = tokenize_corpus(corpus, tokenizer, max_seq_length=512)  # "input_ids", "word_starts"
batch = PretrainingCollator(tokenizer)(list(tokenized.select(range(8))))
```

Files are read by our own generator so that every error names the file and the 1-based line number
(``UserError``); the result is materialised (and cached) by ``datasets.Dataset.from_generator``, or streamed lazily
by ``datasets.IterableDataset.from_generator`` for corpora larger than memory.

``DataInputs`` (what a run asks for) and ``TrainingData`` (dataset + collator) are what a method's training-data
builder takes and returns (``methods.Method.training_data``; the builders are in ``contrastive_data.py``).
"""

from __future__ import annotations

import codecs
import functools
import hashlib
import importlib
import inspect
import itertools
import json
import logging
import numbers
import os
import pkgutil
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets
import torch
from datasets.exceptions import DatasetGenerationError

from .core.errors import UserError
from .core.io import iter_jsonl, json_type

logger = logging.getLogger(__name__)

TextFormat = Literal["auto", "lines", "blocks"]
TEXT_FORMATS = ("auto", "lines", "blocks")
CORPUS_SUFFIXES = (".txt", ".jsonl")
# Suffixes that mark a source as a file path (never a Hub dataset name) when it does not exist.
PATH_LIKE_SUFFIXES = (*CORPUS_SUFFIXES, ".json", ".csv", ".tsv", ".parquet", ".arrow", ".gz")
MIN_PACKED_BLOCK = 8  # a trailing packed block shorter than this many tokens is dropped
NUM_PROC_MIN_ROWS = 10_000  # tokenize in several processes only above this many rows
# [UNK] is never masked nor predicted: a corpus mostly [UNK] for its tokenizer (wrong language or script) trains nothing
MAX_UNK_SHARE = 0.5  # more [UNK] than this among the text tokens: refused
WARN_UNK_SHARE = 0.05  # more than this: a warning
UNK_SAMPLE_ROWS = 1000  # sequences the share is measured on (spread over the corpus; the first ones of a stream)

__all__ = [
    "DataInputs",
    "PretrainingCollator",
    "TrainingData",
    "UNMASKED_KEY",
    "builtin_corpus",
    "code_fingerprint",
    "iter_decoded_lines",
    "masking_generator",
    "numbered_passages",
    "read_corpus",
    "special_template",
    "tokenize_corpus",
    "unknown_token_share",
    "word_start_flags",
]


# ---------------------------------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------------------------------


def read_corpus(
    source: str | os.PathLike | None,
    *,
    text_format: TextFormat = "auto",
    streaming: bool = False,
) -> datasets.Dataset | datasets.IterableDataset:
    """Reads a pre-training corpus into a dataset with one column ``"text"`` (one passage per row).

    Accepted sources, tried in this order:

    - ``None``: the embedded corpus of :func:`builtin_corpus`.
    - A ``.txt`` file. ``text_format="lines"``: one passage per non-empty line; ``"blocks"``: passages separated by
      empty lines, the lines of a block joined with a space (a line of only spaces does not end a block);
      ``"auto"``: blocks if the file has an empty line between two non-empty lines, else lines.
    - A ``.jsonl`` file: one JSON object per line with a string ``"text"`` field; a non-empty string ``"title"`` is
      prepended (``title + " " + text``, the BEIR corpus convention). Blank lines are skipped.
    - A BEIR folder (``corpus.jsonl`` beside ``queries.jsonl`` or ``qrels/``): its ``corpus.jsonl``.
    - A directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` whose ``"train"``
      split is used) with a ``"text"`` column.
    - Any other directory: every ``.txt`` and ``.jsonl`` file below it (recursively, through symbolic links to
      folders too; hidden files skipped), in sorted path order; a file of another type there is refused (it would be
      left out silently), and so is a link that loops or reaches a folder a second time.
    - Otherwise a Hub dataset name, loaded with ``datasets.load_dataset(name, split="train")``. A source that looks
      like a path (absolute, starting with ``.`` or ``~``, or ending in a file suffix) and does not exist is reported
      as missing instead.

    Passages that are empty after stripping whitespace are skipped. The dataset's ``info.dataset_name`` is the source
    as given (the messages of later steps, e.g. :func:`tokenize_corpus`, name it).

    Args:
        source: A path, a Hub dataset name, or ``None`` for the built-in corpus.
        text_format: How ``.txt`` files split into passages (``"auto"``, ``"lines"`` or ``"blocks"``).
        streaming: Return a lazy ``datasets.IterableDataset`` (for corpora larger than memory) instead of a
            memory-mapped, cached ``datasets.Dataset``. Errors in the files then surface while iterating, as the
            same ``UserError``; a folder of several files is sharded by file across DataLoader workers.

    Returns:
        A ``datasets.Dataset`` (or ``datasets.IterableDataset`` when ``streaming=True``) with the column ``"text"``.

    Raises:
        UserError: The path is missing, a file is malformed (not UTF-8, UTF-16 or UTF-32 named as such, a line that
            is not JSON or has no string ``"text"``; the message gives the file and 1-based line), a folder holds
            files of other types (which would be left out) or a looping link, or the corpus holds no passage at all.
        ValueError: ``text_format`` is not one of ``"auto"``, ``"lines"``, ``"blocks"``.
    """
    if text_format not in TEXT_FORMATS:
        raise ValueError(f"text_format={text_format!r} is not one of {TEXT_FORMATS}")
    corpus = _read_source(source, text_format, streaming)
    corpus.info.dataset_name = "the built-in corpus" if source is None else str(source)
    return corpus


def _read_source(
    source: str | os.PathLike | None, text_format: TextFormat, streaming: bool
) -> datasets.Dataset | datasets.IterableDataset:
    """``read_corpus`` without the naming."""
    if source is None:
        corpus = builtin_corpus()
        return corpus.to_iterable_dataset() if streaming else corpus
    path = Path(source).expanduser()
    if path.is_file():
        return _read_files([path], text_format, streaming)
    if path.is_dir():
        return _read_directory(path, text_format, streaming)
    if _looks_like_path(str(source)):
        raise UserError(f"corpus path {str(source)!r} does not exist; check the path (relative to {Path.cwd()})")
    return _load_hub_dataset(str(source), streaming)


def _looks_like_path(source: str) -> bool:
    """Whether a non-existing source is meant as a local path rather than a Hub dataset name ``[owner/]name``."""
    return (
        os.path.isabs(source)
        or source.startswith((".", "~"))
        or source.count("/") > 1
        or source.lower().endswith(PATH_LIKE_SUFFIXES)
    )


def _read_directory(
    path: Path, text_format: TextFormat, streaming: bool
) -> datasets.Dataset | datasets.IterableDataset:
    """Reads a BEIR folder, a ``save_to_disk`` folder, or a folder of ``.txt``/``.jsonl`` files (and nothing else).
    A ``corpus.jsonl`` without BEIR's queries or qrels beside it is one file of a folder corpus: reading it alone
    would leave out the others."""
    if (path / "corpus.jsonl").is_file() and ((path / "queries.jsonl").is_file() or (path / "qrels").is_dir()):
        return _read_files([path / "corpus.jsonl"], text_format, streaming)
    if any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
        return _load_saved_dataset(path, streaming)
    found = _files_below(path)
    files = [p for p in found if p.suffix in CORPUS_SUFFIXES]
    others = [p for p in found if p.suffix not in CORPUS_SUFFIXES]
    if not files:
        holds = f" (it holds {_some_names(others, path)})" if others else ""
        raise UserError(
            f"directory {str(path)!r} holds no corpus{holds}: expected corpus.jsonl (BEIR), a datasets save_to_disk "
            f"folder, or .txt/.jsonl files; point the source at one of these"
        )
    if others:
        raise UserError(
            f"directory {str(path)!r} holds files that are not a corpus format: {_some_names(others, path)}; only .txt "
            f"and .jsonl files are read: move the others out of the folder (or convert them)"
        )
    logger.info("Reading %d corpus file(s) in %s: %s", len(files), path, _some_names(files, path))
    return _read_files(files, text_format, streaming)


def _files_below(folder: Path) -> list[Path]:
    """The files below ``folder`` (hidden ones and those in hidden folders left out), in sorted path order, through
    symbolic links to folders too: ``Path.rglob`` does not enter those, and their passages were left out silently.

    Raises:
        UserError: a link to a folder that holds it (walking on would never end), or to a folder reached already
            (its files would be read twice); the message names the link.
    """
    found: list[Path] = []
    reached: dict[str, Path] = {}  # real path -> the path it was first reached by
    for root, subfolders, names in os.walk(folder, followlinks=True):
        here = Path(root)
        real = os.path.realpath(here)
        if real in reached:
            raise UserError(f"directory {str(folder)!r}: {_relative(here, folder)} and "
                            f"{_relative(reached[real], folder)} are the same folder through a symbolic link, so "
                            "its files would be read twice; remove the link")
        reached[real] = here
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for link in (here / name for name in subfolders if (here / name).is_symlink()):
            target = Path(os.path.realpath(link))
            if Path(real).is_relative_to(target):
                raise UserError(f"directory {str(folder)!r}: {_relative(link, folder)} is a symbolic link to "
                                f"{target}, a folder that holds it (a loop); remove the link")
        found += [here / name for name in names if not name.startswith(".") and (here / name).is_file()]
    return sorted(found)


def _relative(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def _some_names(paths: list[Path], folder: Path, shown: int = 5) -> str:
    """The first ``shown`` paths relative to ``folder``, and how many more."""
    names = ", ".join(_relative(p, folder) for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def _load_saved_dataset(path: Path, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
    """Loads a ``save_to_disk`` folder (``DatasetDict``: its ``"train"`` split, or its only split)."""
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" in loaded:
            loaded = loaded["train"]
        elif len(loaded) == 1:
            loaded = next(iter(loaded.values()))
        else:
            raise UserError(
                f"{str(path)!r} is a DatasetDict without a 'train' split (splits: {sorted(loaded)}); "
                f"save the split to use with dataset_dict['<split>'].save_to_disk(...)"
            )
    corpus = _select_text_column(loaded, str(path))
    if len(corpus) == 0:
        raise UserError(f"{str(path)!r} holds no rows: the corpus is empty; save a dataset with passages in 'text'")
    return corpus.to_iterable_dataset() if streaming else corpus


def _load_hub_dataset(name: str, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
    """Loads the ``"train"`` split of a Hub dataset; every failure becomes a ``UserError``."""
    try:
        loaded = datasets.load_dataset(name, split="train", streaming=streaming)
    except Exception as exc:
        raise UserError(
            f"corpus {name!r} was not found locally (no such file or directory) or on the Hub "
            f"({type(exc).__name__}: {exc}); check the path, or the dataset name and your connection "
            f"(HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)"
        ) from exc
    return _select_text_column(loaded, name)


def _select_text_column(
    dataset: datasets.Dataset | datasets.IterableDataset, where: str
) -> datasets.Dataset | datasets.IterableDataset:
    """Keeps only the ``"text"`` column, or raises ``UserError`` when there is none or it does not hold strings
    (a list of two strings would be tokenized as a sentence pair)."""
    columns = dataset.column_names
    if columns is None:  # a streaming dataset with unknown features: checked when iterating
        return dataset.select_columns(["text"])
    if "text" not in columns:
        raise UserError(
            f"dataset {where!r} has no 'text' column (columns: {columns}); rename the passage column to 'text', "
            f"e.g. dataset.rename_column('<column>', 'text')"
        )
    feature = dataset.features["text"]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UserError(
            f"dataset {where!r}: the 'text' column holds {feature!r}, not strings; save one passage string per row "
            f"in 'text' (e.g. join a list of sentences with a space)"
        )
    return dataset.select_columns(["text"]) if columns != ["text"] else dataset


def _read_files(
    files: list[Path], text_format: TextFormat, streaming: bool
) -> datasets.Dataset | datasets.IterableDataset:
    """Materialises (or streams) the passages of ``.txt``/``.jsonl`` files through our own generator."""
    sources = [_describe_file(path, text_format) for path in files]
    if not any(_has_content(path) for path in files):
        names = ", ".join(repr(str(p)) for p in files)
        raise UserError(f"the corpus is empty: {names} holds no non-blank line; add passages or fix the path")
    features = datasets.Features({"text": datasets.Value("string")})
    if streaming:
        # A list in gen_kwargs is sharded by file across DataLoader workers / ranks.
        return datasets.IterableDataset.from_generator(
            _generate_passages, features=features, gen_kwargs={"sources": sources, "code": _reader_fingerprint()}
        )
    try:
        corpus = datasets.Dataset.from_generator(
            _generate_passages,
            features=features,
            gen_kwargs={"sources": tuple(sources), "code": _reader_fingerprint(), "require_passages": True},
        )
    except DatasetGenerationError as exc:  # datasets wraps what the generator raises
        cause = _find_corpus_error(exc)
        if cause is None:
            raise
        raise cause.with_traceback(cause.__traceback__) from None
    logger.info("Read %d passages from %d file(s)", len(corpus), len(files))
    return corpus


def _describe_file(path: Path, text_format: TextFormat) -> tuple[str, str, int, int]:
    """``(path, format, size, mtime_ns)``: the format resolved, size and mtime so edits invalidate the cache."""
    stat = path.stat()
    if path.suffix == ".jsonl":
        fmt = "jsonl"
    elif path.suffix == ".txt":
        fmt = text_format if text_format != "auto" else ("blocks" if _has_blank_separator(path) else "lines")
    else:
        raise UserError(f"{str(path)!r}: unsupported file type {path.suffix!r}; use a .txt or .jsonl file")
    return str(path.resolve()), fmt, stat.st_size, stat.st_mtime_ns


def _has_blank_separator(path: Path) -> bool:
    """Whether the file has an empty line between two non-empty lines (the ``"blocks"`` layout)."""
    seen_text = blank_after_text = False
    with open(path, "rb") as handle:
        for raw in handle:
            line = raw.rstrip(b"\r\n")
            if not line:
                blank_after_text = seen_text
            elif not line.strip():
                continue  # whitespace only: neither text nor a separator
            elif blank_after_text:
                return True
            else:
                seen_text = True
    return False


def _has_content(path: Path) -> bool:
    """Whether the file has at least one non-blank line (stops at the first)."""
    with open(path, "rb") as handle:
        return any(raw.strip() for raw in handle)


def _find_corpus_error(exc: BaseException) -> UserError | None:
    """The ``UserError`` that ``datasets`` wrapped (in ``__cause__``/``__context__``), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, UserError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def code_fingerprint(*functions: Any) -> str:
    """A hash of the functions' source code (bytecode when the source is unavailable).

    ``datasets`` fingerprints a generator or ``map`` function without the helpers it calls, so a cached Arrow file
    would outlive a change to those helpers; this hash goes into ``gen_kwargs`` / ``fn_kwargs`` to prevent that.
    """
    digest = hashlib.sha256()
    for function in functions:
        try:
            digest.update(inspect.getsource(function).encode())
        except (OSError, TypeError):
            digest.update(function.__code__.co_code)
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _reader_fingerprint() -> str:
    return code_fingerprint(
        _generate_passages, iter_decoded_lines, _iter_text_lines, _iter_text_blocks, _iter_jsonl, _check_jsonl_record,
        iter_jsonl, json_type, check_text_encoding, wide_encoding,
    )


def _generate_passages(
    sources: list[tuple[str, str, int, int]] | tuple[tuple[str, str, int, int], ...],
    code: str = "",
    require_passages: bool = False,
) -> Iterator[dict]:
    """Yields ``{"text": passage}`` for every file in ``sources`` (see ``_describe_file``).

    ``code`` (the readers' ``code_fingerprint``) is unused here: it is part of the cache fingerprint.
    With ``require_passages`` an empty result raises ``UserError`` (not for streaming, where a shard of the files
    may legitimately be empty).
    """
    count = 0
    for path, fmt, _size, _mtime in sources:
        for _line_no, text in _READERS[fmt](path):
            count += 1
            yield {"text": text}
    if require_passages and count == 0:
        names = ", ".join(repr(source[0]) for source in sources)
        raise UserError(f"the corpus is empty: every passage in {names} is blank; add passages with text")


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


def check_text_encoding(path: str | os.PathLike) -> None:
    """Refuse a UTF-16 or UTF-32 file (``wide_encoding``), naming the ``iconv`` call that converts it: decoded as
    UTF-8 it fails at the first byte or, without a byte-order mark, reads as text full of NUL characters."""
    with open(path, "rb") as handle:
        encoding = wide_encoding(handle.read(ENCODING_PROBE_BYTES))
    if encoding is not None:
        raise UserError(f"{path}: {encoding.upper()} text, not UTF-8; re-encode the file as UTF-8, e.g. iconv -f "
                        f"{encoding} -t utf-8 in > out")


def iter_decoded_lines(path: str) -> Iterator[tuple[int, str]]:
    """Yields ``(1-based line number, line without its end)``, raising ``UserError`` on bytes that are not UTF-8
    (``check_text_encoding`` first, so that UTF-16 and UTF-32 are named as such)."""
    check_text_encoding(path)
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"{path}:{line_no}: bytes that are not valid UTF-8 ({exc.reason} at column {exc.start + 1}); "
                    f"re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out"
                ) from None
            yield line_no, line.rstrip("\r\n")


def numbered_passages(path: str | os.PathLike, text_format: TextFormat = "auto") -> Iterator[tuple[int, str]]:
    """``(line, passage)`` for each passage of one ``.txt`` or ``.jsonl`` file, as ``read_corpus`` reads it; ``line``
    is the 1-based line the passage starts on (an id that blank passages, which are skipped, do not shift)."""
    fmt = _describe_file(Path(path), text_format)[1]
    if fmt != "jsonl":
        logger.info("%s: one passage per %s (text format %s)", Path(path).name,
                    "line" if fmt == "lines" else "block of lines between blank lines", text_format)
    return _READERS[fmt](str(path))


def _iter_text_lines(path: str) -> Iterator[tuple[int, str]]:
    """One passage per non-empty line (whitespace collapsed), with its line number."""
    for line_no, line in iter_decoded_lines(path):
        text = " ".join(line.split())
        if text:
            yield line_no, text


def _iter_text_blocks(path: str) -> Iterator[tuple[int, str]]:
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


def _iter_jsonl(path: str) -> Iterator[tuple[int, str]]:
    """One passage per JSON line, with its line number: ``text``, or ``title + " " + text`` when a title is given."""
    check_text_encoding(path)
    for where, record in iter_jsonl(path, error=UserError, example='{"text": "..."}'):
        _check_jsonl_record(record, where)
        title = record.get("title")
        text = f"{title} {record['text']}" if isinstance(title, str) and title.strip() else record["text"]
        text = " ".join(text.split())
        if text:
            yield int(where.rsplit(":", 1)[1]), text


_READERS = {"jsonl": _iter_jsonl, "lines": _iter_text_lines, "blocks": _iter_text_blocks}


def _check_jsonl_record(record: dict[str, Any], where: str) -> None:
    """Raises ``UserError`` unless ``record`` has a string ``"text"``; ``where`` is ``file:line``."""
    if "text" not in record:
        raise UserError(
            f'{where}: no "text" field (keys: {sorted(record)}); give every line a string "text" field '
            f'(and optionally a "title")'
        )
    if not isinstance(record["text"], str):
        found = json.dumps(record["text"])
        found = found if len(found) <= 40 else found[:37] + "..."
        raise UserError(
            f'{where}: the "text" field must be a string, found {found} (JSON {json_type(record["text"])}); '
            f'write the passage in quotes, e.g. {{"text": "..."}}'
        )


# ---------------------------------------------------------------------------------------------------------------------
# Built-in corpus
# ---------------------------------------------------------------------------------------------------------------------

BUILTIN_MODULES = (  # noqa: SIM905 (one readable string)
    "abc argparse ast base64 bdb binascii bisect builtins calendar cmd code codecs codeop colorsys compileall "
    "configparser contextlib contextvars copy copyreg csv dataclasses datetime decimal difflib dis doctest enum "
    "filecmp fileinput fnmatch fractions ftplib functools getopt getpass gettext glob graphlib gzip hashlib heapq "
    "hmac imaplib inspect io ipaddress itertools keyword linecache locale lzma mailbox math mimetypes modulefinder "
    "netrc numbers operator optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib pprint "
    "profile pstats py_compile pyclbr pydoc queue quopri random re reprlib runpy sched secrets "
    "selectors shelve shlex shutil signal smtplib socket socketserver ssl stat statistics string struct subprocess "
    "symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit token tokenize tomllib trace "
    "traceback tracemalloc types typing unicodedata uuid warnings weakref zipapp zipfile zipimport zlib"
).split()
BUILTIN_PACKAGES = (  # noqa: SIM905 (one readable string)
    "asyncio collections concurrent email html http importlib json logging multiprocessing sqlite3 unittest urllib "
    "wsgiref xml xmlrpc"
).split()
MIN_BUILTIN_CHARS = 150
CODE_CHARS = "()=[]{}<>_*`|\\:"
MAX_CODE_CHAR_SHARE = 0.03  # paragraphs with more of CODE_CHARS than this share of characters look like code


def builtin_corpus() -> datasets.Dataset:
    """A small corpus of real English prose that exists offline on every machine (the default of ``retromae pretrain``).

    Source: the docstrings of Python standard-library modules (``collections``, ``itertools``, ``functools``,
    ``json``, ``re``, ``pathlib``, ``datetime``, ``argparse``, ``logging``, ``unittest``, ``email``, ``http``,
    ``asyncio``, ``typing``, ``decimal``, ``csv``, ``sqlite3``, ``zipfile``, ``subprocess``, ``threading``, ...;
    packages with their submodules), of their public classes and functions and of those classes' public methods,
    followed by the help texts of ``pydoc_data.topics`` (the language reference that ``help()`` shows).

    Each text is split into paragraphs on blank lines, whitespace is collapsed, and a paragraph is kept when it has at
    least 150 characters, is mostly prose (no ``>>>`` prompt, no ``::=`` grammar, and at most 3% of its characters
    among ``()=[]{}<>_*`|\\:``) and was not seen before. The order is deterministic for a given Python version
    (about 2,000 passages on CPython 3.11). Docstrings stripped by ``python -OO`` leave it empty (``UserError``).

    Returns:
        A ``datasets.Dataset`` with one column ``"text"``.

    Raises:
        UserError: No passage could be collected (e.g. under ``python -OO``).
    """
    passages = _builtin_passages()
    if not passages:
        raise UserError(
            "the built-in corpus is empty: standard-library docstrings are unavailable (python -OO?); "
            "pass a corpus file or directory instead"
        )
    return datasets.Dataset.from_dict({"text": list(passages)})


@functools.lru_cache(maxsize=1)
def _builtin_passages() -> tuple[str, ...]:
    """The deduplicated prose paragraphs of the standard library's docstrings and help topics."""
    seen: set[str] = set()
    passages: list[str] = []
    for doc in _stdlib_texts():
        for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
            text = " ".join(paragraph.split())
            if len(text) >= MIN_BUILTIN_CHARS and _is_prose(text) and text not in seen:
                seen.add(text)
                passages.append(text)
    return tuple(passages)


def _is_prose(text: str) -> bool:
    """A simple heuristic: no interpreter prompt or grammar rule, and few code characters."""
    if ">>>" in text or "::=" in text or text.count("...") > 1:
        return False
    return sum(text.count(char) for char in CODE_CHARS) <= MAX_CODE_CHAR_SHARE * len(text)


def _stdlib_texts() -> Iterator[str]:
    """Docstrings of the standard-library modules (see ``builtin_corpus``), then ``pydoc_data`` help topics."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules and aliases warn on import / attribute access
        for module in _stdlib_modules():
            yield from _module_docstrings(module)
        try:
            from pydoc_data.topics import topics
        except ImportError:
            return
        for key in sorted(topics):
            yield topics[key]


def _stdlib_modules() -> Iterator[Any]:
    """Imports the modules of ``BUILTIN_MODULES`` and ``BUILTIN_PACKAGES`` (with submodules) in sorted order."""
    names = set(BUILTIN_MODULES)
    for package_name in BUILTIN_PACKAGES:
        package = _import_or_none(package_name)
        if package is None:
            continue
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if not _skip_submodule(info.name):
                names.add(info.name)
    for name in sorted(names):
        module = _import_or_none(name)
        if module is not None:
            yield module


def _skip_submodule(name: str) -> bool:
    """Test suites, ``__main__`` scripts and Windows-only modules are not part of the corpus."""
    return any(
        part in ("test", "tests", "__main__") or part.startswith(("test_", "windows_")) or part.endswith("_win32")
        for part in name.split(".")
    )


def _import_or_none(name: str) -> Any:
    """The imported module, or ``None`` when this Python build lacks it."""
    try:
        return importlib.import_module(name)
    except Exception:  # platform-specific or optional modules (ImportError, OSError, ...)
        return None


def _module_docstrings(module: Any) -> Iterator[str]:
    """The module docstring, its own public classes and functions, and their public methods."""
    if isinstance(module.__doc__, str):
        yield module.__doc__
    members = vars(module)
    for name in sorted(members):
        obj = members[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if isinstance(obj.__doc__, str):
            yield obj.__doc__
        if inspect.isclass(obj):
            for attr_name, attr in sorted(vars(obj).items()):
                doc = getattr(attr, "__doc__", None)
                if not attr_name.startswith("_") and _is_method(attr) and isinstance(doc, str):
                    yield doc


def _is_method(attr: Any) -> bool:
    return inspect.isroutine(attr) or isinstance(attr, (classmethod, staticmethod, property))


# ---------------------------------------------------------------------------------------------------------------------
# Tokenization
# ---------------------------------------------------------------------------------------------------------------------


def tokenize_corpus(
    dataset: datasets.Dataset | datasets.IterableDataset | Sequence[str],
    tokenizer: Any,
    *,
    max_seq_length: int,
    packing: bool = False,
    num_proc: int | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Tokenizes a ``"text"`` corpus once (cached for a ``Dataset``, lazy for an ``IterableDataset``).

    Truncation (``packing=False``): each passage becomes one sequence with the tokenizer's special tokens
    (``[CLS] ... [SEP]``), truncated to ``max_seq_length``. Packing (``packing=True``): passages are tokenized without
    special tokens, concatenated and cut into blocks of ``max_seq_length - num_special_tokens`` tokens, each wrapped
    with the special tokens; the last, shorter block of each ``map`` batch (1,000 passages) is kept when it has at
    least 8 tokens. Sequences without any ordinary token (empty passages) are dropped.

    A corpus whose text tokens are mostly ``[UNK]`` (more than ``MAX_UNK_SHARE``, measured on ``UNK_SAMPLE_ROWS``
    sequences) is refused: the tokenizer does not know its language or script, and ``[UNK]`` is never masked, so
    training would learn nothing; more than ``WARN_UNK_SHARE`` gets a warning.

    Args:
        dataset: A ``datasets.Dataset`` or ``datasets.IterableDataset`` with a ``"text"`` column, e.g. from
            :func:`read_corpus`, or a list of passage strings.
        tokenizer: A fast (``tokenizers``-backed) tokenizer; ``word_ids()`` gives the word boundaries.
        max_seq_length: Maximum tokens per sequence, special tokens included.
        packing: Concatenate passages into full-length blocks instead of truncating each one.
        num_proc: Processes for a ``Dataset`` with more than 10,000 rows (default ``min(4, os.cpu_count())``);
            ignored otherwise.

    Returns:
        The dataset with the columns ``"input_ids"`` (token ids, special tokens included, length
        ``<= max_seq_length``) and ``"word_starts"`` (1 where a token begins a new word, special tokens included;
        0 for the continuation pieces of a word). All input columns are removed.

    Raises:
        TypeError: ``dataset`` is none of the accepted types, or ``max_seq_length`` is not an integer.
        ValueError: The tokenizer is not fast, or ``max_seq_length`` leaves no room for an ordinary token.
        UserError: No sequence is left (every passage is empty; not checked for an ``IterableDataset``), or the
            text is mostly ``[UNK]``. The message names the corpus (``info.dataset_name``, see :func:`read_corpus`).
    """
    dataset = _as_dataset(dataset)
    if isinstance(max_seq_length, bool) or not isinstance(max_seq_length, numbers.Integral):
        raise TypeError(f"tokenize_corpus: max_seq_length={max_seq_length!r} is not a whole number of tokens; pass an "
                        "int, e.g. max_seq_length=256")
    max_seq_length = int(max_seq_length)  # e.g. a numpy integer
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            f"tokenize_corpus needs a fast tokenizer (word_ids()), got {type(tokenizer).__name__}; "
            f"load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )
    prefix, suffix = special_template(tokenizer)
    if max_seq_length <= len(prefix) + len(suffix):
        raise ValueError(
            f"max_seq_length={max_seq_length} leaves no room for text after {len(prefix) + len(suffix)} special tokens"
        )
    fn_kwargs = {
        "tokenizer": tokenizer,
        "max_seq_length": max_seq_length,
        "prefix": prefix,
        "suffix": suffix,
        "packing": packing,
        "code": _tokenizer_fingerprint(),  # unused by the function: invalidates the cache when this code changes
    }
    features = datasets.Features(
        {
            "input_ids": datasets.Sequence(datasets.Value("int32")),
            "word_starts": datasets.Sequence(datasets.Value("int8")),
        }
    )
    if dataset.column_names is not None and "text" not in dataset.column_names:
        raise UserError(
            f"the dataset has no 'text' column (columns: {dataset.column_names}); "
            f"read it with read_corpus or rename the passage column to 'text'"
        )
    # read_corpus names its datasets; another one may carry only its builder's name ("generator", "json")
    source = dataset.info.dataset_name if dataset.info.dataset_name != dataset.info.builder_name else None
    source = source or "the corpus"
    if isinstance(dataset, datasets.IterableDataset):
        tokenized = dataset.map(
            _tokenize_batch, batched=True, fn_kwargs=fn_kwargs, remove_columns=dataset.column_names, features=features
        ).select_columns(["input_ids", "word_starts"])
        _check_unknown_tokens(tokenized, tokenizer, source)
        return tokenized
    tokenized = dataset.map(
        _tokenize_batch,
        batched=True,
        fn_kwargs=fn_kwargs,
        remove_columns=dataset.column_names,
        features=features,
        num_proc=_effective_num_proc(num_proc, len(dataset)),
        desc="Tokenizing (packing)" if packing else "Tokenizing",
    )
    if len(tokenized) == 0:
        raise UserError(
            f"no sequence left after tokenizing {len(dataset)} passages of {source}: every passage is empty (or holds "
            f"only characters the tokenizer drops); check that the corpus 'text' column holds text"
        )
    logger.info("Tokenized %d passages into %d sequences (packing=%s)", len(dataset), len(tokenized), packing)
    _check_unknown_tokens(tokenized, tokenizer, source)
    return tokenized


def _as_dataset(corpus: Any) -> datasets.Dataset | datasets.IterableDataset:
    """``corpus`` as a dataset: a list (or tuple) of passage strings becomes one with a ``"text"`` column.

    Raises:
        TypeError: anything else, naming the accepted types.
    """
    if isinstance(corpus, datasets.Dataset | datasets.IterableDataset):
        return corpus
    if isinstance(corpus, list | tuple):
        other = next((item for item in corpus if not isinstance(item, str)), None)
        if other is None:
            return datasets.Dataset.from_dict({"text": list(corpus)},
                                              features=datasets.Features({"text": datasets.Value("string")}))
        got = f"a {type(corpus).__name__} holding {type(other).__name__}"
    else:
        got = type(corpus).__name__
    raise TypeError(f"tokenize_corpus takes a datasets.Dataset, datasets.IterableDataset or a list of strings (one "
                    f"passage each; for files, read_corpus(path)), got {got}")


def unknown_token_share(tokenizer: Any, rows: Iterable[Sequence[int]]) -> float | None:
    """The share of ``[UNK]`` among the text tokens (all but the other special tokens) of ``rows`` of token ids;
    None when the tokenizer has no unknown token (byte-level BPE) or the rows hold no text token."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return None
    counts = Counter(token for ids in rows for token in ids)
    others = set(tokenizer.all_special_ids) - {unk}
    text = sum(count for token, count in counts.items() if token not in others)
    return counts[unk] / text if text else None


def _check_unknown_tokens(
    tokenized: datasets.Dataset | datasets.IterableDataset, tokenizer: Any, source: str
) -> None:
    """Refuse a corpus mostly ``[UNK]`` for ``tokenizer`` (``MAX_UNK_SHARE``), warn above ``WARN_UNK_SHARE``."""
    if isinstance(tokenized, datasets.IterableDataset):
        rows = [row["input_ids"] for row in itertools.islice(tokenized, UNK_SAMPLE_ROWS)]
        sample = f"the first {len(rows)} sequences of the stream"
    else:
        total = len(tokenized)
        spread = [i * total // UNK_SAMPLE_ROWS for i in range(UNK_SAMPLE_ROWS)] if total > UNK_SAMPLE_ROWS else None
        rows = tokenized.select(spread)["input_ids"] if spread else tokenized["input_ids"]
        sample = f"a sample of {len(rows)} of {total} sequences" if spread else f"all {total} sequences"
    share = unknown_token_share(tokenizer, rows)
    if share is None or share <= WARN_UNK_SHARE:
        return
    message = (f"{share:.0%} of the text tokens of {source} are [UNK] ({sample}): the tokenizer "
               f"{tokenizer.name_or_path} does not know the corpus's language or script")
    if share > MAX_UNK_SHARE:
        raise UserError(f"{message}; [UNK] is never masked, so training would learn nothing: use a model and "
                        "tokenizer made for this language (--model, --tokenizer), or check that this is the corpus "
                        "meant")
    logger.warning("%s; training learns nothing from [UNK]", message)


@functools.lru_cache(maxsize=1)
def _tokenizer_fingerprint() -> str:
    return code_fingerprint(_tokenize_batch, _packed_blocks, word_start_flags)


def _effective_num_proc(num_proc: int | None, num_rows: int) -> int | None:
    """Processes for ``Dataset.map``: only for more than ``NUM_PROC_MIN_ROWS`` rows, default ``min(4, cpus)``."""
    if num_rows <= NUM_PROC_MIN_ROWS:
        return None
    chosen = num_proc if num_proc is not None else min(4, os.cpu_count() or 1)
    return chosen if chosen > 1 else None


def special_template(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special ids the tokenizer puts before and after a single sequence, e.g. ``([CLS], [SEP])``.

    transformers 5 fast tokenizers have no ``build_inputs_with_special_tokens``; the post-processor's template is read
    off a probe encoding instead (specials = positions whose ``word_ids()`` is ``None``).
    """
    probe = tokenizer("hello world", add_special_tokens=True, return_attention_mask=False, return_token_type_ids=False)
    ids, word_ids = probe["input_ids"], probe.word_ids()
    ordinary = [i for i, word in enumerate(word_ids) if word is not None]
    if not ordinary:
        raise ValueError(f"{type(tokenizer).__name__} produced no ordinary token for 'hello world'")
    prefix, suffix = ids[: ordinary[0]], ids[ordinary[-1] + 1 :]
    expected = tokenizer.num_special_tokens_to_add(pair=False)
    if len(prefix) + len(suffix) != expected:
        raise ValueError(
            f"{type(tokenizer).__name__} adds {expected} special tokens but only {len(prefix) + len(suffix)} "
            f"surround the text; packing supports tokenizers whose template is prefix + text + suffix"
        )
    return prefix, suffix


def word_start_flags(word_ids: list[int | None]) -> list[int]:
    """1 where a token begins a word (special tokens, ``None``, included), 0 for a word's continuation pieces."""
    starts, previous = [], None
    for word in word_ids:
        starts.append(1 if word is None or word != previous else 0)
        previous = word
    return starts


def _tokenize_batch(
    batch: dict[str, list], tokenizer: Any, max_seq_length: int, prefix: list[int], suffix: list[int], packing: bool,
    code: str = "",
) -> dict[str, list]:
    """Without packing, one truncated ``[CLS] ... [SEP]`` sequence per non-empty passage; with packing, the batch's
    passages concatenated and cut into ``prefix + block + suffix`` sequences."""
    texts = [text or "" for text in batch["text"]]
    options = {"add_special_tokens": False, "verbose": False} if packing else {"truncation": True, "max_length": max_seq_length}
    encoding = tokenizer(texts, return_attention_mask=False, return_token_type_ids=False, **options)
    rows = [(ids, encoding.word_ids(row)) for row, ids in enumerate(encoding["input_ids"])]
    if packing:
        return _packed_blocks(rows, max_seq_length - len(prefix) - len(suffix), prefix, suffix)
    kept = [(ids, word_start_flags(word_ids)) for ids, word_ids in rows if any(w is not None for w in word_ids)]
    return {"input_ids": [ids for ids, _ in kept], "word_starts": [starts for _, starts in kept]}


def _packed_blocks(
    rows: list[tuple[list[int], list[int | None]]], block: int, prefix: list[int], suffix: list[int]
) -> dict[str, list]:
    """The rows' ids, concatenated, in blocks of ``block`` ids between ``prefix`` and ``suffix``; a last block
    shorter than ``min(block, MIN_PACKED_BLOCK)`` is dropped."""
    flat_ids = [token for ids, _ in rows for token in ids]
    flat_starts = [start for _, word_ids in rows for start in word_start_flags(word_ids)]
    input_ids, word_starts = [], []
    for start in range(0, len(flat_ids), block):
        ids, starts = flat_ids[start : start + block], flat_starts[start : start + block]
        if len(ids) < min(block, MIN_PACKED_BLOCK):
            break
        starts[0] = 1  # a word cut at the block edge starts a new unit
        input_ids.append(prefix + ids + suffix)
        word_starts.append([1] * len(prefix) + starts + [1] * len(suffix))
    return {"input_ids": input_ids, "word_starts": word_starts}


# ---------------------------------------------------------------------------------------------------------------------
# Collation and masking
# ---------------------------------------------------------------------------------------------------------------------


UNMASKED_KEY = "word_starts"  # in a padded batch that still awaits masking (models take no such input)


def masking_generator(seed: int, process_index: int, stream: str = "train") -> torch.Generator:
    """A CPU generator for the masks of one process, distinct for every ``(seed, process_index, stream)``.

    Hashing the three (instead of ``seed + process_index``) keeps seed 1 on rank 0 apart from seed 0 on rank 1.
    """
    digest = hashlib.sha256(f"retromae-masking/{stream}/{seed}/{process_index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)  # < 2**63


@dataclass
class PretrainingCollator:
    """Pads tokenized rows and applies the encoder's masked-language-model corruption, vectorized in torch.

    Masking (per row, on the padded ``(B, L)`` tensors, no Python loop over rows or tokens):

    - Special tokens (``tokenizer.all_special_ids``) and padding are never masked.
    - The number of masked tokens is exactly ``n_mask = max(1, round(mask_ratio * n_ordinary))``, ``n_ordinary``
      being the row's non-special, non-padding tokens.
    - Whole-word units: a word starts where ``word_starts`` is 1 (and at every special token and the token after
      it). Words get a random key and are taken in key order while the cumulative token count stays
      ``<= n_mask``; the remaining budget is then filled with single-token words not yet chosen, in the same random
      order. The count therefore equals ``n_mask`` whenever enough single-token words exist; a row made only of
      long multi-piece words may get fewer. ``whole_word_mask=False`` makes every token its own word (always exact).
    - Of the masked positions, a share ``replace_with_mask`` becomes ``tokenizer.mask_token_id``, a share
      ``replace_with_random`` a uniformly random non-special id in ``[0, len(tokenizer))``, the rest stays unchanged.

    The work is split in two halves: ``pad`` (deterministic: padding and word starts) and ``mask_batch`` (every
    random draw). ``collator(features)`` is ``mask_batch(pad(features), generator)``. ``RetroMAETrainer`` runs only
    ``pad`` in the DataLoader workers and ``mask_batch`` in the training process, with its own generator per process
    (checkpointed), so masks never repeat across workers or epochs and a resumed run continues exactly.
    Standalone calls draw from ``generator`` when given, else from torch's global RNG.
    The original ids are ``torch.where(encoder_labels != -100, encoder_labels, input_ids)``.

    Args:
        tokenizer: The tokenizer that produced the ids (needs ``pad_token_id`` and ``mask_token_id``).
        mask_ratio: Share of ordinary tokens to mask, in (0, 1).
        whole_word_mask: Mask whole words (all their pieces) instead of single tokens.
        pad_to_multiple_of: Pad the length to a multiple of this (8 suits tensor cores); ``None`` pads to the longest.
        max_length: Never pad beyond this many positions (the run's ``max_seq_length``, which the model's position
            table may end at); ``None``: no cap.
        replace_with_mask: Share of masked positions replaced by the mask token, in [0, 1].
        replace_with_random: Share of masked positions replaced by a random token, in [0, 1]; with
            ``replace_with_mask`` at most 1.
        generator: Optional ``torch.Generator`` for the random draws of standalone calls (``RetroMAETrainer`` uses
            its own).

    Features: dicts with ``"input_ids"`` (list or tensor) and optionally ``"word_starts"`` (default: every token
    starts a word); other keys are ignored.

    Returns (``__call__``): a dict of ``torch.long`` tensors of shape ``(batch_size, padded_length)``:
    ``input_ids`` (corrupted encoder input), ``attention_mask``, ``encoder_labels`` (original id at masked
    positions, -100 elsewhere) and ``decoder_labels`` (original id at every real non-special position, -100 at
    special tokens and padding).
    """

    tokenizer: Any
    mask_ratio: float = 0.3
    whole_word_mask: bool = True
    pad_to_multiple_of: int | None = 8
    replace_with_mask: float = 0.8
    replace_with_random: float = 0.1
    generator: torch.Generator | None = None
    max_length: int | None = None
    _special_ids: torch.Tensor = field(init=False, repr=False, compare=False)
    _random_ids: torch.Tensor = field(init=False, repr=False, compare=False)
    _id_tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"mask_ratio={self.mask_ratio} is not in the allowed range (0, 1)")
        for name in ("replace_with_mask", "replace_with_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} is not in the allowed range [0, 1]")
        if self.replace_with_mask + self.replace_with_random > 1.0:
            raise ValueError(
                f"replace_with_mask + replace_with_random = {self.replace_with_mask + self.replace_with_random} "
                f"exceeds 1; lower one of them"
            )
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of={self.pad_to_multiple_of} must be a positive integer or None")
        for name in ("pad_token_id", "mask_token_id"):
            if getattr(self.tokenizer, name, None) is None:
                raise ValueError(f"the tokenizer has no {name}; set it, e.g. tokenizer.add_special_tokens(...)")
        self._special_ids = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long)
        vocab = torch.arange(len(self.tokenizer))
        self._random_ids = vocab[~torch.isin(vocab, self._special_ids)]

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.mask_batch(self.pad(features), self.generator)

    def pad(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """The deterministic half: ``input_ids`` (uncorrupted), ``attention_mask`` and ``word_starts``, ``(B, L)`` long.

        The presence of ``word_starts`` (``UNMASKED_KEY``) marks a batch that still needs ``mask_batch``.
        """
        input_ids, word_starts, attention_mask = self._pad(features)
        return {"input_ids": input_ids, "attention_mask": attention_mask.long(), UNMASKED_KEY: word_starts}

    def mask_batch(self, batch: dict[str, torch.Tensor], generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """The random half: the model inputs of a batch from ``pad``, drawn from ``generator`` (global RNG if None).

        The random numbers are drawn on the CPU and everything else runs on the batch's device without waiting for
        it (integer and comparison ops, a stable sort), so a CPU and a GPU run with the same generator state get the
        same masks and the training loop does not stall.
        """
        input_ids = batch["input_ids"]
        B, L = input_ids.shape
        word_keys = torch.rand(B, L, generator=generator)  # random order of the words
        share_draws = torch.rand(B, L, generator=generator)  # 80/10/10
        replacements = torch.randint(len(self._random_ids), (B, L), generator=generator)  # used where "random"
        device = input_ids.device if input_ids.device.type != "mps" else torch.device("cpu")  # MPS has no float64
        # host -> device copies of fresh CPU tensors need no wait; the batch itself is already there (but for MPS)
        draws = (word_keys, share_draws, replacements)
        word_keys, share_draws, replacements = (draw.to(device, non_blocking=True) for draw in draws)
        keys = ("input_ids", "attention_mask", UNMASKED_KEY)
        input_ids, attention_mask, word_starts = (batch[key].to(device) for key in keys)
        if device not in self._id_tables:  # copied to an accelerator once, not every batch
            self._id_tables[device] = (self._special_ids.to(device), self._random_ids.to(device))
        special_ids, random_ids = self._id_tables[device]
        attention_mask = attention_mask.bool()
        ordinary = attention_mask & ~torch.isin(input_ids, special_ids)  # (B, L)
        masked = self._choose_masked(ordinary, word_starts, word_keys)
        out = {
            "input_ids": self._corrupt(input_ids, masked, share_draws, random_ids[replacements]),
            "attention_mask": attention_mask.long(),
            "encoder_labels": torch.where(masked, input_ids, -100),
            "decoder_labels": torch.where(ordinary, input_ids, -100),
        }
        return {key: value.to(batch["input_ids"].device) for key, value in out.items()}

    def _pad(self, features: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-pads ids (pad id) and word starts (1): ``(B, L)`` long, long, and a bool attention mask."""
        if not features:
            raise ValueError("PretrainingCollator got an empty batch")
        ids = [torch.as_tensor(f["input_ids"], dtype=torch.long) for f in features]
        starts = [
            torch.as_tensor(f["word_starts"], dtype=torch.long)
            if f.get("word_starts") is not None
            else torch.ones_like(t)
            for f, t in zip(features, ids, strict=True)
        ]
        lengths = torch.tensor([len(t) for t in ids])
        if any(len(s) != len(t) for s, t in zip(starts, ids, strict=True)):
            raise ValueError("every feature's 'word_starts' must have the length of its 'input_ids'")
        length = longest = int(lengths.max())
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            if self.max_length is not None:  # e.g. L = 300 = the position limit: 304 would run past the table
                length = max(min(length, self.max_length), longest)
        input_ids = torch.full((len(ids), length), self.tokenizer.pad_token_id, dtype=torch.long)
        word_starts = torch.ones((len(ids), length), dtype=torch.long)
        attention_mask = torch.arange(length) < lengths[:, None]  # (B, L)
        if length:
            input_ids[attention_mask] = torch.cat(ids)
            word_starts[attention_mask] = torch.cat(starts)
        return input_ids, word_starts, attention_mask

    def _choose_masked(self, ordinary: torch.Tensor, word_starts: torch.Tensor, word_keys: torch.Tensor) -> torch.Tensor:
        """Exactly ``n_mask`` ordinary tokens per row, in whole-word units (see the class docstring): ``(B, L)`` bool.

        ``word_keys``: ``(B, L)`` uniform draws; word w of a row is taken in the order of ``word_keys[:, w]``.
        """
        B, L = ordinary.shape
        device = ordinary.device
        n_ordinary = ordinary.sum(dim=1)  # (B,)
        # float64 so that the rounding matches Python's round(mask_ratio * n) (float32 differs at some .5 ties)
        n_mask = torch.clamp(torch.round(n_ordinary.double() * self.mask_ratio).long(), min=1) * (n_ordinary > 0)
        if self.whole_word_mask:
            # A word also starts at every special/pad token and at the token right after one.
            outside = ~ordinary
            after_outside = torch.nn.functional.pad(outside[:, :-1], (1, 0), value=True)
            starts = (word_starts != 0) | outside | after_outside
        else:
            starts = torch.ones_like(ordinary)
        word_index = torch.cumsum(starts.long(), dim=1) - 1  # (B, L), word of each token, 0 .. L-1
        word_length = torch.zeros((B, L), dtype=torch.long, device=device).scatter_add_(1, word_index, ordinary.long())
        keys = word_keys.masked_fill(word_length == 0, 2.0)  # (B, L words); no-token words sort last
        order = torch.sort(keys, dim=1, stable=True).indices  # (B, L): words in random order, the same on every device
        sorted_length = word_length.gather(1, order)
        budget = n_mask[:, None]  # (B, 1)
        chosen = (torch.cumsum(sorted_length, dim=1) <= budget) & (sorted_length > 0)
        # Fill what is left of the budget with unchosen single-token words, in the same random order.
        left = budget - (sorted_length * chosen).sum(dim=1, keepdim=True)
        single = (sorted_length == 1) & ~chosen
        chosen |= single & (torch.cumsum(single.long(), dim=1) <= left)
        chosen_words = torch.zeros((B, L), dtype=torch.bool, device=device).scatter_(1, order, chosen)  # word order
        return chosen_words.gather(1, word_index) & ordinary

    def _corrupt(
        self, input_ids: torch.Tensor, masked: torch.Tensor, share_draws: torch.Tensor, replacements: torch.Tensor
    ) -> torch.Tensor:
        """80/10/10: mask token, random non-special token, unchanged (shares from the fields).

        ``share_draws``: ``(B, L)`` uniform draws; ``replacements``: ``(B, L)`` random non-special ids, used only where
        a random token goes (drawn for every position so that no host sync counts those first).
        """
        to_mask = masked & (share_draws < self.replace_with_mask)
        random_share = self.replace_with_mask + self.replace_with_random
        to_random = masked & (share_draws >= self.replace_with_mask) & (share_draws < random_share)
        corrupted = input_ids.masked_fill(to_mask, self.tokenizer.mask_token_id)
        return torch.where(to_random, replacements, corrupted)


@dataclass(frozen=True)
class DataInputs:
    """What a method's training-data builder reads (`methods.Method.training_data`): plain values of the run.

    Args:
        corpus: the pre-training text (see `read_corpus`; None: the built-in corpus).
        text_format: how a .txt corpus splits into passages.
        max_seq_length: tokens per sequence, special tokens included.
        packing: concatenate passages into full-length blocks.
        streaming: stream the corpus instead of reading it into memory.
        pairs: a JSONL file of {"anchor", "positive"} pairs, for a method with an in-batch contrastive loss.
        global_batch_size: sequences per optimizer micro-step over all processes (in-batch negatives need >= 2).
        contrastive_anchor: the continued-pre-training recipe adds an in-batch contrastive loss with span positives
            (`recipe.RecipeArguments.contrastive_anchor_weight`).
    """

    corpus: str | None = None
    text_format: TextFormat = "auto"
    max_seq_length: int = 256
    packing: bool = False
    streaming: bool = False
    pairs: str | None = None
    global_batch_size: int = 8
    contrastive_anchor: bool = False


@dataclass(frozen=True)
class TrainingData:
    """A method's training data: the tokenized dataset and the collator that pads and masks its batches.

    Args:
        dataset: tokenized rows (`input_ids`, `word_starts`, and `positive_*` for pairs).
        collator: a `PretrainingCollator` (or subclass); the trainer draws its masks.
        drop_last: drop the last incomplete batch of an epoch (a batch of one pair has no in-batch negative).
        corpus_name: the name of the text the run read when it is not the corpus (e.g. the pair file), for the
            model card.
    """

    dataset: datasets.Dataset | datasets.IterableDataset
    collator: PretrainingCollator
    drop_last: bool = False
    corpus_name: str | None = None
