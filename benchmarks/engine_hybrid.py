"""The Qdrant engine (`retromae index --engine qdrant`, embedded local mode) against our exact `HybridIndex` (flat).

Both indexes hold the same DupMAE-shaped vectors and are searched with eq. 12 (dense dot + sparse dot), top-10.
No trained DupMAE model exists on this machine, so the vectors are precomputed, not encoded:

- ``scifact``: the 5,183 SciFact documents and its 200 dev queries (../shared/data/scifact), tokenised with the
  all-MiniLM-L6-v2 WordPiece tokenizer (|V| = 30522). Dense part (d' = 128): the mean of fixed random N(0, 1)
  embeddings of the text's word pieces. Sparse part: the document's distinct word pieces weighted
  idf x (1 + log tf) x log-normal noise, its top k = 64 kept (fewer distinct pieces: zero-weight padding); a query's
  sparse part is its own distinct pieces weighted by idf (a `query_top_k`-style query). A bag-of-random-vectors
  "model": its NDCG@10 is only an agreement check between the engines, no quality figure.
- ``synthetic``: 100,000 documents of random vectors (d' = 128 N(0, 1); k = 64 distinct Zipf-drawn ids with
  log-normal weights) and ``--synthetic-queries`` queries (128 N(0, 1) + 16 Zipf ids).

Measured per corpus: mean top-10 overlap |Q ∩ H| / 10 (target >= 0.99), the largest score difference on shared
documents, NDCG@10 of each on SciFact dev (target: difference <= 0.002), queries/s of each (a batch of all queries;
HybridIndex: one `search` call, Qdrant: `query_batch_points`), build seconds and index size on disk.

Local mode scores sparse vectors in pure Python (a merge per document and query): queries with the full OT vector mu
(30522 entries) would cost minutes each there, hence the short sparse queries. A Qdrant server has an inverted index.

    python benchmarks/engine_hybrid.py            # both corpora (~5-10 min on 2 cores)
    python benchmarks/engine_hybrid.py --quick    # SciFact 50 queries, synthetic 10,000 documents
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import common  # noqa: F401  (before torch and faiss: environment defaults)
import numpy as np
from common import RESULTS_DIR, SCIFACT, VOCAB_SIZE, argument_parser, finish_report, load_tokenizer, log, utc_now
from retromae.trainers.retrieval.beir import doc_text, read_beir_corpus, read_beir_queries, read_qrels
from retromae.trainers.retrieval.engine_qdrant import QdrantClient, QdrantHybridIndex, qdrant_available
from retromae.trainers.retrieval.hybrid_index import HybridIndex
from retromae.trainers.retrieval.metrics import retrieval_metrics

DENSE_DIM, DOC_TOP_K, QUERY_TOP_K, TOP_N = 128, 64, 16, 10
MAX_TOKENS = 256
OUTPUT = RESULTS_DIR / "engine_hybrid.json"


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


# ---- vectors -------------------------------------------------------------------------------------------------------


def token_ids(tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
    special = set(tokenizer.all_special_ids)
    encoded = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=MAX_TOKENS)["input_ids"]
    return [np.array([t for t in ids if t not in special], np.int64) for ids in encoded]


def scifact_vectors(tokenizer: Any, doc_texts: list[str], query_texts: list[str], seed: int = 0) -> dict[str, Any]:
    """Dense + top-k sparse parts from the texts' word pieces (see the module docstring)."""
    rng = np.random.default_rng(seed)
    embeddings = rng.normal(size=(VOCAB_SIZE, DENSE_DIM)).astype(np.float32)
    docs, queries = token_ids(tokenizer, doc_texts), token_ids(tokenizer, query_texts)
    df = np.zeros(VOCAB_SIZE)
    for ids in docs:
        df[np.unique(ids)] += 1
    idf = np.log((len(docs) + 1) / (df + 0.5)).astype(np.float32)
    doc_idx = np.zeros((len(docs), DOC_TOP_K), np.int64)
    doc_val = np.zeros((len(docs), DOC_TOP_K), np.float32)
    for row, ids in enumerate(docs):
        unique, tf = np.unique(ids, return_counts=True)
        weights = idf[unique] * (1 + np.log(tf)) * rng.lognormal(0, 0.25, len(unique)).astype(np.float32)
        keep = np.argsort(-weights)[:DOC_TOP_K]
        pad = np.setdiff1d(np.arange(DOC_TOP_K + len(keep)), unique[keep])[: DOC_TOP_K - len(keep)]
        doc_idx[row] = np.concatenate([unique[keep], pad])
        doc_val[row, : len(keep)] = weights[keep]
    q_sparse = np.zeros((len(queries), VOCAB_SIZE), np.float32)
    for row, ids in enumerate(queries):
        q_sparse[row, np.unique(ids)] = idf[np.unique(ids)]
    dense = lambda rows: np.stack([embeddings[ids].mean(0) if len(ids) else np.zeros(DENSE_DIM, np.float32)  # noqa: E731
                                   for ids in rows]) * 4.0  # comparable in size to the sparse part
    return {"doc_dense": dense(docs), "doc_idx": doc_idx, "doc_val": doc_val, "q_dense": dense(queries),
            "q_sparse": q_sparse}


