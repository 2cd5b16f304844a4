"""Reading a pre-training corpus: text files (lines, blank-line blocks, JSONL), folders of them, saved datasets and
Hub datasets, with errors that name the file and line."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
from datasets.exceptions import DatasetGenerationError

from ..inputs.io import iter_jsonl, json_type
from ..inputs.parameters import SEVERAL_FILES, check_bool, check_path
from .arrow_reading import PASSAGE_FEATURES, FormsPassages, passages_batch, read_with_builder, select_text_column
from .builtin import builtin_corpus
from .corpus_folders import files_below, identical_files, is_note_file, relative, some_names
from .passages import (
    COMPRESSED_SUFFIXES,
    READ_FAILURES,
    TEXT_FORMATS,
    CorpusError,
    TextFormat,
    auto_blocks_note,
    check_jsonl_record,
    check_text_encoding,
    describe_file,
    file_passages,
    iter_decoded_lines,
    iter_jsonl_passages,
    iter_parquet_passages,
    iter_text_blocks,
    iter_text_lines,
    open_binary,
    split_name,
    unreadable_file,
    wide_encoding,
)

logger = logging.getLogger(__name__)

CORPUS_SUFFIXES = (".txt", ".jsonl", ".parquet")


# Suffixes that mark a source as a file path (never a Hub dataset name) when it does not exist.
PATH_LIKE_SUFFIXES = (*CORPUS_SUFFIXES, *COMPRESSED_SUFFIXES, ".json", ".csv", ".tsv", ".arrow")
GLOB_OR_LIST = ("*", "?", "[", ",")  # in a source: several files meant, which no Hub dataset name holds
FILES_READ = f".txt, .jsonl and .parquet files (.txt and .jsonl also compressed as {'/'.join(COMPRESSED_SUFFIXES)})"


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
    - A compressed ``.txt`` or ``.jsonl`` file (``.gz``, ``.bz2``, ``.xz``, ``.zst``), read as the file it holds.
    - A BEIR folder (``corpus.jsonl`` beside ``queries.jsonl`` or ``qrels/``): its ``corpus.jsonl``.
    - A directory written by ``datasets``' ``save_to_disk`` (a ``Dataset``, or a ``DatasetDict`` whose ``split``,
      by default ``"train"`` or its only split, is used) with a ``text_column`` column.
    - Any other directory: every ``.txt``, ``.jsonl`` and ``.parquet`` file (compressed too) below it (recursively,
      through symbolic links to folders too; hidden files skipped), in sorted path order; notes (README, LICENSE,
      ``.md``: ``is_note_file``) are skipped and identical files read with a warning; a file of another type there is
      refused (it would be left out silently), and so is a link that loops or reaches a folder a second time.
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
            same ``ValueError``; a folder of several files is sharded by file across DataLoader workers.

    Returns:
        A ``datasets.Dataset`` (or ``datasets.IterableDataset`` when ``streaming=True``) with the column ``"text"``.

    Raises:
        ValueError: The path is missing, a file is malformed (not UTF-8, UTF-16 or UTF-32 named as such, a line that
            is not JSON or has no string ``"text"``; the message gives the file and 1-based line), a folder holds
            files of other types (which would be left out) or a looping link, or the corpus holds no passage at all.
        ValueError: ``text_format`` is not one of ``"auto"``, ``"lines"``, ``"blocks"``.
        TypeError: ``source`` is not a str, ``os.PathLike`` or None, or ``streaming`` not a bool.
    """
    if source is not None:
        check_path("read_corpus", "source", source, f"give one path or Hub dataset name ({SEVERAL_FILES}), or None "
                   "for the built-in corpus")
    check_bool("read_corpus", "streaming", streaming)
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
        target = "a Hub dataset (--corpus-split also a saved DatasetDict)" if "--corpus-split" in given else "a Hub dataset"
        verb = "applies" if len(given) == 1 else "apply"
        raise ValueError(f"{' and '.join(given)} {verb} to {target}, not to {what}; drop {' and '.join(given)}")


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
    if any(mark in str(source) for mark in GLOB_OR_LIST):
        raise ValueError(f"corpus path {str(source)!r} does not exist: the corpus is one file or folder (--corpus "
                         f"PATH), and globs and lists are not expanded; {SEVERAL_FILES}")
    if _looks_like_path(str(source)):
        raise ValueError(f"corpus path {str(source)!r} does not exist; check the path (relative to {Path.cwd()})")
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
    saved = _is_saved_dataset(path)
    _refuse_hub_options(str(path), hub, split_allowed=saved)
    if _is_beir_folder(path):
        return _read_files([path / "corpus.jsonl"], text_format, streaming, text_column)
    if saved:
        return _load_saved_dataset(path, streaming, text_column, hub.split)
    found = files_below(path)
    notes = [p for p in found if is_note_file(p)]
    files = [p for p in found if _is_corpus_file(p) and not is_note_file(p)]
    others = [p for p in found if not _is_corpus_file(p) and not is_note_file(p)]
    if not files:
        holds = f" (it holds {some_names(found, path)})" if found else ""
        skipped = (f"; {some_names(notes, path)} {'is' if len(notes) == 1 else 'are'} skipped as notes (README, "
                   "LICENSE, .md): if one is the corpus, rename it to .txt (for example corpus.txt)") if notes else ""
        raise ValueError(f"directory {str(path)!r} holds no corpus{holds}: expected corpus.jsonl (BEIR), a datasets "
                         f"save_to_disk folder, or {FILES_READ}{skipped}; point the source at one of these")
    if others:
        raise ValueError(f"directory {str(path)!r} holds files that are not a corpus format: {some_names(others, path)}; "
                         f"the files read are {FILES_READ}: move the others out of the folder, or convert them")
    if notes:
        logger.warning("directory %r: skipping %s: notes beside the data (README, LICENSE, .md), not passages",
                       str(path), some_names(notes, path))
    for group in identical_files(files):
        logger.warning("directory %r: %s are identical files (same size and content), so their passages are read "
                       "%d times; remove the copies unless that is meant", str(path), " and ".join(
                           relative(p, path) for p in group), len(group))
    logger.info("Reading %d corpus file(s) in %s: %s", len(files), path, some_names(files, path))
    return _read_files(files, text_format, streaming, text_column)


