"""What `retromae export --format sparse` (a plain SparseEncoder, not exact to DupMAE) loses against the exact hybrid
export on SciFact dev: NDCG@10, MRR@10, Recall@100, exact search at L=256, for (a) the hybrid (eq. 12), (b) its dense
part, (c) its sparse part mu, (d) the SparseEncoder, (e) the dense export + (d) as eq. 12. Assumes DupMAE continued
from all-MiniLM-L6-v2 on the SciFact corpus (--steps of 8 abstracts, L=256, lr 5e-5, BoW weight 0.1, encoder lr x 0.1;
no fine-tuning) with ot_activation log1p_relu, the only setting whose mu the SparseEncoder's log(1 + relu) can equal.

    python benchmarks/sparse_export_scifact.py              # whole corpus; resumable (checkpoint, exports, chunks kept)
    python benchmarks/sparse_export_scifact.py --docs 2560  # judged documents + a seeded sample (whole chunks)
    python benchmarks/sparse_export_scifact.py --quick      # 20 steps, 300 documents, 20 dev queries
"""

from __future__ import annotations

import json
import random
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import common  # before torch: environment defaults
import numpy as np
import scipy.sparse as sp
import torch
from common import RESULTS_DIR, ROOT, SCIFACT, argument_parser, finish_report, log, utc_now

MAX_SEQ_LENGTH, BATCH_SIZE, ENCODE_CHUNK, OVERLAP_K = 256, 32, 256, 64
OUT = ROOT / ".dev" / "sparse_export"
OUTPUT = RESULTS_DIR / "sparse_export_scifact.json"
PRETRAIN_DONE = ".pretrain_done"
FORMATS = ("hybrid", "dense", "sparse")
ROWS = {"a": "hybrid export (eq. 12)", "b": "hybrid export, dense part", "c": "hybrid export, sparse part (mu)",
        "d": "SparseEncoder export", "e": "dense export + SparseEncoder (eq. 12)"}
METRIC_KEYS = {"ndcg@10": "ndcg_at_10", "mrr@10": "mrr_at_10", "recall@100": "recall_at_100"}


# ---- pre-training and exports (the `retromae` CLI) -------------------------------------------------------------------


def pretrain_args(corpus: Path, steps: int, activation: str) -> list[str]:
    """README's continued pre-training (324 steps of 8 abstracts, L=256, lr 5e-5) with the recipe's encoder lr x 0.1."""
    options = {"bow_loss_weight": 0.1, "ot_activation": activation}
    return ["--method", "dupmae", "--method_options", json.dumps(options), "--encoder_lr_scale", "0.1",
            "--corpus", str(corpus), "--model", str(common.base_model_path()), "--max_seq_length", str(MAX_SEQ_LENGTH),
            "--per_device_train_batch_size", "8", "--max_steps", str(steps), "--learning_rate", "5e-5",
            "--warmup_steps", "0.1", "--logging_steps", "10", "--seed", "42", "--include_num_input_tokens_seen", "true",
            "--report_to", "none", "--disable_tqdm", "true", "--no_export"]


def pretrain(run: Path, corpus: Path, steps: int, activation: str) -> dict[str, Any]:
    """`retromae pretrain` into `run/pretrained`, skipped when finished, resumed from its last checkpoint."""
    from retromae.trainers.training.run_folder import last_complete_checkpoint

    output = run / "pretrained"
    if not (output / PRETRAIN_DONE).is_file():
        log(f"pre-training {output} ({steps} steps, ot_activation {activation}) ...")
        flags = ["--output_dir", str(output), "--save_steps", "50", "--save_total_limit", "1"]
        if last_complete_checkpoint(output) is not None:
            flags += ["--resume-from-checkpoint", "last"]
        elif output.is_dir():
            flags += ["--overwrite_output_dir"]  # stopped before its first checkpoint
        common.retromae_cli("pretrain", pretrain_args(corpus, steps, activation) + flags, run / "pretrain.log")
        (output / PRETRAIN_DONE).write_text("ok\n")
    state_file = output / "trainer_state.json"  # the run's own, else its last checkpoint's
    state = common.read_json(state_file if state_file.is_file() else last_complete_checkpoint(output) / state_file.name)
    runtime = next((e["train_runtime"] for e in reversed(state["log_history"]) if "train_runtime" in e), None)
    return {"folder": str(common.shown(output)), "global_step": state["global_step"], "train_runtime_s": runtime}


