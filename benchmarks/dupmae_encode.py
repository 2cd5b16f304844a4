"""Encode throughput of the exported DupMAE sentence-transformers model vs the CLS export of the same encoder.

One random-initialised DupMAE pre-training model per size (vocab 30522; MiniLM size 384/6/12/1536, BERT-base size
768/12/12/3072; the real all-MiniLM-L6-v2 tokenizer) is exported twice:

- ``cls``: `export_from_model` of a `RetroMAEForPretraining` holding the very same weights (DupMAE's state dict loads
  into it strictly): Transformer + Pooling(cls), a `hidden_size`-d vector per document. The baseline.
- ``dupmae``: `build_dupmae_sentence_transformer` (Transformer + the remote-code `DupMAEPooling`): dense part
  W^cls h (384-d) + the OT vector mu over the vocabulary, kept at its top-k (384) entries for documents.

Both encode the same documents with `model.encode_document(texts, batch_size=B)` (tokenization, length sorting,
forward, pooling and the copy to numpy included: what a user pays), same batch size and maximum length. Reported:

- ``dupmae``: the default output, ``sentence_embedding`` = [dense ; top-k-sparsified mu scattered into |V|] (the
  vector whose dot product is the paper's eq. 12). **The target row**: docs/s ≥ 0.8 × ``cls``.
- ``dupmae (index path)``: `output_value=None`, i.e. every per-document output of the module (dense part, top-k ids
  and weights, ...): what `HybridIndex.build` calls. Information only.

Runs are interleaved (cls, dupmae, dupmae-index, cls, ...) after one untimed burn-in run of each, so load drift on a
shared machine hits all of them; the median of ``--repeats`` runs is reported. The analytic compute limit beside the
ratio: mu needs the tied MLM head (transform 2d² + vocabulary projection 2d|V| FLOPs) at every token, on top of the
encoder's n(8d² + 4dI + 4Ld) per token, so docs/s can be at most encoder / (encoder + head) of the CLS export's
(about 0.5x at MiniLM size and 0.78x at BERT-base size, L≈256).

Documents: the first ``--docs`` documents (title + text) of ../shared/data/scifact/corpus.jsonl when present, else
passages of the built-in corpus (`retromae.trainers.data.builtin.builtin_corpus`). Results: a markdown table on stdout and
``benchmarks/results/dupmae_encode.json``.

    python benchmarks/dupmae_encode.py            # MiniLM and base size (~8 min on 2 shared CPU cores)
    python benchmarks/dupmae_encode.py --quick    # smoke run: MiniLM size, 32 documents, 1 repeat
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # before torch: environment defaults
import numpy as np
import torch
from common import SIZES, VOCAB_SIZE, benchmark_documents, load_tokenizer, log

TARGET = 0.8  # DupMAE docs/s >= 0.8 x the CLS export's
DENSE_DIM, DOC_TOP_K = 384, 384  # DupMAE paper defaults (DupMAEConfig defaults)
DEFAULT_DOCS = {"minilm": 64, "base": 32}
VARIANTS = ("cls", "dupmae", "dupmae_index")
VARIANT_LABELS = {
    "cls": "CLS export (Transformer + Pooling cls)",
    "dupmae": "DupMAE export, encode_document (dense ⊕ top-k mu)",
    "dupmae_index": "DupMAE export, output_value=None (index path)",
}


# ---------------------------------------------------------------------------------------------------------------------
# Data and models
# ---------------------------------------------------------------------------------------------------------------------


def build_exports(size: str, tokenizer, max_seq_length: int, workdir: Path, seed: int):
    """(CLS SentenceTransformer, DupMAE SentenceTransformer) over the same random-initialised encoder."""
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer, export_from_model
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(seed)
    shape = {"vocab_size": VOCAB_SIZE, **SIZES[size]}
    dupmae = DupMAEForPretraining(
        DupMAEConfig(
            **shape, dense_dim=DENSE_DIM, doc_top_k=DOC_TOP_K, mask_token_id=tokenizer.mask_token_id,
            special_token_ids=list(tokenizer.all_special_ids),
        )
    ).eval()
    # the same weights as a RetroMAE model (DupMAE = RetroMAE + OT decoding, no extra parameters), exported as CLS
    retromae = RetroMAEForPretraining(RetroMAEConfig(**shape, mask_token_id=tokenizer.mask_token_id)).eval()
    retromae.load_state_dict(dupmae.state_dict(), strict=True)
    cls_dir = export_from_model(retromae, tokenizer, workdir / f"cls-{size}", run_info={"max_seq_length": max_seq_length})
    cls_model = SentenceTransformer(str(cls_dir), device="cpu")
    dup_model = build_dupmae_sentence_transformer(
        dupmae, tokenizer, workdir / f"dupmae-{size}", max_seq_length=max_seq_length
    )
    dup_model.to("cpu")
    for model in (cls_model, dup_model):
        model.eval()
    check_same_encoder(cls_model, dup_model, max_seq_length)
    return cls_model, dup_model


def check_same_encoder(cls_model, dup_model, max_seq_length: int) -> None:
    """Both exports hold the same transformer weights and maximum length (else the comparison is void)."""
    cls_state, dup_state = cls_model[0].auto_model.state_dict(), dup_model[0].auto_model.state_dict()
    if cls_state.keys() != dup_state.keys() or any(not torch.equal(cls_state[k], dup_state[k]) for k in cls_state):
        raise RuntimeError("the CLS and DupMAE exports do not hold the same encoder weights")
    lengths = {cls_model.max_seq_length, dup_model.max_seq_length}
    if lengths != {max_seq_length}:
        raise RuntimeError(f"maximum lengths differ: {lengths}, expected {max_seq_length}")


def padded_tokens(tokenizer, texts: list[str], batch_size: int, max_seq_length: int) -> tuple[int, int, float]:
    """(real tokens, padded tokens, mean padded length) of the batches sentence-transformers forms (length-sorted)."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # ST sorts by text length, longest first
    real = padded = 0
    weighted_length = 0.0
    for start in range(0, len(texts), batch_size):
        batch = [texts[i] for i in order[start : start + batch_size]]
        mask = tokenizer(batch, truncation=True, max_length=max_seq_length, padding=True)["attention_mask"]
        real += sum(map(sum, mask))
        padded += len(mask) * len(mask[0])
        weighted_length += len(mask) * len(mask[0]) * len(mask[0])
    return real, padded, weighted_length / padded