def _is_saved_dataset(path: Path) -> bool:
    return any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json"))


def _is_beir_folder(path: Path) -> bool:
    """A folder read as its corpus.jsonl alone: queries or qrels beside it make it a BEIR folder."""
    return (path / "corpus.jsonl").is_file() and ((path / "queries.jsonl").is_file() or (path / "qrels").is_dir())


def _is_corpus_file(path: Path) -> bool:
    suffix, compression = split_name(path)
    return suffix in (".txt", ".jsonl") or (suffix == ".parquet" and not compression)


def _load_saved_dataset(
    path: Path, streaming: bool, text_column: str = "text", split: str | None = None
) -> datasets.Dataset | datasets.IterableDataset:
    """Loads a ``save_to_disk`` folder (``DatasetDict``: ``split``, else its ``"train"`` split or its only split)."""
    loaded = datasets.load_from_disk(str(path))
    if split is not None and not isinstance(loaded, datasets.DatasetDict):
        raise ValueError(f"--corpus-split {split}: {str(path)!r} is a saved Dataset, not a DatasetDict with splits; "
                         "drop --corpus-split")
    if isinstance(loaded, datasets.DatasetDict):
        if split is not None:
            if split not in loaded:
                raise ValueError(f"{str(path)!r} has no split {split!r} (splits: {sorted(loaded)}); pick one with "
                                 "--corpus-split")
            loaded = loaded[split]
        elif "train" in loaded:
            loaded = loaded["train"]
        elif len(loaded) == 1:
            loaded = next(iter(loaded.values()))
        else:
            raise ValueError(f"{str(path)!r} is a DatasetDict without a 'train' split (splits: {sorted(loaded)}); "
                             "pick one with --corpus-split <split> (read_corpus(..., split=...))")
    corpus = select_text_column(loaded, str(path), text_column)
    if len(corpus) == 0:
        raise ValueError(f"{str(path)!r} holds no rows: the corpus is empty; save a dataset with passages in 'text'")
    return corpus.to_iterable_dataset() if streaming else corpus


