"""Reading a pre-training corpus: text files (lines, blank-line blocks, JSONL), folders of them, saved datasets and
Hub datasets, with errors that name the file and line."""

from __future__ import annotations

import bz2
import codecs
import functools
import gzip
import hashlib
import importlib
import importlib.util
import inspect
import json
import logging
import lzma
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasets.exceptions import DatasetGenerationError

from ..inputs.errors import UserError
from ..inputs.io import iter_jsonl, json_type
from .builtin import builtin_corpus

logger = logging.getLogger(__name__)

TextFormat = Literal["auto", "lines", "blocks"]
TEXT_FORMATS = ("auto", "lines", "blocks")
CORPUS_SUFFIXES = (".txt", ".jsonl", ".parquet")
# Compressed .txt/.jsonl files (``name.jsonl.gz``): decompressed while read. ``.zst`` needs the zstandard package.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")


# Suffixes that mark a source as a file path (never a Hub dataset name) when it does not exist.
PATH_LIKE_SUFFIXES = (*CORPUS_SUFFIXES, *COMPRESSED_SUFFIXES, ".json", ".csv", ".tsv", ".arrow")


def read_corpus(
    source: str | os.PathLike | None,
    *,
    text_format: TextFormat = "auto",
    streaming: bool = False,
    text_column: str = "text",
    config: str | None = None,
    split: str | None = None,
    revision: str | None = None,
) -> datasets.Dataset | datasets.IterableDataset:
    """Reads a pre-training corpus into a dataset with one column ``"text"`` (one passage per row).

    Accepted sources, tried in this order:

    - ``None``: the embedded corpus of :func:`builtin_corpus`.
    - A ``.txt`` file. ``text_format="lines"``: one passage per non-empty line; ``"blocks"``: passages separated by
      empty lines, the lines of a block joined with a space (a line of only spaces does not end a block);
      ``"auto"``: blocks if the file has an empty line between two non-empty lines, else lines.
    - A ``.jsonl`` file: one JSON object per line with a string ``"text"`` field (``text_column``); a non-empty
      string ``"title"`` is prepended (``title + " " + text``, the BEIR corpus convention). Blank lines are skipped.
    - A ``.parquet`` file: its ``text_column`` column (strings, no nulls), a string ``"title"`` column prepended as
      for ``.jsonl``.
    - A compressed ``.txt`` or ``.jsonl`` file (``.gz``, ``.bz2``, ``.xz``; ``.zst`` with the ``zstandard``
      package), read as the file it holds.
    - A BEIR folder (``corpus.jsonl`` beside ``queries.jsonl`` or ``qrels/``): its ``corpus.jsonl``.
    - A directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` whose ``split``,
      by default ``"train"`` or its only split, is used) with a ``text_column`` column.
    - Any other directory: every ``.txt``, ``.jsonl`` and ``.parquet`` file (compressed too) below it (recursively, through symbolic links to
      folders too; hidden files skipped), in sorted path order; a file of another type there is refused (it would be
      left out silently), and so is a link that loops or reaches a folder a second time.
    - Otherwise a Hub dataset name, loaded with ``datasets.load_dataset(name, config, split=split or "train",
      revision=revision)``; its ``text_column`` column is the text (no title added). A source that looks
      like a path (absolute, starting with ``.`` or ``~``, or ending in a file suffix) and does not exist is reported
      as missing instead.

    Files are read with ``datasets``' own ``json``, ``text`` and ``parquet`` builders; where one fails or could
    read a file otherwise than described here (a line that is not JSON, a missing field, a lone carriage return),
    the file is read again line by line, which names the file and line of the problem.

    Passages that are empty after stripping whitespace are skipped. The dataset's ``info.dataset_name`` is the source
    as given (the messages of later steps, e.g. :func:`tokenize_corpus`, name it).

    Args:
        source: A path, a Hub dataset name, or ``None`` for the built-in corpus.
        text_format: How ``.txt`` files split into passages (``"auto"``, ``"lines"`` or ``"blocks"``).
        text_column: The field or column that holds the passage text (``.jsonl``, ``.parquet``, datasets).
        config: The Hub dataset's configuration (subset), for a dataset that has several.
        split: The split of a Hub dataset (default ``"train"``) or of a saved ``DatasetDict``.
        revision: The Hub dataset's revision (branch, tag or commit).
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
    hub = HubOptions(config, split, revision)
    corpus = _read_source(source, text_format, streaming, text_column, hub)
    corpus.info.dataset_name = "the built-in corpus" if source is None else str(source)
    return corpus


@dataclass(frozen=True)
class HubOptions:
    """Where in a Hub dataset the corpus is: ``load_dataset(name, config, split=split, revision=revision)``."""

    config: str | None = None
    split: str | None = None
    revision: str | None = None


def _refuse_hub_options(source: str | None, hub: HubOptions, split_allowed: bool = False) -> None:
    """A local corpus has no configuration or revision (nor a split, unless it is a saved DatasetDict)."""
    given = [flag for flag, value in (("--corpus-config", hub.config), ("--corpus-revision", hub.revision),
                                      ("--corpus-split", None if split_allowed else hub.split)) if value is not None]
    if given:
        what = "the built-in corpus (no --corpus)" if source is None else (
            f"corpus {source!r}, a local {'folder' if Path(source).expanduser().is_dir() else 'file'}")
        raise UserError(f"{' and '.join(given)} apply to a Hub dataset, not to {what}; drop {' and '.join(given)}")


def _read_source(
    source: str | os.PathLike | None, text_format: TextFormat, streaming: bool, text_column: str = "text",
    hub: HubOptions = HubOptions(),
) -> datasets.Dataset | datasets.IterableDataset:
    """``read_corpus`` without the naming."""
    if source is None:
        _refuse_hub_options(None, hub)
        corpus = builtin_corpus()
        return corpus.to_iterable_dataset() if streaming else corpus
    path = Path(source).expanduser()
    if path.is_file():
        _refuse_hub_options(str(source), hub)
        return _read_files([path], text_format, streaming, text_column)
    if path.is_dir():
        return _read_directory(path, text_format, streaming, text_column, hub)
    if _looks_like_path(str(source)):
        raise UserError(f"corpus path {str(source)!r} does not exist; check the path (relative to {Path.cwd()})")
    return _load_hub_dataset(str(source), streaming, text_column, hub)


def _looks_like_path(source: str) -> bool:
    """Whether a non-existing source is meant as a local path rather than a Hub dataset name ``[owner/]name``."""
    return (
        os.path.isabs(source)
        or source.startswith((".", "~"))
        or source.count("/") > 1
        or source.lower().endswith(PATH_LIKE_SUFFIXES)
    )


def _read_directory(
    path: Path, text_format: TextFormat, streaming: bool, text_column: str = "text", hub: HubOptions = HubOptions()
) -> datasets.Dataset | datasets.IterableDataset:
    """Reads a BEIR folder, a ``save_to_disk`` folder, or a folder of ``.txt``/``.jsonl`` files (and nothing else).
    A ``corpus.jsonl`` without BEIR's queries or qrels beside it is one file of a folder corpus: reading it alone
    would leave out the others."""
    saved = any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json"))
    _refuse_hub_options(str(path), hub, split_allowed=saved)
    if (path / "corpus.jsonl").is_file() and ((path / "queries.jsonl").is_file() or (path / "qrels").is_dir()):
        return _read_files([path / "corpus.jsonl"], text_format, streaming, text_column)
    if saved:
        return _load_saved_dataset(path, streaming, text_column, hub.split)
    found = _files_below(path)
    files = [p for p in found if _is_corpus_file(p)]
    others = [p for p in found if not _is_corpus_file(p)]
    if not files:
        holds = f" (it holds {_some_names(others, path)})" if others else ""
        raise UserError(
            f"directory {str(path)!r} holds no corpus{holds}: expected corpus.jsonl (BEIR), a datasets save_to_disk "
            f"folder, or .txt/.jsonl/.parquet files; point the source at one of these"
        )
    if others:
        raise UserError(
            f"directory {str(path)!r} holds files that are not a corpus format: {_some_names(others, path)}; only .txt "
            f"and .jsonl files are read: move the others out of the folder (or convert them; .parquet files and "
            f".txt/.jsonl files compressed as {'/'.join(COMPRESSED_SUFFIXES)} are read too)"
        )
    logger.info("Reading %d corpus file(s) in %s: %s", len(files), path, _some_names(files, path))
    return _read_files(files, text_format, streaming, text_column)


def _split_name(path: Path) -> tuple[str, str]:
    """``(format suffix, compression suffix)`` of a file name, e.g. ``(".jsonl", ".gz")``; ``""`` for none."""
    stem, compression = os.path.splitext(path.name)
    if compression not in COMPRESSED_SUFFIXES:
        return compression, ""
    return os.path.splitext(stem)[1], compression


def _is_corpus_file(path: Path) -> bool:
    suffix, compression = _split_name(path)
    return suffix in (".txt", ".jsonl") or (suffix == ".parquet" and not compression)


def _open_binary(path: str | os.PathLike):
    """The file opened for reading bytes, decompressed when its name ends in a compression suffix."""
    compression = _split_name(Path(path))[1]
    if compression == ".zst":
        if importlib.util.find_spec("zstandard") is None:
            raise UserError(f"{path}: a zstandard-compressed file, and the zstandard package is not installed; "
                            "pip install zstandard, or decompress it (zstd -d)")
        return importlib.import_module("zstandard").open(path, "rb")  # an optional dependency
    return {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(compression, open)(path, "rb")


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


def _load_saved_dataset(
    path: Path, streaming: bool, text_column: str = "text", split: str | None = None
) -> datasets.Dataset | datasets.IterableDataset:
    """Loads a ``save_to_disk`` folder (``DatasetDict``: ``split``, else its ``"train"`` split or its only split)."""
    loaded = datasets.load_from_disk(str(path))
    if split is not None and not isinstance(loaded, datasets.DatasetDict):
        raise UserError(f"--corpus-split {split}: {str(path)!r} is a saved Dataset, not a DatasetDict with splits; "
                        "drop --corpus-split")
    if isinstance(loaded, datasets.DatasetDict):
        if split is not None:
            if split not in loaded:
                raise UserError(f"{str(path)!r} has no split {split!r} (splits: {sorted(loaded)}); pick one with "
                                "--corpus-split")
            loaded = loaded[split]
        elif "train" in loaded:
            loaded = loaded["train"]
        elif len(loaded) == 1:
            loaded = next(iter(loaded.values()))
        else:
            raise UserError(
                f"{str(path)!r} is a DatasetDict without a 'train' split (splits: {sorted(loaded)}); "
                f"save the split to use with dataset_dict['<split>'].save_to_disk(...)"
            )
    corpus = _select_text_column(loaded, str(path), text_column)
    if len(corpus) == 0:
        raise UserError(f"{str(path)!r} holds no rows: the corpus is empty; save a dataset with passages in 'text'")
    return corpus.to_iterable_dataset() if streaming else corpus


_CONFIGS_IN_ERROR = re.compile(r"available configs: (\[[^\]]*\])")
_SPLITS_IN_ERROR = re.compile(r"Unknown split \"([^\"]*)\"\. Should be one of (\[[^\]]*\])")


def _load_hub_dataset(
    name: str, streaming: bool, text_column: str = "text", hub: HubOptions = HubOptions()
) -> datasets.Dataset | datasets.IterableDataset:
    """Loads ``hub.split`` (default ``"train"``) of a Hub dataset; every failure becomes a one-line ``UserError``."""
    split = hub.split or "train"
    try:
        loaded = datasets.load_dataset(name, hub.config, split=split, revision=hub.revision, streaming=streaming)
    except Exception as exc:
        found = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        configs = _CONFIGS_IN_ERROR.search(str(exc))
        if configs is not None:
            raise UserError(f"corpus {name!r} has several configurations: {configs.group(1)}; pick one with "
                            f"--corpus-config (read_corpus(..., config=...))") from exc
        splits = _SPLITS_IN_ERROR.search(str(exc))
        if splits is not None:
            raise UserError(f"corpus {name!r} has no split {splits.group(1)!r} (splits: {splits.group(2)}); pick "
                            f"one with --corpus-split") from exc
        raise UserError(
            f"corpus {name!r} was not found locally (no such file or directory) or on the Hub "
            f"({found}); check the path, or the dataset name, --corpus-config, --corpus-revision and your "
            f"connection (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)"
        ) from exc
    return _select_text_column(loaded, name, text_column)


def _select_text_column(
    dataset: datasets.Dataset | datasets.IterableDataset, where: str, column: str = "text"
) -> datasets.Dataset | datasets.IterableDataset:
    """Keeps only the ``column`` column, renamed ``"text"``, or raises ``UserError`` when there is none or it does
    not hold strings (a list of two strings would be tokenized as a sentence pair)."""
    columns = dataset.column_names
    if columns is None:  # a streaming dataset with unknown features: checked when iterating
        selected = dataset.select_columns([column])
        return selected.rename_column(column, "text") if column != "text" else selected
    if column not in columns:
        hint = ("rename the passage column to 'text', e.g. dataset.rename_column('<column>', 'text'), or name it "
                "with --text-column" if column == "text" else "name the passage column with --text-column")
        raise UserError(f"dataset {where!r} has no {column!r} column (columns: {columns}); {hint}")
    feature = dataset.features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise UserError(
            f"dataset {where!r}: the {column!r} column holds {feature!r}, not strings; save one passage string per "
            f"row in {column!r} (e.g. join a list of sentences with a space), or name another with --text-column"
        )
    if columns != [column]:
        dataset = dataset.select_columns([column])
    return dataset.rename_column(column, "text") if column != "text" else dataset


def _read_files(
    files: list[Path], text_format: TextFormat, streaming: bool, text_column: str = "text"
) -> datasets.Dataset | datasets.IterableDataset:
    """Materialises the passages of corpus files with ``datasets``' builders (``_read_run``), or streams them
    through our own generator."""
    sources = [_describe_file(path, text_format) for path in files]
    if not any(_has_content(path) for path in files):
        names = ", ".join(repr(str(p)) for p in files)
        raise UserError(f"the corpus is empty: {names} holds no non-blank line; add passages or fix the path")
    if streaming:
        # A list in gen_kwargs is sharded by file across DataLoader workers / ranks.
        return datasets.IterableDataset.from_generator(
            _generate_passages, features=PASSAGE_FEATURES,
            gen_kwargs={"sources": sources, "code": _reader_fingerprint(), "column": text_column},
        )
    runs: list[list[tuple[str, str, int, int]]] = []  # consecutive files of one format: one builder call each
    for source in sources:
        if runs and runs[-1][0][1] == source[1]:
            runs[-1].append(source)
        else:
            runs.append([source])
    parts = [_read_run(run, text_column) for run in runs]
    corpus = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(corpus) == 0:
        names = ", ".join(repr(source[0]) for source in sources)
        raise UserError(f"the corpus is empty: every passage in {names} is blank; add passages with text")
    logger.info("Read %d passages from %d file(s)", len(corpus), len(files))
    return corpus


PASSAGE_FEATURES = datasets.Features({"text": datasets.Value("string")})


class _ReadLineByLine(Exception):
    """A builder's reading of a file cannot be trusted to match ours: read it line by line instead."""


