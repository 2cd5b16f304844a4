"""BEIR folders for fine-tuning and evaluation: corpus, queries and qrels as `RetrievalData` (`read_beir`)::

    scifact/corpus.jsonl        {"_id": "4983", "title": "...", "text": "..."}
    scifact/queries.jsonl       {"_id": "1", "text": "..."}
    scifact/qrels/dev.tsv       query-id <TAB> corpus-id <TAB> score   (header line optional; score > 0 = relevant)

A document's text is `title + " " + text` stripped, exactly as mteb builds it (`doc_text`). Bad input is reported
with counts, never silently: qrels naming a query or document that does not exist (`on_missing="error"` refuses,
`"skip"` drops them with a warning), a query without any positive, a missing file (`RetrievalDataError`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..data.reading import iter_decoded_lines
from ..inputs.io import iter_jsonl

logger = logging.getLogger(__name__)
OnMissing = Literal["skip", "error"]
ON_MISSING = ("skip", "error")
BEIR_LAYOUT = "corpus.jsonl, queries.jsonl and qrels/<split>.tsv"
QUERY_COLUMNS = ("query", "anchor", "question")
POSITIVE_COLUMNS = ("positive", "positives", "answer", "document")
# pytrec_eval (mteb's scorer) takes a C int, raises a bare SystemError beyond a C long, and holds about 8 bytes per
# grade up to the largest (1e6: 8 MB; 2**31 - 1: 17 GB). Real qrels grade 0-4, LLM-judged ones up to 100.
RELEVANCE_RANGE = (-(2**31), 10**6)


# the shape of a line, shown in the message about a bad line
CORPUS_EXAMPLE = '{"_id": "d1", "title": "...", "text": "..."}'
QUERY_EXAMPLE = '{"_id": "q1", "text": "..."}'


class RetrievalDataError(ValueError):
    """Retrieval data (BEIR folder, qrels, training pairs, teacher scores) cannot be used; the message says why."""


def doc_text(title: str | None, text: str) -> str:
    """A document as the model reads it: `title + " " + text`, stripped (mteb's and BEIR's convention)."""
    return f"{title} {text}".strip() if title else text.strip()


def content_id(prefix: str, text: str) -> str:
    return prefix + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


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


def _check_beir_layout(folder: Path, split: str) -> Path:
    """The qrels file of `split` in the BEIR folder `folder`; refuses a folder without corpus, queries or that file
    (naming the splits it has), without reading them."""
    if not folder.is_dir():
        state = "is a file, not a folder" if folder.exists() else "does not exist"
        raise RetrievalDataError(f"BEIR folder {folder} {state} (expected a folder with {BEIR_LAYOUT})")
    qrels_file = folder / "qrels" / f"{split}.tsv"
    for path in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_file):
        if path.is_dir():
            raise RetrievalDataError(f"BEIR folder {folder}: {path.relative_to(folder)} is a folder; it must be "
                                     f"a file (a BEIR folder holds {BEIR_LAYOUT})")
    missing = [str(p.relative_to(folder)) for p in (folder / "corpus.jsonl", folder / "queries.jsonl", qrels_file)
               if not p.is_file()]
    if missing:
        available = sorted(p.stem for p in (folder / "qrels").glob("*.tsv")) if (folder / "qrels").is_dir() else []
        hint = f"; qrels splits present: {', '.join(available)}" if available else ""
        raise RetrievalDataError(
            f"BEIR folder {folder} is missing {', '.join(missing)} (a BEIR folder holds {BEIR_LAYOUT}){hint}"
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
    qrels_file = _check_beir_layout(folder, split)
    corpus = read_beir_corpus(folder / "corpus.jsonl")
    all_queries = read_beir_queries(folder / "queries.jsonl")
    if not all_queries:
        raise RetrievalDataError(f"{folder / 'queries.jsonl'} holds no query; add the queries of qrels/{split}.tsv")
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
        raise RetrievalDataError(f"{qrels_file}: no query with a relevant document remains")
    queries = {qid: all_queries[qid] for qid in positives}
    return RetrievalData(corpus, queries, positives, name=folder.resolve().name, split=split, report=dict(report))


def drop_blank_queries(data: RetrievalData) -> RetrievalData:
    """`data` without its queries whose text is blank (there is nothing to encode; scored, each would count as a
    query that finds nothing), counted in `report["blank_queries"]` and logged as finetune's reader logs them
    ("dropped 2 blank queries").

    Raises:
        RetrievalDataError: every query of the split is blank.
    """
    blank = {qid for qid, text in data.queries.items() if not text.strip()}
    if not blank:
        return data
    if len(blank) == len(data.queries):
        raise RetrievalDataError(f"{data.name} ({data.split}): all {len(blank)} queries with a relevant document have "
                                 "blank text in queries.jsonl; give them their text")
    logger.warning("%s (%s): dropped %d blank queries (e.g. ids %s): queries.jsonl gives them no text",
                   data.name, data.split, len(blank), sorted(blank)[:3])
    keep = [qid for qid in data.queries if qid not in blank]
    return dataclasses.replace(
        data, queries={qid: data.queries[qid] for qid in keep}, qrels={qid: data.qrels[qid] for qid in keep},
        report={**data.report, "blank_queries": len(blank)},
    )


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


def beir_records(path: Path, example: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a BEIR/training JSONL file with their place `file:line` (`inputs.io.iter_jsonl`)."""
    return iter_jsonl(path, error=RetrievalDataError, example=example)