def export(run: Path, fmt: str) -> Path:
    """`retromae export RUN OUT --format FMT`, skipped when the folder is there."""
    folder = run / f"export-{fmt}"
    if not (folder / "modules.json").is_file():
        log(f"retromae export --format {fmt} ...")
        common.retromae_cli("export", [str(run / "pretrained"), str(folder), "--format", fmt, "--overwrite"],
                            run / "export.log")
    return folder


# ---- encoding (cached per chunk of documents in the run folder) ------------------------------------------------------


def save_arrays(path: Path, arrays: dict[str, Any]) -> None:
    """numpy arrays and scipy CSR matrices (as `<name>:data`, `:indices`, `:indptr`, `:shape`) into one .npz."""
    plain = {}
    for name, value in arrays.items():
        if sp.issparse(value):
            value = value.tocsr()
            plain.update({f"{name}:data": value.data, f"{name}:indices": value.indices, f"{name}:indptr": value.indptr,
                          f"{name}:shape": np.array(value.shape)})
        else:
            plain[name] = np.asarray(value)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **plain)
    tmp.replace(path)


def load_arrays(path: Path) -> dict[str, Any]:
    raw = dict(np.load(path))
    arrays = {k: v for k, v in raw.items() if ":" not in k}
    for name in {k.split(":")[0] for k in raw if ":" in k}:
        arrays[name] = sp.csr_matrix((raw[f"{name}:data"], raw[f"{name}:indices"], raw[f"{name}:indptr"]),
                                     shape=tuple(raw[f"{name}:shape"]))
    return arrays


def to_csr(matrix: torch.Tensor) -> sp.csr_matrix:
    coo = matrix.coalesce().cpu()
    rows, cols = coo.indices().numpy()
    return sp.csr_matrix((coo.values().float().numpy(), (rows, cols)), shape=tuple(coo.shape))


class Encoder:
    """One export's encoder: `key` names its cache files. hybrid: documents' W h and top-k(mu), queries' W h and full
    mu (both times sqrt(lambda), as `HybridIndex.build` takes them), mu under `activation` (see `score`); dense: the
    dense export's vectors; sparse: the SparseEncoder's, documents at its `max_active_dims` (= doc_top_k), queries with
    every active entry (its card's advice: DupMAE keeps a query's full mu)."""

    def __init__(self, fmt: str, folder: Path, activation: str | None = None):
        self.fmt, self.folder, self.activation = fmt, folder, activation
        self.key = f"{fmt}-{activation}" if activation else fmt
        self._model = None

    @property
    def model(self):
        if self._model is None:
            from retromae.trainers.export.dupmae import load_dupmae_sentence_transformer
            from retromae.trainers.retrieval.hybrid_parts import dupmae_pooling
            from sentence_transformers import SentenceTransformer, SparseEncoder

            if self.fmt == "hybrid":
                self._model = load_dupmae_sentence_transformer(self.folder, device="cpu")
                dupmae_pooling(self._model).ot_activation = self.activation
            else:
                self._model = (SparseEncoder if self.fmt == "sparse" else SentenceTransformer)(str(self.folder),
                                                                                             device="cpu")
            self._model.max_seq_length = MAX_SEQ_LENGTH
        return self._model

    def documents(self, texts: list[str]) -> dict[str, Any]:
        from retromae.trainers.retrieval.hybrid_parts import document_parts, dupmae_pooling

        if self.fmt == "hybrid":
            outputs = self.model.encode_document(texts, batch_size=BATCH_SIZE, output_value=None)
            parts = document_parts(outputs, dupmae_pooling(self.model))
            return {"dense": parts["dense"], "idx": parts["sparse_indices"], "val": parts["sparse_values"]}
        if self.fmt == "dense":
            return {"vec": self.model.encode_document(texts, batch_size=BATCH_SIZE, convert_to_numpy=True)}
        return {"vec": to_csr(self.model.encode_document(texts, batch_size=BATCH_SIZE))}

    def queries(self, texts: list[str]) -> dict[str, Any]:
        from retromae.trainers.retrieval.hybrid_parts import as_numpy, dupmae_pooling, queries_sparse

        if self.fmt == "hybrid":
            outputs = self.model.encode_query(texts, batch_size=BATCH_SIZE, output_value=None)
            return {"dense": np.stack([as_numpy(o["dense_embedding"]) for o in outputs]),
                    "sparse": np.asarray(queries_sparse(outputs, dupmae_pooling(self.model)), np.float32)}
        if self.fmt == "dense":
            return {"vec": self.model.encode_query(texts, batch_size=BATCH_SIZE, convert_to_numpy=True)}
        vocab = self.model.get_embedding_dimension()
        return {"vec": to_csr(self.model.encode_query(texts, batch_size=BATCH_SIZE, max_active_dims=vocab)),
                "max_active_dims": np.array(self.model.max_active_dims or -1)}