def _read_run(sources: list[tuple[str, str, int, int]], column: str) -> datasets.Dataset:
    """The passages of files of one format, read by ``datasets``' builder (``_read_with_builder``); where it fails,
    or could differ from our reader, by our own line-by-line generator, which names the file and line of an error
    (``.parquet`` has no lines: its errors are the builder's)."""
    sources = [source for source in sources if _has_content(Path(source[0]))]  # a builder fails on no rows
    if not sources:
        return datasets.Dataset.from_dict({"text": []}, features=PASSAGE_FEATURES)
    if sources[0][1] != "parquet":
        for path, *_ in sources:
            check_text_encoding(path)  # UTF-16 without a byte-order mark would read as valid UTF-8 with NULs
    try:
        return _read_with_builder(sources, column)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: our reader finds and names the problem, or reads it
        if len(sources) > 1:  # e.g. files whose columns differ: one builder call each
            return datasets.concatenate_datasets([_read_run([source], column) for source in sources])
        if sources[0][1] == "parquet":
            raise UserError(f"{sources[0][0]}: could not be read as Parquet ({' '.join(str(exc).split())}); check "
                            f"the file") from exc
        logger.info("Reading %s line by line (%s: %s)", ", ".join(s[0] for s in sources), type(exc).__name__,
                    " ".join(str(exc).split())[:200])
    try:
        return datasets.Dataset.from_generator(
            _generate_passages,
            features=PASSAGE_FEATURES,
            gen_kwargs={"sources": tuple(sources), "code": _reader_fingerprint(), "column": column},
        )
    except DatasetGenerationError as exc:  # datasets wraps what the generator raises
        cause = _find_corpus_error(exc)
        if cause is None:
            raise
        raise cause.with_traceback(cause.__traceback__) from None
    except ValueError as exc:
        if "corresponds to no data" not in str(exc):  # the generator yielded no passage (all blank)
            raise
        return datasets.Dataset.from_dict({"text": []}, features=PASSAGE_FEATURES)


