"""Exact hybrid search throughput of `HybridIndex` (flat) vs faiss `IndexFlatIP` over 768-d dense vectors.

For each corpus size N (default 10^4 and 10^5 documents), synthetic vectors shaped like DupMAE's representation:

- documents: a dense part of d' = 384 float32 (standard normal) + k = 384 sparse (vocabulary id, weight) pairs.
  The ids of a document are k distinct ids out of |V| = 30522 drawn without replacement from a Zipf-like
  distribution (p(rank r) ∝ 1 / (r + 1)^s, s = 1, ranks randomly assigned to ids), as the top-k OT entries of real
  text concentrate on frequent word pieces; weights are log-normal (positive, like max-pooled logits).
- queries (a batch of ``--queries``, default 64): a dense part of 384 float32 and either
  ``full`` -- the full OT vector mu, a dense (Q, |V|) float32 array (DupMAE's default: eq. 12 reads mu_q at the
  document's ids) -- or ``topk`` -- the query's top-``--query-top-k`` (default 384) entries, Zipf ids as above (a
  ``query_top_k`` model), passed as CSR.
- baseline: `faiss.IndexFlatIP(768)` holding N standard-normal 768-d float32 vectors, searched with a batch of the same
  number of 768-d queries.

Reported per N and query mode: queries/s of `HybridIndex.search(query_dense, query_sparse, top_n=10)` (exact,
``index_type="flat"``) and of `IndexFlatIP.search(queries, 10)` twice -- as configured out of the box (faiss 1.15
scans a batch below `distance_compute_blas_threshold` = 128000 queries query by query with SIMD) and forced onto its
BLAS path (threshold 0 for the call: sgemm + top-k, about 10x faster for 64 queries here) -- the ratios (target: at
least 0.5; the BLAS path is the stronger baseline), and a breakdown of the hybrid score's two parts computed outside
the index on the same arrays (numpy matmul for the dense part, scipy CSR · dense / CSR · CSR for the sparse part). One
untimed burn-in search each, then ``--repeats`` interleaved timed searches (hybrid, faiss, faiss BLAS, dense part,
sparse part, hybrid, ...); median. Exactness: for ``--verify-queries`` queries the index's top-10 is compared with a
float64 brute-force computation of eq. 12 over all documents: same ids in the same order, or -- where two documents'
true scores lie within float32 rounding (1e-5 of the score) -- a swap of those two; the index's scores within that
tolerance of the float64 ones.

Memory per document: `index.memory_bytes_per_document()` (declared), bytes on disk after `index.save()` (the
manifest's files, with and without the ids file), and the growth of this process's resident set while the index
was filled (after the first search merges the pending rows), against 768 · 4 = 3072 bytes for the dense baseline
(also measured the same way).

    python benchmarks/hybrid_search.py                       # N = 10^4 and 10^5, both query modes (~2 min)
    python benchmarks/hybrid_search.py --quick               # N = 10^4, 16 queries, 2 repeats
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # before torch and faiss: environment defaults
import faiss
import numpy as np
import scipy
import scipy.sparse as sp
import torch
from common import VOCAB_SIZE, cpu_counters, log, median_or_none, other_processes_cpu_share
from retromae.trainers.retrieval.hybrid_index import HybridIndex

BASELINE_DIM = 768
TARGET = 0.5  # hybrid queries/s >= 0.5 x faiss IndexFlatIP(768)
ZIPF_EXPONENT = 1.0
ADD_CHUNK = 10_000
# float32 rounding of a sum of 384 + 384 products: ~1e-7-1e-6 of the score; a search that misses a document errs
# by the spacing of the true scores near rank 10 (~1e-3 of the score here), far above this tolerance
SCORE_TOLERANCE = 1e-5  # relative to the largest true score among the checked queries  # documents per HybridIndex.add call (as HybridIndex.build adds per encoded chunk)


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic data
# ---------------------------------------------------------------------------------------------------------------------


class ZipfVocabulary:
    """p(rank r) ∝ (r + 1)^-s over the vocabulary, ranks assigned to ids by a random permutation (frequent word
    pieces are not the low ids)."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.ids_by_rank = rng.permutation(VOCAB_SIZE).astype(np.int32)
        weights = (np.arange(VOCAB_SIZE) + 1.0) ** -ZIPF_EXPONENT
        self.cdf = np.cumsum(weights / weights.sum())

    def sample(self, num_rows: int, k: int, rng: np.random.Generator, block: int = 4096) -> np.ndarray:
        """`(num_rows, k)` int32: per row, k distinct ids drawn without replacement ∝ p.

        Successive sampling: draw with replacement and keep the first k distinct ids in draw order (the same
        distribution as drawing without replacement ∝ p); rows with fewer than k distinct draws are redrawn longer.
        """
        out = np.empty((num_rows, k), np.int32)
        for start in range(0, num_rows, block):
            pending, draws_per_row = np.arange(min(block, num_rows - start)), 4 * k
            while len(pending):
                uniform = rng.random((len(pending), draws_per_row))
                ranks = np.minimum(np.searchsorted(self.cdf, uniform * self.cdf[-1], side="right"), VOCAB_SIZE - 1)
                order = np.argsort(ranks, axis=1, kind="stable")  # equal ranks keep draw order
                in_order = np.take_along_axis(ranks, order, 1)
                first_sorted = np.ones(ranks.shape, bool)
                first_sorted[:, 1:] = in_order[:, 1:] != in_order[:, :-1]
                first = np.empty_like(first_sorted)
                np.put_along_axis(first, order, first_sorted, 1)  # first occurrence of each id, in draw order
                done = first.sum(1) >= k
                chosen = first & (np.cumsum(first, 1) <= k)
                out[start + pending[done]] = self.ids_by_rank[ranks[done][chosen[done]].reshape(-1, k)]
                pending, draws_per_row = pending[~done], 2 * draws_per_row
        return out


