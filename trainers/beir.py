"""Retrieval data for fine-tuning and evaluation: BEIR folders, (query, positive, negatives) JSONL, `datasets`.

Two shapes come out of here:

* `RetrievalData` (corpus, queries, qrels): what `retromae evaluate` scores and what `retromae finetune` mines hard
  negatives from. Read from a BEIR folder by `read_beir`::

      scifact/corpus.jsonl        {"_id": "4983", "title": "...", "text": "..."}
      scifact/queries.jsonl       {"_id": "1", "text": "..."}
      scifact/qrels/dev.tsv       query-id <TAB> corpus-id <TAB> score   (header line optional; score > 0 = relevant)

* `TrainingGroup` (one query, its positives, optional negatives): what `retromae finetune` trains on. Read by
  `load_training_groups` from a BEIR folder (positives from the qrels), a JSONL file, or a `datasets` dataset
  (a `save_to_disk` folder or a Hub name). JSONL lines look like::

      {"query": "...", "positive": "..." | ["...", ...], "negatives": ["...", ...]}
      # optional ids, kept for distillation scores and written by hard-negative mining:
      {"query_id": "q1", "query": "...", "positive_id": "d7", "positive": "...",
       "negative_ids": ["d3", ...], "negatives": ["...", ...]}

  A document's text is `title + " " + text` stripped, exactly as mteb builds it (`mteb._create_dataloaders`), so a
  model sees the same strings in fine-tuning, mining and evaluation. Texts without ids get content ids
  (`"q:" / "d:" + sha1[:16]`), so the same text always has the same id.

Bad input is reported with counts, never silently: qrels naming a query or document that does not exist
(`on_missing="error"` refuses, `"skip"` drops them with a warning), a query without any positive (dropped, counted),
negatives equal to one of the query's positives (dropped, counted), a BEIR folder missing a file (`RetrievalDataError`
naming the file and the expected layout).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import random
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import datasets

from .core.errors import UserError
from .core.io import atomic_file, iter_jsonl
from .data import iter_decoded_lines

logger = logging.getLogger(__name__)

OnMissing = Literal["skip", "error"]
ON_MISSING = ("skip", "error")
BEIR_LAYOUT = "corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
QUERY_COLUMNS = ("query", "anchor", "question")
POSITIVE_COLUMNS = ("positive", "positives", "answer", "document")
# the shape of a line, shown in the message about a bad line
CORPUS_EXAMPLE = '{"_id": "d1", "title": "...", "text": "..."}'
QUERY_EXAMPLE = '{"_id": "q1", "text": "..."}'
TRAINING_EXAMPLE = '{"query": "...", "positive": "...", "negatives": ["..."]}'

__all__ = [
    "ON_MISSING",
    "RetrievalData",
    "RetrievalDataError",
    "TrainingGroup",
    "check_beir_layout",
    "clean_groups",
    "doc_text",
    "groups_from_beir",
    "groups_to_dataset",
    "groups_to_distillation_dataset",
    "is_beir_folder",
    "load_training_groups",
    "read_beir",
    "read_qrels",
    "read_teacher_scores",
    "read_training_jsonl",
    "write_training_jsonl",
]


class RetrievalDataError(UserError):
    """Retrieval data (BEIR folder, qrels, training pairs, teacher scores) cannot be used; the message says why."""


def doc_text(title: str | None, text: str) -> str:
    """A document as the model reads it: `title + " " + text`, stripped (mteb's and BEIR's convention)."""
    return f"{title} {text}".strip() if title else text.strip()


def _content_id(prefix: str, text: str) -> str:
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


# ---- BEIR folders --------------------------------------------------------------------------------------------------


@dataclass
class RetrievalData:
    """Corpus, queries and relevance judgements of one split.

    Args:
        corpus: document id -> {"title": str, "text": str}.
        queries: query id -> text; only the queries that have at least one relevant document.
        qrels: query id -> {document id: relevance > 0}.
        name: a display name (the folder name; never a full path).
        split: the qrels split.
        report: counts of what was dropped while reading (see `summary`).
    """

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    name: str
    split: str
    report: dict[str, int] = field(default_factory=dict)

    def doc_text(self, doc_id: str) -> str:
        doc = self.corpus[doc_id]
        return doc_text(doc.get("title"), doc["text"])

    def summary(self) -> str:
        judged = sum(len(docs) for docs in self.qrels.values())
        dropped = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in self.report.items() if v)
        return (
            f"{self.name} ({self.split}): {len(self.corpus)} documents, {len(self.queries)} queries, "
            f"{judged} relevant pairs" + (f"; dropped {dropped}" if dropped else "")
        )


def is_beir_folder(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "corpus.jsonl").is_file()


def check_beir_layout(folder: Path, split: str) -> Path:
    """The qrels file of `split` in the BEIR folder `folder`; refuses a folder without corpus, queries or that file
    (naming the splits it has), without reading them."""
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise RetrievalDataError(f"BEIR folder {folder} {state} (expected a folder with {BEIR_LAYOUT})")
    qrels_file = folder / "qrels" / f"{split}.tsv"
    missing = [str(p.relative_to(folder)) for p in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_file)
               if not p.is_file()]
    if missing:
        available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        hint = f"; qrels splits present: {', '.join(available)}" if available else ""
        raise RetrievalDataError(
            f"BEIR folder {folder.name} is missing {', '.join(missing)} (a BEIR folder holds {BEIR_LAYOUT}){hint}"
        )
    return qrels_file


def read_beir(folder: str | os.PathLike, split: str = "test", on_missing: OnMissing = "error") -> RetrievalData:
    """Read one split of a BEIR folder.

    Args:
        folder: holds `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv`.
        split: the qrels file to use (`qrels/<split>.tsv`).
        on_missing: what to do with qrels that name a query or document absent from the files: `"error"` raises
            (with the counts and a few example ids), `"skip"` drops those lines and logs the counts.

    Returns:
        The split's `RetrievalData`; `queries` holds only queries with at least one relevant document (qrels score
        > 0). Queries judged only with score <= 0 are dropped and counted (`report["queries_without_positives"]`).

    Raises:
        RetrievalDataError: a missing or malformed file, an unknown `on_missing`, missing references with
            `on_missing="error"`, or a split with no usable query.
    """
    if on_missing not in ON_MISSING:
        raise RetrievalDataError(f"on_missing={on_missing!r} must be one of {ON_MISSING}")
    folder = Path(folder)
    qrels_file = check_beir_layout(folder, split)
    corpus = read_beir_corpus(folder / "corpus.jsonl")
    all_queries = read_beir_queries(folder / "queries.jsonl")
    if not all_queries:
        raise RetrievalDataError(f"{folder.name}/queries.jsonl holds no query; add the queries of qrels/{split}.tsv")
    qrels, report = _known_qrels(read_qrels(qrels_file), all_queries, corpus, on_missing, qrels_file)
    positives = {qid: {d: s for d, s in docs.items() if s > 0} for qid, docs in qrels.items()}
    without = sorted(qid for qid, docs in positives.items() if not docs)
    if without:
        report["queries_without_positives"] = len(without)
        logger.warning(
            "%s: %d judged queries have no relevant document (all scores <= 0), e.g. %s; they are not used",
            qrels_file.name, len(without), without[:3],
        )
    positives = {qid: docs for qid, docs in positives.items() if docs}
    if not positives:
        raise RetrievalDataError(f"{qrels_file.relative_to(folder.parent)}: no query with a relevant document remains")
    queries = {qid: all_queries[qid] for qid in positives}
    return RetrievalData(corpus, queries, positives, name=folder.resolve().name, split=split, report=dict(report))


def _known_qrels(raw_qrels: dict[str, dict[str, int]], queries: Mapping[str, Any], corpus: Mapping[str, Any],
                 on_missing: OnMissing, qrels_name: Path) -> tuple[dict[str, dict[str, int]], Counter]:
    """The qrels lines whose query and document exist, and the counts of the others; those others are refused
    (`on_missing="error"`) or logged and dropped."""
    report = Counter()
    qrels: dict[str, dict[str, int]] = {}
    unknown_queries, unknown_docs = set(), set()
    for qid, docs in raw_qrels.items():
        if qid not in queries:
            unknown_queries.add(qid)
            report["qrels_lines_with_unknown_query"] += len(docs)
            continue
        for doc_id, score in docs.items():
            if doc_id not in corpus:
                unknown_docs.add(doc_id)
                report["qrels_lines_with_unknown_document"] += 1
                continue
            qrels.setdefault(qid, {})[doc_id] = int(score)
    if unknown_queries or unknown_docs:
        message = (
            f"{qrels_name} names {len(unknown_queries)} query id(s) missing from "
            f"queries.jsonl ({report['qrels_lines_with_unknown_query']} lines, e.g. {sorted(unknown_queries)[:3]}) and "
            f"{len(unknown_docs)} document id(s) missing from corpus.jsonl "
            f"({report['qrels_lines_with_unknown_document']} lines, e.g. {sorted(unknown_docs)[:3]})"
        )
        if on_missing == "error":
            raise RetrievalDataError(message + "; fix the files, or pass --on-missing skip to drop those lines")
        logger.warning("%s; those lines are skipped", message)
    return qrels, report


def _records(path: Path, example: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a BEIR/training JSONL file with their place `file:line` (`core.io.iter_jsonl`)."""
    return iter_jsonl(path, error=RetrievalDataError, example=example)