def _read_with_builder(sources: list[tuple[str, str, int, int]], column: str) -> datasets.Dataset:
    """Files of one format through ``load_dataset("json" | "text" | "parquet")``, then one batched ``map`` that
    forms the passages as our reader does (title joined, whitespace collapsed, blank ones dropped).

    Raises ``_ReadLineByLine`` where the builder's reading could differ from ours: a ``.jsonl`` line that is not
    one JSON object (a JSON array file, two objects on a line), a missing or non-string field, a ``.txt`` file with
    a carriage return that does not end a line (the builder would split lines there)."""
    fmt = sources[0][1]
    paths = [source[0] for source in sources]
    title = False
    if fmt == "jsonl":
        if any(_first_text_byte(path) not in (b"{", b"") for path in paths):
            raise _ReadLineByLine("a line that is not a JSON object")
        loaded = datasets.load_dataset("json", data_files=paths, split="train", on_mixed_types=None)
        columns = loaded.column_names
        if (column not in columns or not _string_type(loaded, column) or loaded.data.column(column).null_count
                or len(loaded) != sum(_count_content_lines(path) for path in paths)):
            raise _ReadLineByLine(f"a line without a string {column!r}, or with more than one JSON object")
        # a title of another JSON type is no title (our reader's rule); mixed types fail in the builder
        title = "title" in columns and column != "title" and _string_type(loaded, "title")
    elif fmt in ("lines", "blocks"):
        if any(_has_lone_carriage_return(path) for path in paths):
            raise _ReadLineByLine("a carriage return that does not end a line")
        loaded = datasets.load_dataset("text", data_files=paths, split="train", encoding="utf-8-sig",
                                       sample_by="line" if fmt == "lines" else "paragraph")
        column = "text"
    else:  # parquet
        loaded = datasets.load_dataset("parquet", data_files=paths, split="train")
        where = paths[0] if len(paths) == 1 else f"{paths[0]} (and {len(paths) - 1} more .parquet files)"
        _select_text_column(loaded, where, column)  # the one-line errors of a missing or non-string column
        nulls = loaded.data.column(column).null_count
        if nulls:
            raise UserError(f"{where}: {nulls} row(s) have no text (null) in column {column!r}; drop them or fill "
                            "them in")
        title = "title" in loaded.column_names and column != "title" and _string_type(loaded, "title")
    return loaded.with_format("arrow").map(
        _passages_batch, batched=True, batch_size=10_000, remove_columns=loaded.column_names,
        features=PASSAGE_FEATURES, desc="Forming passages",
        fn_kwargs={"column": column, "title": bool(title), "code": _reader_fingerprint()},
    ).with_format(None)