def cached(path: Path, make) -> dict[str, Any]:
    """`make()`'s arrays with the seconds it took, kept in `path`."""
    if path.is_file():
        return load_arrays(path)
    started = time.perf_counter()
    arrays = make()
    arrays["seconds"] = np.array(time.perf_counter() - started)
    save_arrays(path, arrays)
    return arrays


def encode_all(cache: Path, encoders: list[Encoder], docs: list[str], queries: list[str]) -> dict[str, dict]:
    """Every encoder's queries, then its documents chunk by chunk (all encoders per chunk, so a run stopped midway
    leaves every encoder the same documents to score: rerun with --docs). Per encoder: the arrays, documents stacked,
    and the seconds of each part."""
    cache.mkdir(parents=True, exist_ok=True)
    out = {e.key: {"queries": cached(cache / f"{e.key}-queries.npz", lambda e=e: e.queries(queries)), "docs": []}
           for e in encoders}
    started = time.perf_counter()
    for number, first in enumerate(range(0, len(docs), ENCODE_CHUNK)):
        chunk = docs[first:first + ENCODE_CHUNK]
        for e in encoders:
            path = cache / f"{e.key}-docs-{number:04d}.npz"
            out[e.key]["docs"].append(cached(path, lambda e=e, chunk=chunk: e.documents(chunk)))
        log(f"encoded {first + len(chunk)} / {len(docs)} documents ({time.perf_counter() - started:.0f} s)")
    result = {}
    for key, parts in out.items():
        names = [k for k in parts["docs"][0] if k != "seconds"]
        stacked = {n: (sp.vstack([d[n] for d in parts["docs"]], format="csr") if sp.issparse(parts["docs"][0][n])
                       else np.concatenate([d[n] for d in parts["docs"]])) for n in names}
        seconds = {"queries": round(float(parts["queries"]["seconds"]), 1),
                   "documents": round(sum(float(d["seconds"]) for d in parts["docs"]), 1)}
        result[key] = {**{f"q_{n}": v for n, v in parts["queries"].items() if n != "seconds"},
                       **{f"doc_{n}": v for n, v in stacked.items()}, "seconds": seconds}
    return result


# ---- scoring ---------------------------------------------------------------------------------------------------------


def doc_csr(idx: np.ndarray, val: np.ndarray, vocab: int) -> sp.csr_matrix:
    n, k = idx.shape
    return sp.csr_matrix((val.reshape(-1), idx.reshape(-1), np.arange(0, n * k + 1, k)), shape=(n, vocab))


def sparse_dot(queries: Any, docs: sp.csr_matrix) -> np.ndarray:
    """`(Q, N)` sum_i q[i] d[i]."""
    scores = docs @ (queries.T if sp.issparse(queries) else np.asarray(queries).T)
    return np.asarray(scores.toarray() if sp.issparse(scores) else scores, np.float32).T


def ranked(scores: np.ndarray) -> list[list[int]]:
    """Each query's 100 best documents (ties as pytrec_eval breaks them: `RunningTopK`)."""
    from retromae.trainers.retrieval.metrics import RunningTopK

    top = RunningTopK(scores.shape[0])
    top.add(torch.from_numpy(scores), 0)
    return top.ranking()


def metrics_row(key: str, scores: np.ndarray, qrels: list[dict[int, int]]) -> tuple[dict[str, Any], list[list[int]]]:
    from retromae.trainers.retrieval.metrics import retrieval_metrics

    ranking = ranked(scores)
    values = retrieval_metrics(ranking, qrels)
    return {"row": key, "label": ROWS[key], **{METRIC_KEYS[m]: round(v, 5) for m, v in values.items()},
            "queries": len(qrels)}, ranking