def lognormal(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    return np.exp(0.5 * rng.standard_normal(shape, dtype=np.float32))


def make_corpus(num_docs: int, args, vocabulary: ZipfVocabulary, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "dense": rng.standard_normal((num_docs, args.dense_dim), dtype=np.float32),
        "ids": vocabulary.sample(num_docs, args.doc_top_k, rng),
        "weights": lognormal((num_docs, args.doc_top_k), rng),
        "baseline": rng.standard_normal((num_docs, BASELINE_DIM), dtype=np.float32),
    }


def make_queries(args, vocabulary: ZipfVocabulary, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    q, k = args.queries, args.query_top_k
    ids = vocabulary.sample(q, k, rng)
    topk = sp.csr_matrix(
        (lognormal((q * k,), rng), ids.reshape(-1), np.arange(0, q * k + 1, k)), shape=(q, VOCAB_SIZE)
    )
    return {
        "dense": rng.standard_normal((q, args.dense_dim), dtype=np.float32),
        "full": rng.standard_normal((q, VOCAB_SIZE), dtype=np.float32),  # the full mu: every vocabulary entry
        "topk": topk,
        "baseline": rng.standard_normal((q, BASELINE_DIM), dtype=np.float32),
    }


# ---------------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------------


def rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return 1024 * int(line.split()[1])
    except OSError:
        pass
    return None


def release_free_memory() -> None:
    """gc, then glibc's malloc_trim(0): freed heap memory goes back to the OS, so RSS counts live memory only."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_growth(before: int | None) -> int | None:
    release_free_memory()
    after = rss_bytes()
    return None if before is None or after is None else after - before


def folder_bytes(folder: Path, exclude: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name not in exclude)


# ---------------------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------------------


def build_hybrid(corpus: dict[str, np.ndarray], args) -> tuple[HybridIndex, float]:
    index = HybridIndex(args.dense_dim, VOCAB_SIZE, args.doc_top_k, index_type="flat")
    tick = time.perf_counter()
    for start in range(0, len(corpus["dense"]), ADD_CHUNK):
        stop = start + ADD_CHUNK
        index.add(
            [str(i) for i in range(start, min(stop, len(corpus["dense"])))],
            dense=corpus["dense"][start:stop],
            sparse_indices=corpus["ids"][start:stop],
            sparse_values=corpus["weights"][start:stop],
        )
    return index, time.perf_counter() - tick


def brute_force_check(
    index: HybridIndex, corpus: dict[str, np.ndarray], q_dense: np.ndarray, q_sparse: Any, top_n: int, count: int
) -> dict[str, Any]:
    """The index's top-n for the first `count` queries vs eq. 12 computed in float64 over every document."""
    q_dense, q_sparse = q_dense[:count], q_sparse[:count]
    num_docs, k = corpus["ids"].shape
    docs = sp.csr_matrix(
        (corpus["weights"].reshape(-1).astype(np.float64), corpus["ids"].reshape(-1), np.arange(0, num_docs * k + 1, k)),
        shape=(num_docs, VOCAB_SIZE),
    )
    query_sparse = q_sparse.astype(np.float64)
    sparse_scores = docs @ query_sparse.T  # (N, count)
    sparse_scores = sparse_scores.toarray() if sp.issparse(sparse_scores) else np.asarray(sparse_scores)
    exact = q_dense.astype(np.float64) @ corpus["dense"].astype(np.float64).T + sparse_scores.T  # (count, N)
    expected = np.argsort(-exact, axis=1, kind="stable")[:, :top_n]
    scores, positions = index.search(q_dense, q_sparse, top_n)
    ids = np.array([[int(index.ids[p]) for p in row] for row in positions])
    identical = (ids == expected).all(axis=1)
    exact_of_returned = np.take_along_axis(exact, ids, 1)  # float64 eq. 12 of what the index returned
    # rank by rank, the returned document's true score vs the true top-n: 0 when the lists are equal; within float32
    # rounding of the index's scores when two documents (nearly) tie and swap places
    rank_gap = float(np.abs(exact_of_returned - np.take_along_axis(exact, expected, 1)).max())
    score_error = float(np.abs(scores - exact_of_returned).max())  # the index's scores vs float64
    tolerance = SCORE_TOLERANCE * float(np.abs(exact_of_returned).max())
    return {
        "queries_checked": count,
        "queries_with_identical_top_n": int(identical.sum()),
        "max_rank_score_gap": rank_gap,
        "max_abs_score_error": score_error,
        "tolerance": tolerance,
        "mismatches": [
            {"query": int(q), "index_ids": ids[q].tolist(), "brute_force_ids": expected[q].tolist(),
             "index_ids_true_scores": exact_of_returned[q].tolist(),
             "brute_force_true_scores": np.take_along_axis(exact, expected, 1)[q].tolist()}
            for q in np.flatnonzero(~identical)
        ],
        "exact": rank_gap <= tolerance and score_error <= tolerance,
    }


def faiss_search_blas(index: faiss.Index, queries: np.ndarray, n: int):
    """`index.search` forced onto faiss's BLAS path (sgemm + top-k) instead of its per-query SIMD scan.

    faiss uses BLAS only when a batch has at least `distance_compute_blas_threshold` queries; the default of the
    installed faiss is recorded in the JSON (128000 for faiss 1.15, so a 64-query batch takes the SIMD scan).
    """
    default = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 0
    try:
        return index.search(queries, n)
    finally:
        faiss.cvar.distance_compute_blas_threshold = default


def time_interleaved(functions: dict[str, Any], repeats: int) -> dict[str, dict[str, Any]]:
    """Burn-in call of each, then `repeats` rounds calling each once; per function the seconds and others' CPU."""
    for function in functions.values():
        function()
    seconds: dict[str, list[float]] = {name: [] for name in functions}
    others: dict[str, list[float | None]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            tick, counters = time.perf_counter(), cpu_counters()
            function()
            elapsed = time.perf_counter() - tick
            seconds[name].append(elapsed)
            others[name].append(other_processes_cpu_share(counters, cpu_counters(), elapsed))
    return {
        name: {"seconds_all": seconds[name], "seconds": statistics.median(seconds[name]),
               "other_processes_cpu_share": median_or_none(others[name])}
        for name in functions
    }


def measure(num_docs: int, args, vocabulary: ZipfVocabulary, queries: dict[str, Any], workdir: Path) -> dict[str, Any]:
    log(f"N={num_docs}: generating the corpus")
    corpus = make_corpus(num_docs, args, vocabulary, seed=args.seed + num_docs)
    release_free_memory()
    before = rss_bytes()
    flat = faiss.IndexFlatIP(BASELINE_DIM)
    flat.add(corpus["baseline"])
    flat_rss = rss_growth(before)
    before = rss_bytes()
    index, add_seconds = build_hybrid(corpus, args)
    tick = time.perf_counter()
    index.search(queries["dense"][:1], queries["full"][:1], args.top_n)  # merges the pending rows (CSR, faiss)
    finalize_seconds = time.perf_counter() - tick
    hybrid_rss = rss_growth(before)
    saved = workdir / f"hybrid-{num_docs}"
    index.save(saved)
    faiss.write_index(flat, str(workdir / f"flat-{num_docs}.faiss"))
    memory = {
        "hybrid_declared": index.memory_bytes_per_document(),
        "hybrid_on_disk": folder_bytes(saved, exclude=("manifest.json", "ids.json")) / num_docs,
        "hybrid_on_disk_with_ids": folder_bytes(saved, exclude=("manifest.json",)) / num_docs,
        "hybrid_rss_growth": None if hybrid_rss is None else hybrid_rss / num_docs,
        "flat768_declared": BASELINE_DIM * 4,
        "flat768_on_disk": (workdir / f"flat-{num_docs}.faiss").stat().st_size / num_docs,
        "flat768_rss_growth": None if flat_rss is None else flat_rss / num_docs,
    }
    log(f"N={num_docs}: add {add_seconds:.1f} s, first search (merge) {finalize_seconds:.1f} s, "
        f"memory/doc declared {memory['hybrid_declared']} B, rss {memory['hybrid_rss_growth']}")

    docs_csr = sp.csr_matrix(
        (corpus["weights"].reshape(-1), corpus["ids"].reshape(-1),
         np.arange(0, num_docs * args.doc_top_k + 1, args.doc_top_k)),
        shape=(num_docs, VOCAB_SIZE),
    )
    result: dict[str, Any] = {
        "documents": num_docs,
        "add_seconds": add_seconds,
        "first_search_seconds": finalize_seconds,
        "memory_bytes_per_document": memory,
        "modes": {},
    }
    n = args.top_n
    for mode in args.mode_list:
        q_sparse = queries[mode]
        log(f"N={num_docs}: exactness check ({mode})")
        check = brute_force_check(index, corpus, queries["dense"], q_sparse, n, min(args.verify_queries, args.queries))

        def sparse_part(q_sparse=q_sparse):
            scores = docs_csr @ q_sparse.T
            return scores.toarray() if sp.issparse(scores) else scores

        functions = {
            "hybrid": lambda q_sparse=q_sparse: index.search(queries["dense"], q_sparse, n),
            "faiss_flat768": lambda: flat.search(queries["baseline"], n),
            "faiss_flat768_blas": lambda: faiss_search_blas(flat, queries["baseline"], n),
            "dense_part": lambda: queries["dense"] @ corpus["dense"].T,
            "sparse_part": sparse_part,
        }
        log(f"N={num_docs}: timing ({mode}, {args.repeats} interleaved repeats)")
        timings = time_interleaved(functions, args.repeats)
        for entry in timings.values():
            entry["queries_per_s"] = args.queries / entry["seconds"]
        hybrid, baseline = timings["hybrid"]["queries_per_s"], timings["faiss_flat768"]["queries_per_s"]
        blas = timings["faiss_flat768_blas"]["queries_per_s"]
        result["modes"][mode] = {
            "exactness": check,
            "timings": timings,
            "hybrid_vs_faiss_flat768": hybrid / baseline,
            "hybrid_vs_faiss_flat768_blas": hybrid / blas,
            "target": TARGET,
        }
        log(f"N={num_docs} {mode}: hybrid {hybrid:.1f} q/s, faiss {baseline:.1f} q/s (BLAS path {blas:.1f}), "
            f"ratio {hybrid / baseline:.3f} ({hybrid / blas:.3f}), exact {check['exact']} | "
            f"load {common.load_average()}")
    return result  # the index, the baseline and the corpus are freed with this frame


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------

MODE_LABELS = {"full": "full mu (dense Q×|V|)", "topk": "query_top_k={k} (CSR)"}


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    mode_label = {m: MODE_LABELS[m].format(k=env["query_top_k"]) for m in MODE_LABELS}
    lines = [
        f"## Hybrid search — {env['device_name']} (cpu), {env['queries']} queries per batch, top-{env['top_n']}, "
        f"d'={env['dense_dim']}, k={env['doc_top_k']}, |V|={VOCAB_SIZE}",
        "",
        f"numpy {env['numpy']}, scipy {env['scipy']}, faiss {env['faiss']}, torch {env['torch']}; threads: faiss "
        f"{env['faiss_threads']}, torch {env['torch_threads']}, BLAS {env['blas_threads']}; median of "
        f"{env['repeats']} interleaved batches after 1 burn-in; {env['date']}; load average "
        f"{env['load_average_start']} → {env['load_average_end']}",
        "",
        "### Queries/s (exact top-10), HybridIndex (flat) vs faiss IndexFlatIP(768)",
        "",
        "| docs | query sparse part | HybridIndex q/s | IndexFlatIP(768) q/s, default³ | ratio | target | "
        "IndexFlatIP(768) q/s, BLAS path³ | ratio | target | exact¹ | dense part alone q/s² | sparse part alone q/s² | "
        "others' CPU⁰ |",
        "|---:|---|---:|---:|---:|---|---:|---:|---|---|---:|---:|---:|",
    ]
    for run in report["runs"]:
        for mode, entry in run["modes"].items():
            t, check = entry["timings"], entry["exactness"]
            ratio, ratio_blas = entry["hybrid_vs_faiss_flat768"], entry["hybrid_vs_faiss_flat768_blas"]
            share = t["hybrid"]["other_processes_cpu_share"]
            lines.append(
                f"| {run['documents']:,} | {mode_label[mode]} | {t['hybrid']['queries_per_s']:.1f} | "
                f"{t['faiss_flat768']['queries_per_s']:.1f} | {ratio:.3f} | "
                f"≥ {entry['target']:g}: {'met' if ratio >= entry['target'] else 'MISSED'} | "
                f"{t['faiss_flat768_blas']['queries_per_s']:.1f} | {ratio_blas:.3f} | "
                f"≥ {entry['target']:g}: {'met' if ratio_blas >= entry['target'] else 'MISSED'} | "
                f"{'yes' if check['exact'] else 'NO'} ({check['queries_with_identical_top_n']}/"
                f"{check['queries_checked']} identical, max gap {check['max_rank_score_gap']:.1e}, "
                f"tolerance {check['tolerance']:.1e}) | "
                f"{t['dense_part']['queries_per_s']:.1f} | {t['sparse_part']['queries_per_s']:.1f} | "
                f"{'n/a' if share is None else f'{100 * share:.0f}%'} |"
            )
    lines += [
        "",
        "⁰ share of the machine's CPU time taken by other processes during the hybrid searches (median, /proc/stat).",
        "¹ against a float64 brute-force eq. 12 over all documents, for the checked queries: 'identical' = same top-10 "
        "ids in the same order; 'max gap' = largest difference, rank by rank, between the true (float64) score of "
        "the document the index returned and the true top-10 score (0 when identical; two documents whose true "
        "scores lie within float32 rounding may swap). Exact = max gap and the index's own score errors ≤ tolerance "
        f"= {SCORE_TOLERANCE:g} × the largest true score (float32 rounding of the index is ~1e-7–1e-6 of it; a missed "
        "document would cost the score spacing near rank 10, ~1e-3 of it).",
        "² the two terms of the hybrid score computed outside the index on the same arrays, no top-k: "
        f"numpy (Q×{env['dense_dim']})·({env['dense_dim']}×N); scipy CSR (N×|V|, k per row) · query sparse part.",
        f"³ faiss searches a batch with BLAS (sgemm + top-k) only when it has ≥ distance_compute_blas_threshold "
        f"queries (default here: {env['faiss_distance_compute_blas_threshold']}); below that, a per-query SIMD scan. "
        "'default' = `IndexFlatIP.search` as configured out of the box; 'BLAS path' = the same index and queries with "
        "the threshold set to 0 for the call. The BLAS path is the stronger baseline where it is faster.",
        "",
        "### Memory per document (bytes)",
        "",
        "| docs | HybridIndex declared⁴ | on disk (+ ids) | RSS growth | IndexFlatIP(768): 768·4 | on disk | RSS growth | "
        "hybrid / dense |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        m = run["memory_bytes_per_document"]

        def fmt(value):
            return "n/a" if value is None else f"{value:,.0f}"

        lines.append(
            f"| {run['documents']:,} | {m['hybrid_declared']:,} | {fmt(m['hybrid_on_disk'])} "
            f"({fmt(m['hybrid_on_disk_with_ids'])}) | {fmt(m['hybrid_rss_growth'])} | {m['flat768_declared']:,} | "
            f"{fmt(m['flat768_on_disk'])} | {fmt(m['flat768_rss_growth'])} | "
            f"{m['hybrid_declared'] / m['flat768_declared']:.2f} |"
        )
    lines += [
        "",
        "⁴ `index.memory_bytes_per_document()`: d'·4 + k·(4+4) + 8 (CSR row pointer). On disk: the dense, CSR and "
        "(in brackets) ids files over N. RSS growth: this process's resident set after filling the index (and its "
        "first search, which merges the pending rows) minus before, over N; it includes Python's document-id strings "
        "and allocator slack.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--docs", default="10000,100000", help="comma-separated corpus sizes")
    parser.add_argument("--queries", type=int, default=64, help="queries per search batch")
    parser.add_argument("--top-n", type=int, default=10)
    parser.add_argument("--dense-dim", type=int, default=384, help="d' of the hybrid dense part")
    parser.add_argument("--doc-top-k", type=int, default=384, help="k sparse entries per document")
    parser.add_argument("--query-top-k", type=int, default=384, help="sparse entries per query in the topk mode")
    parser.add_argument("--modes", default="full,topk", help="query sparse parts: full (mu), topk (query_top_k)")
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per variant (median reported)")
    parser.add_argument("--verify-queries", type=int, default=16, help="queries checked against brute force")
    parser.add_argument("--threads", type=int, default=None, help="faiss / torch / BLAS threads (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: 10^4 documents, 16 queries, 2 repeats")
    parser.add_argument("--output", default=str(common.RESULTS_DIR / "hybrid_search.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.queries, args.repeats = "10000", 16, 2
    args.doc_list = [int(x) for x in args.docs.split(",") if x.strip()]
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODE_LABELS for m in args.mode_list) or not args.mode_list:
        parser.error(f"--modes: choose from {', '.join(MODE_LABELS)}")
    if min(args.doc_list, default=0) < args.top_n or args.queries < 1 or args.repeats < 1 or args.top_n < 1:
        parser.error("--docs must be >= --top-n >= 1; --queries and --repeats >= 1")
    for name in ("doc_top_k", "query_top_k"):
        if not 1 <= getattr(args, name) <= VOCAB_SIZE:
            parser.error(f"--{name.replace('_', '-')} must lie in [1, {VOCAB_SIZE}]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        import threadpoolctl

        faiss.omp_set_num_threads(args.threads)
        torch.set_num_threads(args.threads)
        threadpoolctl.threadpool_limits(args.threads)
    try:
        import threadpoolctl

        blas_threads = sorted({p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"})
    except ImportError:
        blas_threads = None
    started = time.perf_counter()
    environment = {
        "device": "cpu",
        **common.machine_facts(torch.device("cpu")),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "faiss": faiss.__version__,
        "torch": torch.__version__,
        "faiss_threads": faiss.omp_get_max_threads(),
        "faiss_distance_compute_blas_threshold": faiss.cvar.distance_compute_blas_threshold,
        "torch_threads": torch.get_num_threads(),
        "blas_threads": blas_threads,
        "queries": args.queries,
        "top_n": args.top_n,
        "dense_dim": args.dense_dim,
        "doc_top_k": args.doc_top_k,
        "query_top_k": args.query_top_k,
        "zipf_exponent": ZIPF_EXPONENT,
        "repeats": args.repeats,
    }
    log(f"{environment['device_name']} | faiss {faiss.__version__} | threads faiss {environment['faiss_threads']} "
        f"torch {environment['torch_threads']} BLAS {blas_threads} | load {environment['load_average_start']}")
    vocabulary = ZipfVocabulary(args.seed)
    queries = make_queries(args, vocabulary, seed=args.seed + 1)
    report: dict[str, Any] = {"environment": environment, "runs": []}
    with tempfile.TemporaryDirectory(prefix="hybrid-search-") as workdir:
        for num_docs in args.doc_list:
            report["runs"].append(measure(num_docs, args, vocabulary, queries, Path(workdir)))
            gc.collect()
    common.finish_report(report, started, render, Path(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