def _string_type(dataset: datasets.Dataset, column: str) -> bool:
    return getattr(dataset.features[column], "dtype", None) in ("string", "large_string")


# The characters Python's str.split() splits on (str.isspace), as an RE2 class: collapsing runs of them in Arrow
# gives " ".join(text.split()) without a Python loop.
PYTHON_WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007"
                     "\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_WHITESPACE_CLASS = "[" + "".join(f"\\x{{{ord(char):x}}}" for char in PYTHON_WHITESPACE) + "]"
# a run of two or more, or one other than a space: replacing every single space too is several times slower
_WHITESPACE_RUN = f"{_WHITESPACE_CLASS}{{2,}}|{_WHITESPACE_CLASS.replace(chr(92) + 'x{20}', '')}"


def _collapse_whitespace(texts: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``" ".join(text.split())`` for every string of an Arrow array (nulls stay null)."""
    return pc.utf8_trim(pc.replace_substring_regex(texts, _WHITESPACE_RUN, " "), " ")


def _passages_batch(batch: pa.Table, column: str, title: bool, code: str = "") -> pa.Table:
    """The passages of a batch of rows (an Arrow table): ``title + " " + text`` where a title is given, whitespace
    collapsed, blank ones dropped (``_iter_jsonl``'s rule). ``code`` is part of the cache fingerprint only."""
    texts = batch.column(column)
    if title:
        titles = batch.column("title")
        has_title = pc.fill_null(pc.greater(pc.utf8_length(_collapse_whitespace(titles)), 0), False)
        texts = pc.if_else(has_title, pc.binary_join_element_wise(titles, texts, " "), texts)
    texts = _collapse_whitespace(texts)
    return pa.table({"text": pc.filter(texts, pc.greater(pc.utf8_length(texts), 0))})


def _first_text_byte(path: str) -> bytes:
    """The first byte after a UTF-8 byte-order mark and whitespace, ``b""`` for an empty file."""
    with _open_binary(path) as handle:
        head = handle.read(ENCODING_PROBE_BYTES)
        while head:
            stripped = head.removeprefix(codecs.BOM_UTF8).lstrip()
            if stripped:
                return stripped[:1]
            head = handle.read(ENCODING_PROBE_BYTES)
    return b""


_CHUNK_BYTES = 1 << 24


def _count_content_lines(path: str) -> int:
    """The lines with something other than whitespace on them (our JSONL reader's records)."""
    with _open_binary(path) as handle:
        return sum(1 for raw in handle if raw.strip())


def _has_lone_carriage_return(path: str) -> bool:
    """Whether the file has a ``\r`` not followed by ``\n``: our reader keeps it inside the line, the ``text``
    builder (universal newlines) ends the line there."""
    previous_ends_in_cr = False
    with _open_binary(path) as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            if previous_ends_in_cr and not chunk.startswith(b"\n"):
                return True
            if b"\r" in chunk and re.search(rb"\r(?!\n)", chunk[:-1] if chunk.endswith(b"\r") else chunk):
                return True
            previous_ends_in_cr = chunk.endswith(b"\r")
    return previous_ends_in_cr


def _describe_file(path: Path, text_format: TextFormat) -> tuple[str, str, int, int]:
    """``(path, format, size, mtime_ns)``: the format resolved, size and mtime so edits invalidate the cache."""
    stat = path.stat()
    suffix, compression = _split_name(path)
    if suffix == ".jsonl":
        fmt = "jsonl"
    elif suffix == ".txt":
        fmt = text_format if text_format != "auto" else ("blocks" if _has_blank_separator(path) else "lines")
    elif suffix == ".parquet" and not compression:
        fmt = "parquet"
    else:
        raise UserError(f"{str(path)!r}: unsupported file type {suffix + compression!r}; use a .txt, .jsonl or "
                        f".parquet file (.txt and .jsonl may be compressed: {', '.join(COMPRESSED_SUFFIXES)})")
    return str(path.resolve()), fmt, stat.st_size, stat.st_mtime_ns


def _has_blank_separator(path: Path) -> bool:
    """Whether the file has an empty line between two non-empty lines (the ``"blocks"`` layout)."""
    seen_text = blank_after_text = False
    with _open_binary(path) as handle:
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
    """Whether the file has at least one non-blank line (stops at the first); a ``.parquet`` file: whether it has
    rows."""
    if _split_name(path)[0] == ".parquet":
        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
            raise UserError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())}); check the "
                            "file") from exc
    with _open_binary(path) as handle:
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
        iter_jsonl, json_type, check_text_encoding, wide_encoding, _iter_parquet, _passages_batch, _open_binary,
    )