def zipf_ids(rng: np.random.Generator, rows: int, k: int) -> np.ndarray:
    """`rows` x `k` distinct ids per row, Zipf-like (p(rank r) ∝ 1 / (r + 1)) over a random ranking of the
    vocabulary: the first `k` distinct ids of repeated draws."""
    ranks = rng.permutation(VOCAB_SIZE)
    cdf = np.cumsum(1.0 / (np.arange(VOCAB_SIZE) + 1.0))
    out = np.zeros((rows, k), np.int64)
    for row in range(rows):
        draws = np.zeros(0, np.int64)
        while len(np.unique(draws)) < k:
            draws = np.concatenate([draws, np.searchsorted(cdf, rng.random(4 * k) * cdf[-1])])
        _, first = np.unique(draws, return_index=True)
        out[row] = ranks[draws[np.sort(first)[:k]]]
    return out


def synthetic_vectors(num_docs: int, num_queries: int, seed: int = 1) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    doc_idx = zipf_ids(rng, num_docs, DOC_TOP_K)
    q_idx = zipf_ids(rng, num_queries, QUERY_TOP_K)
    q_sparse = np.zeros((num_queries, VOCAB_SIZE), np.float32)
    np.put_along_axis(q_sparse, q_idx, rng.lognormal(0, 0.5, q_idx.shape).astype(np.float32), 1)
    return {"doc_dense": rng.normal(size=(num_docs, DENSE_DIM)).astype(np.float32) / DENSE_DIM**0.25,
            "doc_idx": doc_idx, "doc_val": rng.lognormal(0, 0.5, doc_idx.shape).astype(np.float32),
            "q_dense": rng.normal(size=(num_queries, DENSE_DIM)).astype(np.float32) / DENSE_DIM**0.25,
            "q_sparse": q_sparse}


# ---- the comparison ------------------------------------------------------------------------------------------------


def compare(name: str, v: dict[str, Any], ids: list[str], work: Path,
            qrels: list[dict[int, int]] | None = None) -> dict[str, Any]:
    """Build both indexes on `v`, search every query once (batch), compare the top-10s."""
    start = time.perf_counter()
    exact = HybridIndex(DENSE_DIM, VOCAB_SIZE, DOC_TOP_K)
    exact.add(ids, v["doc_dense"], v["doc_idx"], v["doc_val"])
    exact.save(work / f"{name}-faiss")
    exact_build = time.perf_counter() - start
    start = time.perf_counter()
    client = QdrantClient(path=str(work / f"{name}-qdrant" / "qdrant"))
    engine = QdrantHybridIndex(client, DENSE_DIM, VOCAB_SIZE, DOC_TOP_K)
    engine.create_collection()
    engine.defer_local_syncs()  # as `build_folder` does
    for s in range(0, len(ids), 10_000):
        engine.add(ids[s : s + 10_000], v["doc_dense"][s : s + 10_000], v["doc_idx"][s : s + 10_000],
                   v["doc_val"][s : s + 10_000])
        log(f"{name}: {min(s + 10_000, len(ids))} / {len(ids)} documents in Qdrant")
    qdrant_build = time.perf_counter() - start
    queries = (v["q_dense"], v["q_sparse"])
    start = time.perf_counter()
    h_scores, h_pos = exact.search(*queries, top_n=TOP_N)
    exact_seconds = time.perf_counter() - start
    start = time.perf_counter()
    q_scores, q_pos = engine.search(*queries, top_n=TOP_N)
    qdrant_seconds = time.perf_counter() - start
    engine.close()
    overlap = [len(set(a) & set(b)) / TOP_N for a, b in zip(q_pos.tolist(), h_pos.tolist(), strict=True)]
    diffs = [abs(qs - hs) for qr, qsr, hr, hsr in zip(q_pos, q_scores, h_pos, h_scores, strict=True)
             for p, qs in zip(qr, qsr, strict=True) for hp, hs in zip(hr, hsr, strict=True) if p == hp]
    num = len(v["q_dense"])
    row = {"corpus": name, "documents": len(ids), "queries": num,
           "top10_overlap": round(float(np.mean(overlap)), 4), "identical_top10_lists": int(
               sum(a == b for a, b in zip(q_pos.tolist(), h_pos.tolist(), strict=True))),
           "max_abs_score_diff": float(max(diffs)),
           "qps": {"faiss": round(num / exact_seconds, 1), "qdrant": round(num / qdrant_seconds, 2)},
           "build_seconds": {"faiss": round(exact_build, 1), "qdrant": round(qdrant_build, 1)},
           "index_bytes": {"faiss": folder_bytes(work / f"{name}-faiss"),
                           "qdrant": folder_bytes(work / f"{name}-qdrant")}}
    if qrels is not None:
        row["ndcg@10"] = {"faiss": round(retrieval_metrics(h_pos.tolist(), qrels)["ndcg@10"], 5),
                          "qdrant": round(retrieval_metrics(q_pos.tolist(), qrels)["ndcg@10"], 5)}
        row["ndcg@10_diff"] = round(abs(row["ndcg@10"]["faiss"] - row["ndcg@10"]["qdrant"]), 5)
    log(f"{name}: {row}")
    return row


