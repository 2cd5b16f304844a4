"""Reading a pre-training corpus: text files (lines, blank-line blocks, JSONL), folders of them, saved datasets and
Hub datasets, with errors that name the file and line."""

from __future__ import annotations

import codecs
import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import datasets
from datasets.exceptions import DatasetGenerationError

from ..inputs.errors import UserError
from ..inputs.io import iter_jsonl, json_type
from .builtin import builtin_corpus

logger = logging.getLogger(__name__)

TextFormat = Literal["auto", "lines", "blocks"]
TEXT_FORMATS = ("auto", "lines", "blocks")
CORPUS_SUFFIXES = (".txt", ".jsonl")


# Suffixes that mark a source as a file path (never a Hub dataset name) when it does not exist.
PATH_LIKE_SUFFIXES = (*CORPUS_SUFFIXES, ".json", ".csv", ".tsv", ".parquet", ".arrow", ".gz")


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


__all__ = ["code_fingerprint", "iter_decoded_lines", "numbered_passages", "read_corpus"]