def _generate_passages(
    sources: list[tuple[str, str, int, int]] | tuple[tuple[str, str, int, int], ...],
    code: str = "",
    require_passages: bool = False,
    column: str = "text",
) -> Iterator[dict]:
    """Yields ``{"text": passage}`` for every file in ``sources`` (see ``_describe_file``).

    ``code`` (the readers' ``code_fingerprint``) is unused here: it is part of the cache fingerprint.
    With ``require_passages`` an empty result raises ``UserError`` (not for streaming, where a shard of the files
    may legitimately be empty).
    """
    count = 0
    for path, fmt, _size, _mtime in sources:
        for _line_no, text in _READERS[fmt](path, column):
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
    with _open_binary(path) as handle:
        encoding = wide_encoding(handle.read(ENCODING_PROBE_BYTES))
    if encoding is not None:
        raise UserError(f"{path}: {encoding.upper()} text, not UTF-8; re-encode the file as UTF-8, e.g. iconv -f "
                        f"{encoding} -t utf-8 in > out")


def iter_decoded_lines(path: str) -> Iterator[tuple[int, str]]:
    """Yields ``(1-based line number, line without its end)``, raising ``UserError`` on bytes that are not UTF-8
    (``check_text_encoding`` first, so that UTF-16 and UTF-32 are named as such)."""
    check_text_encoding(path)
    with _open_binary(path) as handle:
        for line_no, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(
                    f"{path}:{line_no}: bytes that are not valid UTF-8 ({exc.reason} at column {exc.start + 1}); "
                    f"re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 in > out"
                ) from None
            yield line_no, line.rstrip("\r\n")