def compute_limit(size: str, length: float) -> dict[str, float]:
    """Forward MFLOP per (padded) token of the CLS export and of the DupMAE export, and their ratio.

    DupMAE adds the MLM-head transform (2d²) and the vocabulary projection (2d|V|) at every position (the ordinary-
    token mask rides inside the chunked matmul, so padding and special positions cost a row too) plus W^cls (2dd',
    once per document, neglected) and the top-k (neglected).
    """
    d, n, inter = SIZES[size]["hidden_size"], SIZES[size]["num_hidden_layers"], SIZES[size]["intermediate_size"]
    encoder = n * common.layer_flops(d, inter, round(length))
    head = 2 * d * d + 2 * d * VOCAB_SIZE
    return {"cls": encoder / 1e6, "dupmae": (encoder + head) / 1e6, "limit": encoder / (encoder + head)}


# ---------------------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------------------


def run_variant(variant: str, cls_model, dup_model, texts: list[str], batch_size: int):
    kwargs = {"batch_size": batch_size, "show_progress_bar": False}
    if variant == "cls":
        return cls_model.encode_document(texts, **kwargs)
    if variant == "dupmae":
        return dup_model.encode_document(texts, **kwargs)
    return dup_model.encode_document(texts, output_value=None, **kwargs)


def check_outputs(outputs: dict[str, Any], hidden_size: int) -> dict[str, Any]:
    """Shapes of the outputs, and the document side really is top-k sparse."""
    cls_out, dup_out, index_out = outputs["cls"], outputs["dupmae"], outputs["dupmae_index"]
    if cls_out.shape[1] != hidden_size or dup_out.shape[1] != DENSE_DIM + VOCAB_SIZE:
        raise RuntimeError(f"unexpected shapes: cls {cls_out.shape}, dupmae {dup_out.shape}")
    nonzero = (np.asarray(dup_out)[:, DENSE_DIM:] != 0).sum(1)
    if nonzero.max() > DOC_TOP_K:
        raise RuntimeError(f"a document's sparse part has {nonzero.max()} > k={DOC_TOP_K} non-zero entries")
    if tuple(index_out[0]["sparse_indices"].shape) != (DOC_TOP_K,):
        raise RuntimeError(f"index path: sparse_indices {tuple(index_out[0]['sparse_indices'].shape)}")
    return {
        "cls_dim": int(cls_out.shape[1]),
        "dupmae_dim": int(dup_out.shape[1]),
        "dupmae_nonzero_sparse_entries_max": int(nonzero.max()),
        "dupmae_index_keys": sorted(index_out[0]),
    }


