"""Fine-tuning data: (query, positives, negatives) groups from a BEIR folder (positives from its qrels), a JSONL
file or a `datasets` dataset, and the datasets the sentence-transformers trainer takes. JSONL lines look like::

    {"query": "...", "positive": "..." | ["...", ...], "negatives": ["...", ...]}
    # optional ids, kept for distillation scores and written by hard-negative mining:
    {"query_id": "q1", "query": "...", "positive_id": "d7", "positive": "...",
     "negative_ids": ["d3", ...], "negatives": ["...", ...]}

Texts without ids get content ids (`"q:" / "d:" + sha1[:16]`); `clean_groups` drops negatives equal to a positive.
A JSONL line with any other field is refused (`KNOWN_FIELDS`): its data would be ignored.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets

from ..inputs.io import atomic_file
from ..retrieval.beir import (
    BEIR_LAYOUT,
    POSITIVE_COLUMNS,
    QUERY_COLUMNS,
    OnMissing,
    RetrievalData,
    RetrievalDataError,
    beir_records,
    content_id,
    is_beir_folder,
    read_beir,
)

logger = logging.getLogger(__name__)

TRAINING_EXAMPLE = '{"query": "...", "positive": "...", "negatives": ["..."]}'
# the fields `_group_from_record` reads; flat negative columns `negative`, `negative_1`, ... match NEGATIVE_COLUMN
KNOWN_FIELDS = frozenset({*QUERY_COLUMNS, *POSITIVE_COLUMNS, "negatives", "negative", "query_id", "positive_id",
                          "positive_ids", "negative_ids"})
NEGATIVE_COLUMN = re.compile(r"negative_\d+")
FLAG_EMBEDDING_FIELDS = {"pos", "neg"}  # FlagEmbedding's training lines: {"query", "pos": [...], "neg": [...]}


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
    query_id = str(record["query_id"]) if record.get("query_id") is not None else content_id("q:", query)
    return TrainingGroup(
        query_id,
        query,
        list(zip(positive_ids or [content_id("d:", t) for t in positives], positives, strict=True)),
        list(zip(negative_ids or [content_id("d:", t) for t in negatives], negatives, strict=True)),
    )


def _check_known_fields(record: Mapping[str, Any], where: str) -> None:
    """Refuse a line with a field nothing reads: the user's negatives or positives under another name would be
    dropped without a word."""
    unknown = sorted(k for k in record if k not in KNOWN_FIELDS and not NEGATIVE_COLUMN.fullmatch(k))
    if not unknown:
        return
    hint = ("; FlagEmbedding's 'pos'/'neg' are 'positive'/'negatives' here" if FLAG_EMBEDDING_FIELDS & set(unknown)
            else "")
    raise RetrievalDataError(
        f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; a line holds 'query', 'positive' and optionally "
        f"'negatives' (with ids: 'query_id', 'positive_ids', 'negative_ids'){hint}: rename or drop the unknown fields"
    )


def read_training_jsonl(path: str | os.PathLike) -> list[TrainingGroup]:
    """(query, positive[s], negatives) lines; see the module docstring for the fields. A line with any other field
    is refused."""
    path = Path(path)
    groups = []
    for where, record in beir_records(path, TRAINING_EXAMPLE):
        _check_known_fields(record, where)
        groups.append(_group_from_record(record, where))
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


def negatives_by_query(groups: Iterable[TrainingGroup]) -> dict[str, list[tuple[str, str]]]:
    """Each query's negatives over all its groups (a file may give one query on several lines), in order, each
    document id once."""
    merged: dict[str, dict[str, str]] = {}
    for group in groups:
        negatives = merged.setdefault(group.query_id, {})
        for doc_id, text in group.negatives:
            negatives.setdefault(doc_id, text)
    return {query_id: list(negatives.items()) for query_id, negatives in merged.items()}


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


__all__ = [
    "TrainingGroup", "clean_groups", "groups_from_beir", "groups_to_dataset", "groups_to_distillation_dataset",
    "load_training_groups", "negatives_by_query", "read_training_jsonl", "write_training_jsonl"
]