def scifact_row(work: Path, max_queries: int | None) -> dict[str, Any]:
    corpus = read_beir_corpus(SCIFACT / "corpus.jsonl")
    ids = list(corpus)
    qrels_by_id = read_qrels(SCIFACT / "qrels" / "dev.tsv")
    all_queries = read_beir_queries(SCIFACT / "queries.jsonl")
    qids = [q for q in all_queries if q in qrels_by_id][:max_queries]
    position = {doc_id: i for i, doc_id in enumerate(ids)}
    qrels = [{position[d]: rel for d, rel in qrels_by_id[q].items() if d in position} for q in qids]
    texts = [doc_text(doc.get("title"), doc["text"]) for doc in corpus.values()]
    vectors = scifact_vectors(load_tokenizer(), texts, [all_queries[q] for q in qids])
    return compare("scifact", vectors, ids, work, qrels)


def render(report: dict[str, Any]) -> str:
    lines = ["| corpus | docs | queries | top-10 overlap | identical lists | max score diff | NDCG@10 faiss / qdrant "
             "(diff) | q/s faiss | q/s qdrant | build s faiss / qdrant | index MB faiss / qdrant |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ndcg = (f"{r['ndcg@10']['faiss']:.4f} / {r['ndcg@10']['qdrant']:.4f} ({r['ndcg@10_diff']:.4f})"
                if "ndcg@10" in r else "-")
        lines.append(f"| {r['corpus']} | {r['documents']} | {r['queries']} | {r['top10_overlap']:.4f} | "
                     f"{r['identical_top10_lists']}/{r['queries']} | {r['max_abs_score_diff']:.1e} | {ndcg} | "
                     f"{r['qps']['faiss']} | {r['qps']['qdrant']} | {r['build_seconds']['faiss']} / "
                     f"{r['build_seconds']['qdrant']} | {r['index_bytes']['faiss'] / 1e6:.1f} / "
                     f"{r['index_bytes']['qdrant'] / 1e6:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="SciFact 50 queries, synthetic 10,000 documents")
    parser.add_argument("--synthetic-docs", type=int, default=100_000)
    parser.add_argument("--synthetic-queries", type=int, default=10)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    if not qdrant_available():
        raise SystemExit('qdrant-client is not installed: pip install "retromae[qdrant]"')
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="engine-hybrid-"))
    report: dict[str, Any] = {
        "date": utc_now(), "qdrant_client": version("qdrant-client"),
        "vectors": "precomputed, no trained model: SciFact = bag of random word-piece embeddings (dense, d'=128) + "
                   "the documents' own MiniLM word pieces weighted idf x (1+log tf) x noise (top-64 sparse), queries "
                   "= their word pieces weighted by idf; synthetic = random normal dense + 64 Zipf ids (queries 16)",
        "engines": {"faiss": "HybridIndex flat: exact eq. 12 over all documents",
                    "qdrant": "QdrantHybridIndex, embedded local mode: dense top-100 + sparse top-100 prefetch, each "
                              "candidate rescored by both parts, FormulaQuery $score[0] + $score[1] (eq. 12)"},
        "environment": {"cpus": os.cpu_count()}, "rows": []}
    try:
        if SCIFACT.is_dir():
            report["rows"].append(scifact_row(work, 50 if args.quick else None))
        else:
            log(f"{SCIFACT} not found: SciFact skipped")
        n = 10_000 if args.quick else args.synthetic_docs
        report["rows"].append(compare("synthetic", synthetic_vectors(n, args.synthetic_queries),
                                      [str(i) for i in range(n)], work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    finish_report(report, started, render, args.output)


if __name__ == "__main__":
    main()