_CONFIGS_IN_ERROR = re.compile(r"available configs: (\[[^\]]*\])")
_SPLITS_IN_ERROR = re.compile(r"Unknown split \"([^\"]*)\"\. Should be one of (\[[^\]]*\])")


def _load_hub_dataset(
    name: str, streaming: bool, text_column: str = "text", hub: HubOptions = HubOptions()
) -> datasets.Dataset | datasets.IterableDataset:
    """Loads ``hub.split`` (default ``"train"``) of a Hub dataset; every failure becomes a one-line ``ValueError``."""
    split = hub.split or "train"
    try:
        loaded = datasets.load_dataset(name, hub.config, split=split, revision=hub.revision, streaming=streaming)
    except Exception as exc:
        found = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        configs = _CONFIGS_IN_ERROR.search(str(exc))
        if configs is not None:
            raise ValueError(f"corpus {name!r} has several configurations: {configs.group(1)}; pick one with "
                             f"--corpus-config (read_corpus(..., config=...))") from exc
        splits = _SPLITS_IN_ERROR.search(str(exc))
        if splits is not None:
            raise ValueError(f"corpus {name!r} has no split {splits.group(1)!r} (splits: {splits.group(2)}); pick "
                             f"one with --corpus-split") from exc
        raise ValueError(
            f"corpus {name!r} was not found locally (no such file or directory) or on the Hub "
            f"({found}); check the path, or the dataset name, --corpus-config, --corpus-revision and your "
            f"connection (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE)"
        ) from exc
    return select_text_column(loaded, name, text_column)


def _read_files(
    files: list[Path], text_format: TextFormat, streaming: bool, text_column: str = "text"
) -> datasets.Dataset | datasets.IterableDataset:
    """Materialises the passages of corpus files with ``datasets``' builders (``_read_run``), or streams them
    through our own generator."""
    sources = [describe_file(path, text_format) for path in files]
    if text_column != "text" and all(source[1] in ("lines", "blocks") for source in sources):
        raise ValueError(f"--text-column {text_column} names a field of .jsonl / .parquet / datasets corpora, and "
                         f"{str(files[0])!r}{' and the other files hold' if len(files) > 1 else ' holds'} plain text (a "
                         "passage per line or block); drop --text-column")
    blocks = [path for path, source in zip(files, sources, strict=True) if source[1] == "blocks"]
    if text_format == "auto" and blocks:
        logger.warning("%s", auto_blocks_note(blocks))
    if not any(_has_content(path) for path in files):
        names = ", ".join(repr(str(p)) for p in files)
        raise ValueError(f"the corpus is empty: {names} holds no non-blank line; add passages or fix the path")
    if streaming:
        # A list in gen_kwargs is sharded by file across DataLoader workers / ranks.
        return datasets.IterableDataset.from_generator(
            _generate_passages, features=PASSAGE_FEATURES,
            gen_kwargs={"sources": sources, "code": _reader_fingerprint(), "column": text_column},
        )
    runs: list[list[tuple[str, str, int, str]]] = []  # consecutive files of one format: one builder call each
    for source in sources:
        if runs and runs[-1][0][1] == source[1]:
            runs[-1].append(source)
        else:
            runs.append([source])
    parts = [_read_run(run, text_column) for run in runs]
    corpus = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(corpus) == 0:
        names = ", ".join(repr(source[0]) for source in sources)
        raise ValueError(f"the corpus is empty: every passage in {names} is blank; add passages with text")
    logger.info("Read %d passages from %d file(s)", len(corpus), len(files))
    return corpus