def numbered_passages(
    path: str | os.PathLike, text_format: TextFormat = "auto", text_column: str = "text"
) -> Iterator[tuple[int, str]]:
    """``(line, passage)`` for each passage of one ``.txt`` or ``.jsonl`` file, as ``read_corpus`` reads it; ``line``
    is the 1-based line the passage starts on (an id that blank passages, which are skipped, do not shift)."""
    fmt = _describe_file(Path(path), text_format)[1]
    if fmt != "jsonl":
        logger.info("%s: one passage per %s (text format %s)", Path(path).name,
                    "line" if fmt == "lines" else "block of lines between blank lines", text_format)
    return _READERS[fmt](str(path), text_column)


def _iter_text_lines(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per non-empty line (whitespace collapsed), with its line number."""
    for line_no, line in iter_decoded_lines(path):
        text = " ".join(line.split())
        if text:
            yield line_no, text


def _iter_text_blocks(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
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


def _iter_jsonl(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per JSON line, with its line number: ``column``, or ``title + " " + text`` when a title is
    given. A compressed file is decompressed into a temporary file first (messages name the file given)."""
    check_text_encoding(path)
    if not _split_name(Path(path))[1]:
        yield from _iter_jsonl_plain(path, path, column)
        return
    with tempfile.TemporaryDirectory() as folder:
        plain = os.path.join(folder, "corpus.jsonl")
        with _open_binary(path) as source, open(plain, "wb") as target:
            shutil.copyfileobj(source, target)
        try:
            yield from _iter_jsonl_plain(plain, path, column)
        except UserError as exc:
            raise UserError(str(exc).replace(plain, str(path))) from None


def _iter_jsonl_plain(path: str, shown: str, column: str) -> Iterator[tuple[int, str]]:
    for where, record in iter_jsonl(path, error=UserError, example=f'{{"{column}": "..."}}'):
        _check_jsonl_record(record, where, column)
        title = record.get("title") if column != "title" else None
        text = f"{title} {record[column]}" if isinstance(title, str) and title.strip() else record[column]
        text = " ".join(text.split())
        if text:
            yield int(where.rsplit(":", 1)[1]), text


def _iter_parquet(path: str, column: str = "text") -> Iterator[tuple[int, str]]:
    """One passage per row of a ``.parquet`` file (streaming), with its 1-based row number."""
    parquet = pq.ParquetFile(path)
    names = parquet.schema_arrow.names
    if column not in names:
        raise UserError(f"dataset {path!r} has no {column!r} column (columns: {names}); name the passage column "
                        "with --text-column")
    title = "title" in names and column != "title"
    row = 0
    for batch in parquet.iter_batches(columns=[column, "title"] if title else [column]):
        table = batch.to_pydict()
        for index, text in enumerate(table[column]):
            row += 1
            if not isinstance(text, str):
                raise UserError(f"{path}: row {row}: the {column!r} column holds {text!r}, not a string; save one "
                                f"passage string per row")
            head = table["title"][index] if title else None
            text = " ".join((f"{head} {text}" if isinstance(head, str) and head.strip() else text).split())
            if text:
                yield row, text


_READERS = {"jsonl": _iter_jsonl, "lines": _iter_text_lines, "blocks": _iter_text_blocks, "parquet": _iter_parquet}


def _check_jsonl_record(record: dict[str, Any], where: str, column: str = "text") -> None:
    """Raises ``UserError`` unless ``record`` has a string ``column``; ``where`` is ``file:line``."""
    if column not in record:
        title = ' (and optionally a "title")' if column != "title" else ""
        other = "; or name the passage field with --text-column" if column == "text" and record else ""
        raise UserError(
            f'{where}: no "{column}" field (keys: {sorted(record)}); give every line a string "{column}" field'
            f"{title}{other}"
        )
    if not isinstance(record[column], str):
        found = json.dumps(record[column])
        found = found if len(found) <= 40 else found[:37] + "..."
        raise UserError(
            f'{where}: the "{column}" field must be a string, found {found} (JSON {json_type(record[column])}); '
            f'write the passage in quotes, e.g. {{"{column}": "..."}}'
        )


__all__ = ["code_fingerprint", "iter_decoded_lines", "numbered_passages", "read_corpus"]