def _string_field(record: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool) and key.endswith("id"):
        return str(value)
    if not isinstance(value, str):
        raise RetrievalDataError(f"{where}: field {key!r} must be a string, got {value!r:.60}")
    return value


def read_beir_corpus(path: Path) -> dict[str, dict[str, str]]:
    corpus: dict[str, dict[str, str]] = {}
    for where, record in _records(path, CORPUS_EXAMPLE):
        doc_id = _string_field(record, "_id", where)
        if doc_id in corpus:
            raise RetrievalDataError(f"{where}: duplicate document id {doc_id!r}")
        corpus[doc_id] = {
            "title": _string_field(record, "title", where, required=False),
            "text": _string_field(record, "text", where),
        }
    if not corpus:
        raise RetrievalDataError(f"{path.name} holds no document")
    return corpus


def read_beir_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for where, record in _records(path, QUERY_EXAMPLE):
        query_id = _string_field(record, "_id", where)
        if query_id in queries:
            raise RetrievalDataError(f"{where}: duplicate query id {query_id!r}")
        queries[query_id] = _string_field(record, "text", where)
    return queries


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_qrels(path: str | os.PathLike, value_type: type = int) -> dict[str, dict[str, Any]]:
    """Read a TSV of `query-id <TAB> corpus-id <TAB> score` (header optional; TREC's 4-column form also accepted).

    Args:
        path: the file.
        value_type: `int` for relevance judgements, `float` for teacher scores.
    """
    path = Path(path)
    out: dict[str, dict[str, Any]] = {}
    lines = (line for _, line in iter_decoded_lines(str(path)))
    for line_no, row in enumerate(csv.reader(lines, delimiter="\t"), start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) == 4:  # TREC qrels: qid iteration docid relevance
            row = [row[0], row[2], row[3]]
        if len(row) != 3:
            raise RetrievalDataError(
                f"{path}:{line_no}: expected 3 tab-separated columns (query-id, corpus-id, score), "
                f"got {len(row)}"
            )
        qid, doc_id, score = (cell.strip() for cell in row)
        try:
            value = float(score)
        except ValueError:
            if line_no == 1 and not _is_number(score):  # the header line
                continue
            raise RetrievalDataError(f"{path}:{line_no}: score {score!r} is not a finite number") from None
        if not math.isfinite(value):  # an inf teacher score makes every weight NaN
            raise RetrievalDataError(f"{path}:{line_no}: score {score!r} is not a finite number")
        if value_type is int and not value.is_integer():  # int() would make a 0.5 "not relevant"
            raise RetrievalDataError(f"{path}:{line_no}: relevance {score!r} is not a whole number; qrels grade "
                                     "relevance in integers (0 = not relevant)")
        out.setdefault(qid, {})[doc_id] = value_type(value)
    if not out:
        raise RetrievalDataError(f"{path} holds no (query-id, corpus-id, score) line")
    return out