def _read_run(sources: list[tuple[str, str, int, str]], column: str) -> datasets.Dataset:
    """The passages of files of one format, read by ``datasets``' builder (``read_with_builder``); where it fails,
    or could differ from our reader, by our own line-by-line generator, which names the file and line of an error
    (``.parquet`` has no lines: its errors are the builder's)."""
    sources = [source for source in sources if _has_content(Path(source[0]))]  # a builder fails on no rows
    if not sources:
        return datasets.Dataset.from_dict({"text": []}, features=PASSAGE_FEATURES)
    if sources[0][1] != "parquet":
        for path, *_ in sources:
            check_text_encoding(path)  # UTF-16 without a byte-order mark would read as valid UTF-8 with NULs
    try:
        return read_with_builder(sources, column, _reader_fingerprint())
    except CorpusError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure: our reader finds and names the problem, or reads it
        if len(sources) > 1:  # e.g. files whose columns differ: one builder call each
            return datasets.concatenate_datasets([_read_run([source], column) for source in sources])
        if sources[0][1] == "parquet":
            cause = exc.__cause__ or exc  # datasets wraps pyarrow's reason
            raise ValueError(f"{sources[0][0]}: could not be read as Parquet ({' '.join(str(cause).split())}); check "
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


def _has_content(path: Path) -> bool:
    """Whether the file has at least one non-blank line (stops at the first); a ``.parquet`` file: whether it has
    rows."""
    if split_name(path)[0] == ".parquet":
        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a file that is not Parquet
            raise ValueError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())}); check the "
                             "file") from exc
    try:
        with open_binary(path) as handle:
            return any(raw.strip() for raw in handle)
    except READ_FAILURES as exc:  # a compressed file cut short before its first line
        raise unreadable_file(path, exc) from None


def _find_corpus_error(exc: BaseException) -> CorpusError | None:
    """The ``CorpusError`` that ``datasets`` wrapped (in ``__cause__``/``__context__``), if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, CorpusError):
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
        _generate_passages, iter_decoded_lines, iter_text_lines, iter_text_blocks, iter_jsonl_passages, check_jsonl_record,
        iter_jsonl, json_type, check_text_encoding, wide_encoding, iter_parquet_passages, passages_batch, open_binary,
        FormsPassages, read_with_builder, file_passages,
    )


def _generate_passages(
    sources: list[tuple[str, str, int, str]] | tuple[tuple[str, str, int, str], ...],
    code: str = "",
    require_passages: bool = False,
    column: str = "text",
) -> Iterator[dict]:
    """Yields ``{"text": passage}`` for every file in ``sources`` (see ``describe_file``).

    ``code`` (the readers' ``code_fingerprint``) is unused here: it is part of the cache fingerprint.
    With ``require_passages`` an empty result raises ``ValueError`` (not for streaming, where a shard of the files
    may legitimately be empty).
    """
    count = 0
    for path, fmt, _size, _stamp in sources:
        for _line_no, text in file_passages(path, fmt, column):
            count += 1
            yield {"text": text}
    if require_passages and count == 0:
        names = ", ".join(repr(source[0]) for source in sources)
        raise ValueError(f"the corpus is empty: every passage in {names} is blank; add passages with text")


def check_text_format_applies(text_format: str, corpus: str | None, *, any_corpus_jsonl_is_beir: bool = False) -> None:
    """Refuse a ``text_format`` other than auto for a corpus of which no .txt file is read (it would be ignored): a
    file of another kind, a BEIR or saved-dataset folder, a folder without one (hidden files are not read), a Hub
    dataset or the built-in corpus. ``any_corpus_jsonl_is_beir``: a folder with a corpus.jsonl is read as BEIR
    without queries or qrels too (`retromae index`)."""
    if text_format == "auto" or (corpus and _reads_text_files(Path(corpus).expanduser(), any_corpus_jsonl_is_beir)):
        return
    what = f"--corpus {corpus}" if corpus else "the built-in corpus"
    raise CorpusError(f"--text-format {text_format} splits .txt files into passages, and {what} holds none; drop "
                      "--text-format")


def _reads_text_files(path: Path, any_corpus_jsonl_is_beir: bool) -> bool:
    """Whether reading the corpus at ``path`` reads a .txt file (``_read_source``'s rules)."""
    if path.is_file():
        return split_name(path)[0] == ".txt"
    beir = (path / "corpus.jsonl").is_file() if any_corpus_jsonl_is_beir else _is_beir_folder(path)
    if not path.is_dir() or beir or _is_saved_dataset(path):
        return False
    return any(split_name(file)[0] == ".txt" and not is_note_file(file) for file in files_below(path))


__all__ = ["check_text_format_applies", "code_fingerprint", "read_corpus"]