def _string_field(record: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    """The string at `key` of a JSONL record (a number is taken as text for an id); an id is stripped, as qrels
    cells are, so that `"d1 "` in corpus.jsonl is the `d1` the qrels name."""
    value = record.get(key)
    if value is None and not required:
        return ""
    if isinstance(value, int | float) and not isinstance(value, bool) and key.endswith("id"):
        return str(value)
    if not isinstance(value, str):
        raise RetrievalDataError(f"{where}: field {key!r} must be a string, got {value!r:.60}")
    return value.strip() if key.endswith("id") else value


def read_beir_corpus(path: Path) -> dict[str, dict[str, str]]:
    corpus: dict[str, dict[str, str]] = {}
    for where, record in beir_records(path, CORPUS_EXAMPLE):
        doc_id = _string_field(record, "_id", where)
        if doc_id in corpus:
            raise RetrievalDataError(f"{where}: duplicate document id {doc_id!r}")
        corpus[doc_id] = {
            "title": _string_field(record, "title", where, required=False),
            "text": _string_field(record, "text", where),
        }
    if not corpus:
        raise RetrievalDataError(f"{path} holds no document; add one JSON object per line, e.g. "
                                 f"{CORPUS_EXAMPLE}")
    return corpus


def read_beir_queries(path: Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for where, record in beir_records(path, QUERY_EXAMPLE):
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


def _qrels_rows(path: Path) -> Iterator[tuple[int, str, str, str]]:
    """`(line, query-id, corpus-id, score text)` per line of a qrels TSV, cells stripped; blank lines and a header
    (the first non-blank line, when its score is no number) are skipped. Cells are split on tabs only, without csv
    quoting: an id may start with `"`."""
    first = True
    for line_no, line in iter_decoded_lines(str(path)):
        if not line.strip():
            continue
        row = line.split("\t")
        if len(row) == 4:  # TREC qrels: qid iteration docid relevance
            row = [row[0], row[2], row[3]]
        if len(row) != 3:
            raise RetrievalDataError(
                f"{path}:{line_no}: expected 3 tab-separated columns (query-id, corpus-id, score), "
                f"got {len(row)}"
            )
        qid, doc_id, score = (cell.strip() for cell in row)
        if first and not _is_number(score):  # the header line
            first = False
            continue
        first = False
        yield line_no, qid, doc_id, score


def read_qrels(path: str | os.PathLike, value_type: type = int) -> dict[str, dict[str, Any]]:
    """Read a TSV of `query-id <TAB> corpus-id <TAB> score` (header optional; TREC's 4-column form also accepted).
    A (query-id, corpus-id) pair given again with another score keeps the later line's score, with a warning that
    names both lines.

    Args:
        path: the file.
        value_type: `int` for relevance judgements, `float` for teacher scores.

    Raises:
        RetrievalDataError: naming `file:line`: a score that is no finite number, or with `int` a relevance that is
            no whole number or lies outside `RELEVANCE_RANGE`; a line without 3 (or TREC's 4) columns; no line.
    """
    path = Path(path)
    out: dict[str, dict[str, Any]] = {}
    conflicts: list[tuple[int, str, str, Any, Any]] = []  # (later line, query, document, earlier, later score)
    for line_no, qid, doc_id, score in _qrels_rows(path):
        try:
            value = float(score)
        except ValueError:
            raise RetrievalDataError(f"{path}:{line_no}: score {score!r} is not a finite number") from None
        if not math.isfinite(value):  # an inf teacher score makes every weight NaN
            raise RetrievalDataError(f"{path}:{line_no}: score {score!r} is not a finite number")
        if value_type is int and not value.is_integer():  # int() would make a 0.5 "not relevant"
            raise RetrievalDataError(f"{path}:{line_no}: relevance {score!r} is not a whole number; qrels grade "
                                     "relevance in integers (0 = not relevant)")
        if value_type is int and not RELEVANCE_RANGE[0] <= value <= RELEVANCE_RANGE[1]:
            raise RetrievalDataError(f"{path}:{line_no}: relevance {score!r} is out of range; qrels grade relevance "
                                     f"in integers from {RELEVANCE_RANGE[0]} to {RELEVANCE_RANGE[1]} (0 = not "
                                     "relevant)")
        docs = out.setdefault(qid, {})
        if doc_id in docs and docs[doc_id] != value_type(value):
            conflicts.append((line_no, qid, doc_id, docs[doc_id], value_type(value)))
        docs[doc_id] = value_type(value)
    if not out:
        raise RetrievalDataError(f"{path} holds no (query-id, corpus-id, score) line")
    if conflicts:
        _warn_conflicts(path, conflicts)
    return out


def _warn_conflicts(path: Path, conflicts: list[tuple[int, str, str, Any, Any]]) -> None:
    """One warning for the pairs `read_qrels` found twice with different scores, the first one's two lines named
    (the earlier line is found by reading the file again up to the later one: only when there is a conflict)."""
    later, qid, doc_id, before, after = conflicts[0]
    earlier = max(n for n, q, d, _ in _qrels_rows(path) if n < later and (q, d) == (qid, doc_id))
    logger.warning(
        "%s: %d (query-id, corpus-id) pair(s) are given again with another score, e.g. query %r document %r: line %d "
        "score %s, line %d score %s; the later line's score (%s) is kept: remove the line you do not mean",
        path, len(conflicts), qid, doc_id, earlier, before, later, after, after,
    )


def read_teacher_scores(path: str | os.PathLike) -> dict[str, dict[str, float]]:
    """Cross-encoder scores for distillation: a TSV `query-id <TAB> corpus-id <TAB> score` (header optional)."""
    path = Path(path)
    if not path.is_file():
        raise RetrievalDataError(f"teacher score file {path} does not exist")
    return read_qrels(path, value_type=float)


__all__ = [
    "ON_MISSING", "RetrievalData", "RetrievalDataError", "doc_text", "drop_blank_queries", "is_beir_folder", "read_beir",
    "read_qrels", "read_teacher_scores"
]