def read_teacher_scores(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Cross-encoder scores for distillation: a TSV `query-id <TAB> corpus-id <TAB> score` (header optional)."""
    path = Path(path)
    if not path.is_file():
        raise RetrievalDataError(f"teacher score file {path} does not exist")
    return read_qrels(path, value_type=float)


# ---- training groups -----------------------------------------------------------------------------------------------


@dataclass
class TrainingGroup:
    """One training query: its positives and (optionally) negatives as `(id, text)` pairs."""

    query_id: str
    query: str
    positives: list[tuple[str, str]]
    negatives: list[tuple[str, str]] = field(default_factory=list)


def groups_from_beir(data: RetrievalData) -> list[TrainingGroup]:
    """One group per query of the split, the relevant documents as positives (no negatives)."""
    return [
        TrainingGroup(qid, data.queries[qid], [(doc_id, data.doc_text(doc_id)) for doc_id in sorted(docs)])
        for qid, docs in data.qrels.items()
    ]


def _text_list(value: Any, key: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise RetrievalDataError(f"{where}: field {key!r} must be a string or a list of strings, got {value!r:.60}")


def _id_list(value: Any, n: int, key: str, where: str) -> list[str] | None:
    if value is None:
        return None
    ids = [str(v) for v in (value if isinstance(value, list | tuple) else [value])]
    if len(ids) != n:
        raise RetrievalDataError(f"{where}: {key!r} has {len(ids)} ids for {n} texts")
    return ids


def _group_from_record(record: Mapping[str, Any], where: str) -> TrainingGroup:
    query_key = next((k for k in QUERY_COLUMNS if k in record), None)
    if query_key is None or not isinstance(record[query_key], str):
        raise RetrievalDataError(f"{where}: needs a string field 'query' (or 'anchor'), got keys {sorted(record)}")
    query = record[query_key]
    positive_key = next((k for k in POSITIVE_COLUMNS if k in record), "positive")
    # blank texts stay, paired with their ids: `clean_groups` drops them with a count
    positives = _text_list(record.get(positive_key), positive_key, where)
    if "negatives" in record:
        negatives = _text_list(record["negatives"], "negatives", where)
    else:  # flat columns: negative, negative_1, negative_2, ...
        negative_keys = sorted((k for k in record if k != "negative_ids" and (k == "negative"
                                                                          or k.startswith("negative_"))),
                               key=lambda k: (len(k), k))
        wrong = next((k for k in negative_keys if not isinstance(record[k], str | None)), None)
        if wrong is not None:
            raise RetrievalDataError(f"{where}: field {wrong!r} must be a string, got {record[wrong]!r:.60}")
        # None: a dataset row with fewer negatives than its table has columns
        negatives = [record[k] for k in negative_keys if record[k] is not None]
    positive_ids = _id_list(record.get("positive_ids", record.get("positive_id")), len(positives), "positive_ids", where)
    negative_ids = _id_list(record.get("negative_ids"), len(negatives), "negative_ids", where)
    query_id = str(record["query_id"]) if record.get("query_id") is not None else _content_id("q:", query)
    return TrainingGroup(
        query_id,
        query,
        list(zip(positive_ids or [_content_id("d:", t) for t in positives], positives, strict=True)),
        list(zip(negative_ids or [_content_id("d:", t) for t in negatives], negatives, strict=True)),
    )


def read_training_jsonl(path: str | os.PathLike) -> list[TrainingGroup]:
    """(query, positive[s], negatives) lines; see the module docstring for the fields."""
    path = Path(path)
    groups = [_group_from_record(record, where) for where, record in _records(path, TRAINING_EXAMPLE)]
    if not groups:
        raise RetrievalDataError(f"{path.name} holds no training example")
    return groups


def _groups_from_dataset(dataset: datasets.Dataset, name: str) -> list[TrainingGroup]:
    columns = dataset.column_names
    if not any(c in columns for c in QUERY_COLUMNS) or not any(c in columns for c in POSITIVE_COLUMNS):
        raise RetrievalDataError(
            f"dataset {name} has columns {columns}; expected a query column ({', '.join(QUERY_COLUMNS)}) and a "
            f"positive column ({', '.join(POSITIVE_COLUMNS)}), optionally 'negatives' or negative_1..n"
        )
    return [_group_from_record(row, f"dataset {name} row {i}") for i, row in enumerate(dataset)]


def load_training_groups(
    source: str | os.PathLike, split: str = "train", on_missing: OnMissing = "error"
) -> tuple[list[TrainingGroup], RetrievalData | None]:
    """Training groups from a BEIR folder, a JSONL file, a `datasets` folder or a Hub dataset name.

    Returns:
        `(groups, beir)`: `beir` is the `RetrievalData` when the source is a BEIR folder (its corpus is the pool
        hard negatives are mined from), else None.
    """
    path = Path(source).expanduser()
    if is_beir_folder(path):
        data = read_beir(path, split=split, on_missing=on_missing)
        logger.info("training data %s", data.summary())
        return groups_from_beir(data), data
    if path.is_file():
        if path.suffix not in {".jsonl", ".json"}:
            raise RetrievalDataError(f"training file {path.name}: expected a .jsonl file of (query, positive, negatives)")
        return read_training_jsonl(path), None
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise RetrievalDataError(f"dataset {path.name} has splits {list(loaded)}, not {split!r}")
                loaded = loaded[split]
            return _groups_from_dataset(loaded, path.name), None
        raise RetrievalDataError(
            f"training data folder {path.name} is neither a BEIR folder ({BEIR_LAYOUT}) nor a datasets save_to_disk folder"
        )
    if os.path.isabs(str(source)) or str(source).startswith((".", "~")) or path.suffix:
        raise RetrievalDataError(f"training data {source} does not exist")
    try:
        loaded = datasets.load_dataset(str(source), split=split)
    except Exception as error:  # offline, unknown name, no such split: the datasets message says which
        raise RetrievalDataError(f"training data {source!r} is no file or folder here, and loading it as a Hub dataset "
                                 f"(split {split!r}) failed: {error}") from None
    return _groups_from_dataset(loaded, str(source)), None


def clean_groups(groups: Iterable[TrainingGroup]) -> tuple[list[TrainingGroup], dict[str, int]]:
    """Drop blank queries and documents (a blank text teaches nothing, and a batch of them trains at loss 0),
    negatives that equal one of the query's positives (same id or same text, over all lines of that query) and
    queries without positives; return the kept groups and the counts.

    Raises:
        RetrievalDataError: no group with a positive remains.
    """
    groups = list(groups)
    report = Counter()
    positive_keys: dict[str, set[str]] = {}
    for group in groups:
        keys = positive_keys.setdefault(group.query_id, set())
        for doc_id, text in group.positives:
            keys.update((doc_id, "text:" + text.strip()))
    kept = []
    for group in groups:
        if not group.query.strip():
            report["blank_queries"] += 1
            continue
        positives = [(d, t) for d, t in group.positives if t.strip()]
        report["blank_positive_documents"] += len(group.positives) - len(positives)
        if not positives:
            report["queries_without_positives"] += 1
            continue
        keys = positive_keys[group.query_id]
        negatives = [(d, t) for d, t in group.negatives if t.strip()]
        report["blank_negative_documents"] += len(group.negatives) - len(negatives)
        unique = [(d, t) for d, t in negatives if d not in keys and "text:" + t.strip() not in keys]
        report["negatives_equal_to_a_positive"] += len(negatives) - len(unique)
        kept.append(TrainingGroup(group.query_id, group.query, positives, unique))
    for key, count in report.items():
        if count:
            logger.warning("training data: dropped %d %s", count, key.replace("_", " "))
    if not kept:
        raise RetrievalDataError(
            f"no training example left: all {len(groups)} queries are blank or lack a positive (a non-blank 'positive' "
            "field, or a qrels score > 0 for a non-blank document)"
        )
    return kept, dict(report)


def _negative_columns(k: int) -> list[str]:
    return [f"negative_{i}" for i in range(1, k + 1)]


def _rows(groups: Iterable[TrainingGroup], num_negatives: int, seed: int, report: Counter) -> Iterator[tuple]:
    rng = random.Random(seed)
    for group in groups:
        for positive in group.positives:
            if num_negatives and len(group.negatives) < num_negatives:
                report["examples_with_too_few_negatives"] += 1
                continue
            if len(group.negatives) > num_negatives:
                negatives = rng.sample(group.negatives, num_negatives)
            else:
                negatives = list(group.negatives)
            yield group, positive, negatives


def groups_to_dataset(
    groups: Iterable[TrainingGroup], num_negatives: int = 0, seed: int = 42
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Columns `query, positive, negative_1..negative_k` (k = `num_negatives`), one row per (query, positive).

    A group with more than k negatives contributes k drawn at random (seeded); one with fewer is skipped and counted
    (`examples_with_too_few_negatives`), so that every row has the same number of columns.
    """
    report = Counter()
    columns: dict[str, list[str]] = {"query": [], "positive": [], **{c: [] for c in _negative_columns(num_negatives)}}
    for group, positive, negatives in _rows(groups, num_negatives, seed, report):
        columns["query"].append(group.query)
        columns["positive"].append(positive[1])
        for name, (_, text) in zip(_negative_columns(num_negatives), negatives, strict=True):
            columns[name].append(text)
    if not columns["query"]:
        raise RetrievalDataError(
            f"no training example has {num_negatives} negatives; lower --num-negatives or mine more"
        )
    if report:
        logger.warning("training data: skipped %d examples with fewer than %d negatives",
                       report["examples_with_too_few_negatives"], num_negatives)
    return datasets.Dataset.from_dict(columns), dict(report)


def groups_to_distillation_dataset(
    groups: Iterable[TrainingGroup],
    teacher_scores: Mapping[str, Mapping[str, float]],
    num_negatives: int,
    on_missing: OnMissing = "error",
    seed: int = 42,
) -> tuple[datasets.Dataset, dict[str, int]]:
    """Like `groups_to_dataset`, plus a `label` column: the teacher's scores of `[positive, negative_1, ...]`.

    Raises:
        RetrievalDataError: a (query, document) pair has no teacher score and `on_missing="error"`.
    """
    if num_negatives < 1:
        raise RetrievalDataError(f"distillation needs at least one negative per query, got num_negatives={num_negatives}")
    report = Counter()
    columns: dict[str, list] = {"query": [], "positive": [], **{c: [] for c in _negative_columns(num_negatives)},
                                "label": []}
    missing_examples: list[tuple[str, str]] = []
    for group, positive, negatives in _rows(groups, num_negatives, seed, report):
        scores_of_query = teacher_scores.get(group.query_id, {})
        docs = [positive, *negatives]
        missing = [doc_id for doc_id, _ in docs if doc_id not in scores_of_query]
        if missing:
            report["examples_without_teacher_scores"] += 1
            missing_examples.extend((group.query_id, d) for d in missing[:1])
            continue
        columns["query"].append(group.query)
        columns["positive"].append(positive[1])
        for name, (_, text) in zip(_negative_columns(num_negatives), negatives, strict=True):
            columns[name].append(text)
        columns["label"].append([float(scores_of_query[doc_id]) for doc_id, _ in docs])
    if report["examples_without_teacher_scores"]:
        message = (
            f"{report['examples_without_teacher_scores']} training examples have (query, document) pairs without a "
            f"teacher score, e.g. {missing_examples[:3]} (query-id, corpus-id)"
        )
        if on_missing == "error":
            raise RetrievalDataError(message + "; score them, or pass --on-missing skip to drop those examples")
        logger.warning("%s; skipped", message)
    if not columns["query"]:
        raise RetrievalDataError("no training example has teacher scores for its positive and all its negatives")
    return datasets.Dataset.from_dict(columns), dict(report)


def write_training_jsonl(groups: Iterable[TrainingGroup], path: str | os.PathLike) -> Path:
    """Write groups as JSONL (one line per query, ids included), atomically; readable by `read_training_jsonl`."""
    path = Path(path)
    with atomic_file(path) as handle:
        for group in groups:
            record = {
                "query_id": group.query_id,
                "query": group.query,
                "positive_ids": [d for d, _ in group.positives],
                "positive": [t for _, t in group.positives],
                "negative_ids": [d for d, _ in group.negatives],
                "negatives": [t for _, t in group.negatives],
            }
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path
