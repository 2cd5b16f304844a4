"""Encode throughput of an exported CLS model (sentence-transformers) relative to a raw `BertModel` forward.

The exported model is what `retromae export` writes (Transformer + Pooling(cls), dot product): we pre-train nothing,
we wrap a BERT of the chosen size as a RetroMAE pre-training checkpoint (`RetroMAEForPretraining.
from_encoder_checkpoint`), save it and export it with `export_sentence_transformer`, then load the folder with
`SentenceTransformer`. Both sides encode the same documents in the same batches:

- ``st``: `model.encode_document(texts, batch_size=B)`: tokenization, length sorting, forward, CLS pooling, copy to
  numpy, all included (what a user pays).
- ``raw``: `BertModel(add_pooling_layer=False)` with the same weights under `torch.inference_mode()`, on the same
  length-sorted batches, tokenized up front (tokenization excluded), `last_hidden_state[:, 0]`.
- ``raw+tok``: the raw forward with per-batch tokenization included (the like-for-like reference).

Runs are interleaved (st, raw, raw+tok, st, ...) so that load drift on a shared machine hits all of them; the
median of `--repeats` runs is reported as documents/s, with the ratios st/raw (target >= 0.95) and st/raw+tok. The
embeddings of st and raw are compared (max abs difference). Documents: SciFact's corpus (../shared/data) when
present, else the built-in corpus. Results: a printed table and ``benchmarks/results/encode_throughput.json``.

    python benchmarks/encode_throughput.py                 # MiniLM-size BERT (all-MiniLM-L6-v2 weights)
    python benchmarks/encode_throughput.py --size tiny     # a tiny random BERT (smoke run)
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # before torch: environment defaults
import torch
from common import benchmark_documents

RESULTS = common.RESULTS_DIR / "encode_throughput.json"
TARGET = 0.95


def build_export(size: str, workdir: Path) -> Path:
    """A RetroMAE pre-training checkpoint of the chosen size, exported by `retromae export`'s code path."""
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining
    from retromae.trainers.export.sentence_transformer import export_sentence_transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    minilm = str(common.base_model_path())
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    if size == "tiny":
        torch.manual_seed(0)
        base = workdir / "tiny-bert"
        BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=37), add_pooling_layer=False).save_pretrained(base)
        tokenizer.save_pretrained(base)
        base = str(base)
    else:
        base = minilm  # 6 layers, hidden 384: the real all-MiniLM-L6-v2 weights
    checkpoint = workdir / "checkpoint"
    RetroMAEForPretraining.from_encoder_checkpoint(base).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    (checkpoint / "retromae_run.json").write_text(json.dumps({"max_seq_length": 256, "base_model": "bench"}))
    return export_sentence_transformer(checkpoint, workdir / "export")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=["minilm", "tiny"], default="minilm")
    parser.add_argument("--docs", type=int, default=512, help="documents per run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per variant (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="result JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from sentence_transformers import SentenceTransformer
    from transformers import BertModel

    texts, source = benchmark_documents(args.docs)
    with tempfile.TemporaryDirectory(prefix="encode-bench-") as tmp:
        export = build_export(args.size, Path(tmp))
        model = SentenceTransformer(str(export), device="cpu")
        model.max_seq_length = args.max_seq_length
        bert = BertModel.from_pretrained(str(export), add_pooling_layer=False).eval()
        tokenizer = model.tokenizer

    # the same batches as sentence-transformers: sorted by length (longest first), then cut into batch_size
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = [[texts[i] for i in order[s:s + args.batch_size]] for s in range(0, len(texts), args.batch_size)]

    def tokenize(batch):
        return tokenizer(batch, padding=True, truncation=True, max_length=args.max_seq_length, return_tensors="pt")

    pretokenized = [tokenize(b) for b in batches]

    def run_st():
        return model.encode_document(texts, batch_size=args.batch_size, show_progress_bar=False)

    def run_raw(tokenized=pretokenized):
        with torch.inference_mode():
            return torch.cat([bert(**features).last_hidden_state[:, 0] for features in tokenized])

    def run_raw_tok():
        with torch.inference_mode():
            return torch.cat([bert(**tokenize(b)).last_hidden_state[:, 0] for b in batches])

    variants = {"st": run_st, "raw": run_raw, "raw+tok": run_raw_tok}
    st_emb, raw_emb = torch.as_tensor(run_st()), run_raw()  # burn-in + correctness
    restored = torch.empty_like(raw_emb)
    restored[torch.tensor(order)] = raw_emb
    max_diff = float((st_emb - restored).abs().max())
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, fn in variants.items():
            started = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - started)
    docs_per_s = {name: len(texts) / statistics.median(t) for name, t in times.items()}
    ratio = docs_per_s["st"] / docs_per_s["raw"]
    ratio_tok = docs_per_s["st"] / docs_per_s["raw+tok"]

    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": "cpu", "dtype": "float32", "threads": torch.get_num_threads(), "platform": platform.platform(),
        "python": sys.version.split()[0], "torch": torch.__version__,
        "size": args.size, "documents": len(texts), "source": source, "batch_size": args.batch_size,
        "max_seq_length": args.max_seq_length, "repeats": args.repeats,
        "seconds": times, "docs_per_s": docs_per_s,
        "ratio_st_over_raw": ratio, "ratio_st_over_raw_with_tokenization": ratio_tok, "target": TARGET,
        "max_abs_diff_st_vs_raw_cls": max_diff,
    }
    common.write_result(args.output, result)
    print(f"encode throughput: {args.size} BERT export (CLS), {len(texts)} docs ({source}), batch {args.batch_size}, "
          f"max length {args.max_seq_length}, cpu float32, {torch.get_num_threads()} threads, median of {args.repeats}")
    print(f"{'variant':34s} {'docs/s':>9s} {'ms/doc':>8s}")
    labels = {"st": "sentence-transformers encode", "raw": "raw BertModel forward (pre-tok.)",
              "raw+tok": "raw BertModel forward + tokenize"}
    for name, rate in docs_per_s.items():
        print(f"{labels[name]:34s} {rate:9.1f} {1000 / rate:8.2f}")
    verdict = "meets" if ratio >= TARGET else "BELOW"
    print(f"ratio st / raw = {ratio:.3f} ({verdict} the {TARGET}x target); st / raw+tokenize = {ratio_tok:.3f}; "
          f"max |st - raw CLS| = {max_diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