def measure(size: str, tokenizer, texts: list[str], args, workdir: Path) -> dict[str, Any]:
    log(f"{size}: building the exports")
    cls_model, dup_model = build_exports(size, tokenizer, args.max_seq_length, workdir, args.seed)
    real, padded, mean_length = padded_tokens(tokenizer, texts, args.batch_size, args.max_seq_length)
    outputs = {}
    for variant in VARIANTS:  # burn-in (first-call costs, allocator warm-up) + the outputs checked below
        tick = time.perf_counter()
        outputs[variant] = run_variant(variant, cls_model, dup_model, texts, args.batch_size)
        log(f"  {size} burn-in {variant}: {time.perf_counter() - tick:.1f} s")
    checks = check_outputs(outputs, SIZES[size]["hidden_size"])
    del outputs
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    others: dict[str, list[float | None]] = {v: [] for v in VARIANTS}
    for repeat in range(args.repeats):
        for variant in VARIANTS:
            tick, counters = time.perf_counter(), common.cpu_counters()
            run_variant(variant, cls_model, dup_model, texts, args.batch_size)
            elapsed = time.perf_counter() - tick
            seconds[variant].append(elapsed)
            others[variant].append(common.other_processes_cpu_share(counters, common.cpu_counters(), elapsed))
        times = ", ".join(f"{v} {seconds[v][-1]:.1f} s" for v in VARIANTS)
        log(f"  {size} repeat {repeat + 1}/{args.repeats}: {times} | load {common.load_average()}")
    limit = compute_limit(size, mean_length)
    result: dict[str, Any] = {
        "size": size,
        "documents": len(texts),
        "real_tokens": real,
        "padded_tokens": padded,
        "mean_padded_length": mean_length,
        "analytic_mflops_per_token": {"cls": limit["cls"], "dupmae": limit["dupmae"]},
        "compute_limit_vs_cls": limit["limit"],
        "checks": checks,
        "variants": {},
    }
    base = len(texts) / statistics.median(seconds["cls"])
    for variant in VARIANTS:
        docs_per_s = len(texts) / statistics.median(seconds[variant])
        result["variants"][variant] = {
            "seconds_all": seconds[variant],
            "docs_per_s": docs_per_s,
            "ms_per_doc": 1e3 / docs_per_s,
            "tokens_per_s": real / statistics.median(seconds[variant]),
            "vs_cls": docs_per_s / base,
            "other_processes_cpu_share": common.median_or_none(others[variant]),
        }
    result["variants"]["dupmae"]["target_vs_cls"] = TARGET
    del cls_model, dup_model
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        f"## DupMAE encode throughput — {env['device_name']} (cpu), fp32, batch {env['batch_size']}, "
        f"max length {env['max_seq_length']}",
        "",
        f"torch {env['torch']}, sentence-transformers {env['sentence_transformers']}, {env['threads']} threads, "
        f"1 burn-in + {env['repeats']} timed runs per variant (median, interleaved), {env['documents_source']}, "
        f"{env['date']}, load average {env['load_average_start']} → {env['load_average_end']}",
        "",
        "| size | variant | docs | mean padded L | docs/s | ms/doc | × CLS | compute limit¹ | target | others' CPU⁰ |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for run in report["runs"]:
        for variant, entry in run["variants"].items():
            ratio = entry["vs_cls"]
            target = ""
            if "target_vs_cls" in entry:
                ok = ratio >= entry["target_vs_cls"]
                target = f"≥ {entry['target_vs_cls']:g}: {'met' if ok else 'MISSED'}"
            limit = "1.00" if variant == "cls" else f"{run['compute_limit_vs_cls']:.2f}"
            share = entry["other_processes_cpu_share"]
            lines.append(
                f"| {run['size']} | {VARIANT_LABELS[variant]} | {run['documents']} | {run['mean_padded_length']:.0f} | "
                f"{entry['docs_per_s']:.2f} | {entry['ms_per_doc']:.1f} | {ratio:.2f} | {limit} | {target} | "
                f"{'n/a' if share is None else f'{100 * share:.0f}%'} |"
            )
    lines += [
        "",
        "⁰ median share of the machine's CPU time taken by other processes during the timed runs (from /proc/stat).",
        "¹ CLS forward FLOPs per token over DupMAE's: encoder n(8d²+4dI+4Ld) at the mean padded length vs encoder + "
        f"tied MLM head (2d² + 2d·{VOCAB_SIZE}) at every position, which mu (max over the ordinary tokens' vocabulary "
        "logits) needs. A compute-bound device approaches this ratio; the 0.8× target lies above it wherever the "
        "limit is < 0.8.",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--sizes", default="minilm,base", help=f"comma-separated, from {','.join(SIZES)}")
    parser.add_argument(
        "--docs", type=int, default=None,
        help=f"documents per run (default {', '.join(f'{k} {v}' for k, v in DEFAULT_DOCS.items())})",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per variant (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smoke run: minilm, 32 documents, 1 repeat")
    parser.add_argument("--output", default=str(common.RESULTS_DIR / "dupmae_encode.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = "minilm", 1
        args.docs = args.docs or 32
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.size_list if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {list(SIZES)}")
    if args.repeats < 1 or args.batch_size < 1 or (args.docs is not None and args.docs < 1):
        parser.error("--repeats, --batch-size and --docs must be >= 1")
    if not 8 < args.max_seq_length <= 512:
        parser.error("--max-seq-length must lie in (8, 512]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import sentence_transformers
    import transformers

    transformers.logging.set_verbosity_error()
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    max_docs = max(args.docs or DEFAULT_DOCS[size] for size in args.size_list)
    all_texts, source = benchmark_documents(max_docs)
    environment = {
        "device": "cpu",
        **common.machine_facts(torch.device("cpu")),
        "dtype": "fp32",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "threads": torch.get_num_threads(),
        "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length,
        "repeats": args.repeats,
        "dense_dim": DENSE_DIM,
        "doc_top_k": DOC_TOP_K,
        "documents_source": source,
    }
    log(f"{environment['device_name']} | torch {torch.__version__} | {environment['threads']} threads | "
        f"load {environment['load_average_start']} | {source}")
    tokenizer = load_tokenizer()
    report: dict[str, Any] = {"environment": environment, "runs": []}
    with tempfile.TemporaryDirectory(prefix="dupmae-encode-") as workdir:
        for size in args.size_list:
            texts = all_texts[: args.docs or DEFAULT_DOCS[size]]
            report["runs"].append(measure(size, tokenizer, texts, args, Path(workdir)))
    common.finish_report(report, started, render, Path(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