def top_entries(idx: np.ndarray, val: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` largest positive entries of one vector, as ids and weights."""
    keep = val > 0
    idx, val = idx[keep], val[keep]
    order = np.argsort(-val, kind="stable")[:k]
    return idx[order], val[order]


def vector_agreement(hybrid: dict[str, Any], sparse_docs: sp.csr_matrix, scale: float) -> dict[str, Any]:
    """Documents' top-64 positive entries of mu (c) and of the SparseEncoder (d): mean |C ∩ D| / max(|C|, |D|), and
    on the shared ids the absolute weight differences (mu divided by the hybrid's sqrt(lambda))."""
    overlaps, diffs, c_active, d_active = [], [], [], []
    for row in range(sparse_docs.shape[0]):
        c_idx, c_val = top_entries(hybrid["doc_idx"][row], hybrid["doc_val"][row] / scale, OVERLAP_K)
        start, stop = sparse_docs.indptr[row], sparse_docs.indptr[row + 1]
        d_idx, d_val = top_entries(sparse_docs.indices[start:stop], sparse_docs.data[start:stop], OVERLAP_K)
        shared, c_at, d_at = np.intersect1d(c_idx, d_idx, return_indices=True)
        overlaps.append(len(shared) / max(len(c_idx), len(d_idx), 1))
        diffs.extend(np.abs(c_val[c_at] - d_val[d_at]).tolist())
        c_active.append(int((hybrid["doc_val"][row] > 0).sum()))
        d_active.append(stop - start)
    return {"top64_overlap_mean": round(float(np.mean(overlaps)), 4),
            "top64_overlap_min": round(float(np.min(overlaps)), 4),
            "identical_top64_sets": int(sum(o == 1.0 for o in overlaps)),
            "shared_weight_abs_diff_mean": float(np.mean(diffs)) if diffs else None,
            "shared_weight_abs_diff_max": float(np.max(diffs)) if diffs else None,
            "positive_entries_per_doc_mean": {"c": round(float(np.mean(c_active)), 1),
                                              "d": round(float(np.mean(d_active)), 1)}}


def query_agreement(hybrid: dict[str, Any], sparse_queries: sp.csr_matrix, scale: float) -> dict[str, Any]:
    """Queries' full vectors, mu (c) against the SparseEncoder's (d): positive entries of each, and the entries whose
    weights differ by more than 1e-3 (where a [CLS] / [SEP] logit is the largest: SparseEncoder pools them too)."""
    c, d = hybrid["q_sparse"] / scale, sparse_queries.toarray()
    return {"query_positive_entries_mean": {"c": round(float((c > 0).sum(1).mean()), 1),
                                            "d": round(float((d > 0).sum(1).mean()), 1)},
            "query_entries_differing_mean": round(float((np.abs(c - d) > 1e-3).sum(1).mean()), 1)}


def difference(rows: dict[str, dict[str, Any]], first: str, second: str) -> dict[str, float]:
    return {m: round(rows[first][m] - rows[second][m], 5) for m in METRIC_KEYS.values()}


def hybrid_index_check(hybrid: dict[str, Any], ids: list[str], ranking: list[list[int]]) -> float:
    """Row (a) through `HybridIndex` (flat, exact eq. 12): the mean top-10 overlap with our own scoring."""
    from retromae.trainers.retrieval.hybrid_index import HybridIndex

    index = HybridIndex(hybrid["doc_dense"].shape[1], hybrid["q_sparse"].shape[1], hybrid["doc_idx"].shape[1])
    index.add(ids, hybrid["doc_dense"], hybrid["doc_idx"], hybrid["doc_val"])
    _, positions = index.search(hybrid["q_dense"], hybrid["q_sparse"], top_n=10)
    return round(float(np.mean([len(set(p) & set(r[:10])) / 10 for p, r in zip(positions.tolist(), ranking,
                                                                                strict=True)])), 4)


def load_data(data: Path, max_docs: int | None) -> tuple[list[str], list[str], list[str], list[dict[int, int]]]:
    """Document ids and texts, dev query texts and their judgements by document position. The documents in a fixed
    order: every judged one, then the others shuffled (seed 0); `max_docs` keeps the first whole chunks of that order
    that hold at least `max_docs` (None: the whole corpus). Exact search: the order changes only how ties break."""
    from retromae.trainers.retrieval.beir import doc_text, read_beir_corpus, read_beir_queries, read_qrels

    corpus = read_beir_corpus(data / "corpus.jsonl")
    judged = read_qrels(data / "qrels" / "dev.tsv")
    all_queries = read_beir_queries(data / "queries.jsonl")
    qids = [q for q in all_queries if q in judged]
    needed = {d for q in qids for d in judged[q]}
    others = [d for d in corpus if d not in needed]
    random.Random(0).shuffle(others)
    ids = [d for d in corpus if d in needed] + others
    if max_docs is not None:
        ids = ids[:-(-max_docs // ENCODE_CHUNK) * ENCODE_CHUNK]
    position = {doc_id: i for i, doc_id in enumerate(ids)}
    qrels = [{position[d]: rel for d, rel in judged[q].items() if d in position} for q in qids]
    docs = [doc_text(corpus[d].get("title"), corpus[d]["text"]) for d in ids]
    return ids, docs, [all_queries[q] for q in qids], qrels


def score(args, data: Path, activations: list[str]) -> list[dict[str, Any]]:
    """Pre-train with the first ot_activation, export three ways, score rows (a)-(e) per ot_activation. A further
    activation re-encodes the same hybrid export with its DupMAEPooling's `ot_activation` set to it: pre-training
    never reads the field (the BoW loss takes mu before it: `DupMAEForPretraining.ot_embedding`), and the dense and
    sparse exports do not depend on it."""
    run = OUT / f"{'quick' if args.quick else 'full'}-{activations[0]}-{args.steps}"
    run.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, Any] = {}
    started = time.perf_counter()
    pretraining = pretrain(run, data / "corpus.jsonl", args.steps, activations[0])
    seconds["pretrain_this_invocation"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    folders = {fmt: export(run, fmt) for fmt in FORMATS}
    seconds["export_this_invocation"] = round(time.perf_counter() - started, 1)
    ids, docs, queries, qrels = load_data(data, args.docs)
    log(f"{len(ids)} documents, {len(queries)} dev queries")
    config = json.loads(next(folders["hybrid"].glob("*DupMAEPooling/config.json")).read_text())
    if config["ot_activation"] != activations[0]:
        raise RuntimeError(f"{folders['hybrid']} has ot_activation {config['ot_activation']}, not {activations[0]}")
    weight = float(config["sparse_weight"])
    encoders = [*(Encoder("hybrid", folders["hybrid"], a) for a in activations), Encoder("dense", folders["dense"]),
                Encoder("sparse", folders["sparse"])]
    enc = encode_all(run / "encoded", encoders, docs, queries)
    seconds["encode"] = {key: value["seconds"] for key, value in enc.items()}
    dense, sparse = enc["dense"], enc["sparse"]
    sparse_d = sparse_dot(sparse["q_vec"], sparse["doc_vec"])
    fused = dense["q_vec"] @ dense["doc_vec"].T + weight * sparse_d
    parts = []
    for activation in activations:
        hybrid = enc[f"hybrid-{activation}"]
        hybrid_docs = doc_csr(hybrid["doc_idx"], hybrid["doc_val"], hybrid["q_sparse"].shape[1])
        dense_h = hybrid["q_dense"] @ hybrid["doc_dense"].T  # sqrt(lambda) is in both sparse sides
        sparse_h = sparse_dot(hybrid["q_sparse"], hybrid_docs)
        scores = {"a": dense_h + sparse_h, "b": dense_h, "c": sparse_h, "d": sparse_d, "e": fused}
        rows, rankings = {}, {}
        for key, matrix in scores.items():
            rows[key], rankings[key] = metrics_row(key, np.ascontiguousarray(matrix, np.float32), qrels)
            log(f"{activation} ({key}) {ROWS[key]}: {rows[key]}")
        checks = {
            "hybrid_index_top10_overlap_with_a": hybrid_index_check(hybrid, ids, rankings["a"]),
            "dense_export_max_abs_diff_from_hybrid_dense": float(np.abs(dense["doc_vec"] - hybrid["doc_dense"]).max()),
            "sparse_encoder_max_active_dims": int(sparse["q_max_active_dims"]), "doc_top_k": int(config["doc_top_k"]),
            **vector_agreement(hybrid, sparse["doc_vec"], weight**0.5),
            **query_agreement(hybrid, sparse["q_vec"], weight**0.5),
        }
        log(f"{activation}: {checks}")
        parts.append({"ot_activation": activation, "pretrained_with": activations[0], "sparse_weight": weight,
                      "documents": len(ids), "queries": len(queries),
                      "run_folder": str(common.shown(run)), "pretraining": pretraining, "seconds": seconds,
                      "rows": [{"ot_activation": activation, **row} for row in rows.values()],
                      "differences": {"d_minus_c": difference(rows, "d", "c"), "e_minus_a": difference(rows, "e", "a")},
                      "checks": checks})
    return parts


def render(report: dict[str, Any]) -> str:
    env, first = report["environment"], report["activations"][0]
    lines = [f"SciFact dev ({first['queries']} queries), exact search over {first['documents']} documents, "
             f"L={MAX_SEQ_LENGTH}; DupMAE pre-trained {env['steps']} steps (ot_activation {first['pretrained_with']}), "
             "no fine-tuning",
             "", "| ot_activation | row | NDCG@10 | MRR@10 | Recall@100 |", "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['ot_activation']} | ({r['row']}) {r['label']} | {r['ndcg_at_10']:.4f} | "
                     f"{r['mrr_at_10']:.4f} | {r['recall_at_100']:.4f} |")
    for part in report["activations"]:
        for name, diff in part["differences"].items():
            lines.append(f"| {part['ot_activation']} | {name.replace('_minus_', ' − ')} | {diff['ndcg_at_10']:+.4f} | "
                         f"{diff['mrr_at_10']:+.4f} | {diff['recall_at_100']:+.4f} |")
    lines.append("")
    for part in report["activations"]:
        c = part["checks"]
        diff = c["shared_weight_abs_diff_mean"]
        lines.append(f"{part['ot_activation']}: documents' top-64 overlap (c) vs (d) {c['top64_overlap_mean']:.4f} "
                     f"(min {c['top64_overlap_min']:.4f}, identical {c['identical_top64_sets']}); mean |weight "
                     f"difference| on shared ids {'-' if diff is None else f'{diff:.2e}'}; HybridIndex top-10 "
                     f"agreement with (a) {c['hybrid_index_top10_overlap_with_a']:.4f}; queries: positive entries "
                     f"(c) {c['query_positive_entries_mean']['c']} / (d) {c['query_positive_entries_mean']['d']}, "
                     f"entries differing by > 1e-3 {c['query_entries_differing_mean']}")
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="20 steps on a 300-document SciFact, 20 dev queries")
    parser.add_argument("--steps", type=int, default=None, help="pre-training steps (default 324, --quick 20)")
    parser.add_argument("--docs", type=int, default=None,
                        help=f"score over the judged documents and a seeded sample of the others, N in all rounded\n"
                             f"up to whole chunks of {ENCODE_CHUNK} (default: the whole corpus)")
    parser.add_argument("--ot-activation", default="log1p_relu",
                        help="comma-separated, the first pre-trained with (default log1p_relu); a further one (none:\n"
                             "DupMAE's default) re-encodes the same hybrid export with it")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"default {common.shown(OUTPUT)} (--quick: .dev/sparse_export/quick.json)")
    args = parser.parse_args()
    args.steps = args.steps or (20 if args.quick else 324)
    output = args.output or (OUT / "quick.json" if args.quick else OUTPUT)
    activations = [a.strip() for a in args.ot_activation.split(",") if a.strip()]
    started, load_start = time.perf_counter(), common.load_average()
    data = common.make_quick_beir(OUT / "quick") if args.quick else SCIFACT
    parts = score(args, data, activations)
    report: dict[str, Any] = {
        "environment": {"cpu": common.device_name(torch.device("cpu")), "threads": torch.get_num_threads(),
                        "date": utc_now(), "torch": torch.__version__,
                        "sentence_transformers": version("sentence-transformers"), "steps": args.steps,
                        "ot_activation": activations[0] if len(activations) == 1 else activations,
                        "quick": args.quick, "load_average_start": load_start},
        "data": {"corpus": str(common.shown(data / "corpus.jsonl")), "split": "dev", "max_seq_length": MAX_SEQ_LENGTH,
                 "documents_scored": parts[0]["documents"], "docs_flag": args.docs},
        "rows": [row for part in parts for row in part["rows"]],
        "activations": parts,
    }
    finish_report(report, started, render, output)


if __name__ == "__main__":
    main()
