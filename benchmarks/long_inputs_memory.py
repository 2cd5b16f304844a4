"""Peak memory of one training step at long inputs (L = 512, 2,048, 8,192) on CPU: does anything that grows as L^2
make long inputs impossible for the RetroMAE-family decoders?

Variants (each (variant, L) in a fresh subprocess, the same tiny random BERT for all: hidden 64, 2 layers, 2 heads,
intermediate 128, vocabulary 1,000, ``max_position_embeddings`` = the largest L):

- ``hf_mlm``: ``BertForMaskedLM`` with labels at 30% of the positions (the baseline: nothing of size L^2 with sdpa
  and no padding);
- ``retromae``: ``RetroMAEForPretraining``, enhanced decoding, ``decoder_visibility="token"`` (paper eq. 7);
- ``retromae_reference``: the same with ``decoder_visibility="reference"`` (the official collator's whole-word pool);
- ``dupmae``: ``DupMAEForPretraining`` (enhanced [CLS] decoding + OT bag-of-words decoding);
- ``seed``: ``SEEDEncoderForPretraining`` (3 decoder layers, window 2).

Batch: ``--batch-size`` (default 1) packed rows of exactly L random tokens ([CLS] ... [SEP], no padding), 30% of the
ordinary tokens masked for the encoder, every ordinary token a decoder target, words starting with probability 0.75.
Attention: sdpa everywhere; ``--attention-dropout`` (default 0.0) sets ``attention_probs_dropout_prob``: on CPU,
torch's fused (flash) sdpa kernel runs only without attention dropout, otherwise sdpa takes its math path, which
materialises (B, heads, L, L) scores, probabilities and dropout mask in every attention layer of every variant (the
baseline's encoder included), and that, not the decoder, then dominates.

Measured (the approach of ``pretrain_throughput.py``, with the same helpers ``reset_peak_rss`` / ``peak_rss_bytes``
from ``common``): a burn-in step (forward + backward + AdamW step, creating the optimizer state), then the peak
resident set size during one more step (``VmHWM`` of /proc/self/status, reset through /proc/self/clear_refs just
before it) minus the RSS before it. The probe runs with ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB, so glibc maps
every large tensor on its own and unmaps it when freed (a dynamic threshold would keep freed tensors of the burn-in
step in the heap, hiding part of the next step's peak). A probe that fails (out of memory, ``--probe-timeout``) is
recorded as infeasible with its reason; no number is made up for it.

A census (at the largest L, unless ``--no-census``) runs one further step under a ``TorchDispatchMode`` and lists every tensor an
op creates (forward and backward) with at least B * L * L / 16 elements: op, shape, dtype, bytes, how many times. It
names what grows as L^2, measured. An analytic table gives the bytes of each such tensor of the decoder path at
every L, before and after `visibility` and `two_stream` chunked them.

``--label`` names the run (e.g. ``before`` / ``after`` a change); the JSON keeps every label it was given, and the
Markdown shows each run's table and the comparison of ``before`` and ``after`` (else of the first and the last run
with the same batch size and attention dropout). ``--render-only`` rewrites the Markdown from the stored runs (with
``--summary``: the findings shown under the title). ``--tiny`` (L = 64 and 128, results under
/tmp unless ``--output`` is given) only proves that the script runs; ``--in-process`` (tests) runs the probes in the
calling interpreter.

    python benchmarks/long_inputs_memory.py --label after
    python benchmarks/long_inputs_memory.py --tiny
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common  # before torch: environment defaults
import torch
from retromae.modeling import two_stream
from retromae.modeling import visibility as sampling

VARIANTS = ("hf_mlm", "retromae", "retromae_reference", "dupmae", "seed")
VARIANT_LABELS = {
    "hf_mlm": "HF BertForMaskedLM (baseline)",
    "retromae": "RetroMAE enhanced, token visibility",
    "retromae_reference": "RetroMAE enhanced, reference visibility",
    "dupmae": "DupMAE (enhanced [CLS] + OT decoding)",
    "seed": "SEED-Encoder (3 layers, window 2)",
}
LENGTHS = (512, 2048, 8192)
TINY_LENGTHS = (64, 128)
SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}
VOCAB = 1000
CLS_ID, SEP_ID, MASK_ID, FIRST_ORDINARY_ID = 2, 3, 4, 5
MLM_PROBABILITY = 0.3
DECODER_MASK_RATIO = 0.5
WORD_START_PROBABILITY = 0.75
MMAP_THRESHOLD = 1 << 20  # bytes: glibc maps (and unmaps when freed) every allocation at least this large
RESULTS = common.RESULTS_DIR / "long_inputs_memory.json"
MiB = 2**20


# ---------------------------------------------------------------------------------------------------------------------
# The probe (one variant, one length, in a fresh interpreter)
# ---------------------------------------------------------------------------------------------------------------------


def build_model(variant: str, max_length: int, attention_dropout: float, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    shape = {
        **SHAPE, "vocab_size": VOCAB, "max_position_embeddings": max_length,
        "attention_probs_dropout_prob": attention_dropout, "attn_implementation": "sdpa",
    }
    if variant == "hf_mlm":
        from transformers import BertConfig, BertForMaskedLM

        return BertForMaskedLM(BertConfig(**shape))
    if variant == "dupmae":
        from retromae.modeling.configuration_dupmae import DupMAEConfig
        from retromae.modeling.modeling_dupmae import DupMAEForPretraining

        return DupMAEForPretraining(DupMAEConfig(
            **shape, decoding="enhanced", decoder_mask_ratio=DECODER_MASK_RATIO, encoder_mask_ratio=MLM_PROBABILITY,
            mask_token_id=MASK_ID, dense_dim=SHAPE["hidden_size"],
        ))
    if variant == "seed":
        from retromae.modeling.configuration_seed import SEEDConfig
        from retromae.modeling.modeling_seed import SEEDEncoderForPretraining

        return SEEDEncoderForPretraining(SEEDConfig(
            **shape, num_decoder_layers=3, attention_window=2, encoder_mask_ratio=MLM_PROBABILITY,
        ))
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    visibility = {"retromae": "token", "retromae_reference": "reference"}[variant]
    return RetroMAEForPretraining(RetroMAEConfig(
        **shape, decoding="enhanced", decoder_mask_ratio=DECODER_MASK_RATIO, decoder_visibility=visibility,
        encoder_mask_ratio=MLM_PROBABILITY, mask_token_id=MASK_ID,
    ))


def make_batch(variant: str, batch_size: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    """Packed rows [CLS] x_1 ... x_{L-2} [SEP]; the same tokens and masks for every variant."""
    generator = torch.Generator().manual_seed(seed)
    original = torch.randint(FIRST_ORDINARY_ID, VOCAB, (batch_size, length), generator=generator)
    original[:, 0], original[:, -1] = CLS_ID, SEP_ID
    ordinary = torch.ones(batch_size, length, dtype=torch.bool)
    ordinary[:, 0] = ordinary[:, -1] = False
    masked = (torch.rand(batch_size, length, generator=generator) < MLM_PROBABILITY) & ordinary
    word_starts = (torch.rand(batch_size, length, generator=generator) < WORD_START_PROBABILITY) | ~ordinary
    encoder_labels = original.masked_fill(~masked, -100)
    input_ids = original.masked_fill(masked, MASK_ID)
    attention_mask = torch.ones(batch_size, length, dtype=torch.long)
    if variant == "hf_mlm":
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": encoder_labels}
    batch = {
        "input_ids": input_ids, "attention_mask": attention_mask, "encoder_labels": encoder_labels,
        "decoder_labels": original.masked_fill(~ordinary, -100),
    }
    if variant == "retromae_reference":
        batch["decoder_word_starts"] = word_starts.long()
    return batch


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def census_step(model, optimizer, batch: dict[str, torch.Tensor], min_elements: int) -> list[dict[str, Any]]:
    """Every new tensor of at least `min_elements` elements that an op allocates during one step (forward, backward
    and optimizer): op, shape, dtype, bytes of its storage, how many times. Views and in-place results (whose
    storage is an input's) are not allocations and are left out."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Counter = Counter()

    def storages(values) -> set[int]:
        return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}

    class Census(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            outputs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
            large = [t for t in outputs if t.numel() >= min_elements]
            if large:
                inputs = storages(torch.utils._pytree.tree_leaves((args, kwargs)))
                for tensor in large:
                    storage = tensor.untyped_storage()
                    if storage.data_ptr() not in inputs:
                        dtype = str(tensor.dtype).removeprefix("torch.")
                        seen[(func.overloadpacket.__name__, tuple(tensor.shape), dtype, storage.nbytes())] += 1
            return out

    with Census():
        train_step(model, optimizer, batch)
    rows = [
        {"op": op, "shape": list(shape), "dtype": dtype, "bytes": size, "count": count}
        for (op, shape, dtype, size), count in seen.items()
    ]
    return sorted(rows, key=lambda row: (-row["bytes"], row["op"]))


def probe(variant: str, length: int, args) -> dict[str, Any]:
    """Burn-in step, then the measured step (and the census step); the result row."""
    max_length = getattr(args, "max_length", None) or max(args.lengths)
    model = build_model(variant, max_length, args.attention_dropout, args.seed).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = make_batch(variant, args.batch_size, length, args.seed)
    train_step(model, optimizer, batch)  # burn-in: the AdamW state, lazily built buffers
    gc.collect()
    before, method = common.reset_peak_rss()
    started = time.perf_counter()
    loss = train_step(model, optimizer, batch)
    seconds = time.perf_counter() - started
    peak = common.peak_rss_bytes()
    result = {
        "variant": variant, "length": length, "batch_size": args.batch_size, "status": "ok",
        "before_bytes": before, "peak_bytes": peak, "growth_bytes": peak - before, "step_seconds": round(seconds, 3),
        "loss": loss, "parameters": sum(p.numel() for p in model.parameters()), "method": method,
    }
    if args.census:
        result["census_min_elements"] = args.batch_size * length * length // 16
        result["census"] = census_step(model, optimizer, batch, result["census_min_elements"])
    return result


def probe_main(args) -> None:
    """Runs in a fresh subprocess: one probe, printed as one JSON line."""
    if args.threads:
        torch.set_num_threads(args.threads)
    print(json.dumps(probe(args.probe, args.length, args)))


def run_probe(variant: str, length: int, args) -> dict[str, Any]:
    """One probe; the census at the largest length only (smaller ones would list the parameters' tensors too)."""
    if args.in_process:
        return probe(variant, length, argparse.Namespace(**{**vars(args), "census": args.census and length == max(args.lengths)}))
    command = [
        sys.executable, os.path.abspath(__file__), "--probe", variant, "--length", str(length),
        "--max-length", str(max(args.lengths)), "--batch-size", str(args.batch_size), "--seed", str(args.seed),
        "--attention-dropout", str(args.attention_dropout), *(["--threads", str(args.threads)] if args.threads else []),
        *(["--census"] if args.census and length == max(args.lengths) else []),
    ]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    failed = {"variant": variant, "length": length, "batch_size": args.batch_size, "status": "infeasible"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env, timeout=args.probe_timeout)
    except subprocess.TimeoutExpired:
        return {**failed, "reason": f"did not finish within --probe-timeout {args.probe_timeout} s"}
    if done.returncode != 0:
        killed = done.returncode in (-9, 137)
        reason = "killed (SIGKILL: out of memory?)" if killed else f"exit status {done.returncode}"
        return {**failed, "reason": reason, "stderr_tail": done.stderr[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------------------------
# What grows as L^2 in the decoder path, analytically
# ---------------------------------------------------------------------------------------------------------------------

# Each tensor of the decoder path that grows as L^2: bytes per element of B * L * L (times the heads where
# `per_head`; L * L alone where `batch_independent`), and what it is now: "whole" (kept, smallest dtype), "sampler" /
# "attention" (one chunk of query rows at a time: `SAMPLER_CHUNK_ELEMENTS` / `ATTENTION_CHUNK_ELEMENTS` of
# visibility / two_stream), "none" (no longer made), "bool" (still whole, in fewer bytes: `bytes_per_element_now`).
L2_TENSORS: tuple[dict[str, Any], ...] = (
    {"name": "sampler random keys (B, L, L) int32 (drawn as int64 pairs)", "where": "_row_subsets_by_topk (CPU)",
     "bytes_per_element": 4.0, "now": "sampler"},
    {"name": "topk values (B, L, n_visible) int32", "where": "_row_subsets_by_topk (CPU)",
     "bytes_per_element": 4.0 * (1 - DECODER_MASK_RATIO), "now": "sampler"},
    {"name": "topk indices (B, L, n_visible) int64", "where": "_row_subsets_by_topk (CPU)",
     "bytes_per_element": 8.0 * (1 - DECODER_MASK_RATIO), "now": "sampler"},
    {"name": "sort values int32 + indices int64 + comparison bool (B, L, L)", "where": "_row_subsets_by_sort (accelerators)",
     "bytes_per_element": 13.0, "now": "sampler", "note": "its keys (B, L, L) int32 stay whole: one draw"},
    {"name": "visibility (B, 1, L, L) bool", "where": "enhanced_visibility_mask / reference_visibility_mask",
     "bytes_per_element": 1.0, "now": "whole", "note": "bool, 1 byte: the smallest dtype"},
    {"name": "reference sampler temporaries ~hidden, & real, & real (B, L, L) bool", "where": "reference_visibility_mask",
     "bytes_per_element": 3.0, "now": "none", "note": "computed in place"},
    {"name": "sdpa's float copy of the bool mask (B, 1, L, L) in the query dtype (fp32 here, bf16 2 B)",
     "where": "torch sdpa (bool mask converted), kept for backward, per decoder layer (SEED: 3)",
     "bytes_per_element": 4.0, "now": "attention", "note": "per chunk of query rows, recomputed in backward"},
    {"name": "eager: additive bias (B, 1, L, L) float", "where": "attention_bias, eager decoder",
     "bytes_per_element": 4.0, "now": "attention"},
    {"name": "eager / sdpa math path: scores, probabilities, dropout output (B, heads, L, L) float (about)",
     "where": "decoder on eager, or sdpa with attention dropout on CPU (math path)", "bytes_per_element": 12.0,
     "per_head": True, "now": "attention", "note": "the encoder's own attention (as the baseline's) is not changed"},
    {"name": "SEED window band (L, L): query - key offsets int64 + 3 comparisons bool; now bool only",
     "where": "modeling_seed.windowed_causal_visibility", "bytes_per_element": 11.0, "batch_independent": True,
     "now": "bool", "bytes_per_element_now": 4.0,
     "note": "ones, its tril, ~tril(-k) and their & (L, L) bool at once: 4 B, no int64 offsets"},
)


def now_elements(item: dict[str, Any], elements: int, batch_size: int, length: int) -> int:
    """How many of `elements` exist at once now (`item["now"]`)."""
    if item["now"] == "none":
        return 0
    if item["now"] == "sampler":
        rows = max(1, sampling.SAMPLER_CHUNK_ELEMENTS // (batch_size * length if "sort" in item["where"] else length))
        return min(elements, rows * length * (batch_size if "sort" in item["where"] else 1))
    if item["now"] == "attention":
        rows = max(1, two_stream.ATTENTION_CHUNK_ELEMENTS // (batch_size * length))
        return min(elements, batch_size * rows * length)
    return elements


def analytic_rows(lengths: tuple[int, ...], batch_size: int) -> list[dict[str, Any]]:
    heads = SHAPE["num_attention_heads"]
    rows = []
    for item in L2_TENSORS:
        before, now = {}, {}
        for length in lengths:
            elements = length * length * (1 if item.get("batch_independent") else batch_size)
            per_head = heads if item.get("per_head") else 1
            before[str(length)] = int(elements * item["bytes_per_element"] * per_head)
            scale_now = item.get("bytes_per_element_now", item["bytes_per_element"]) * per_head
            now[str(length)] = int(now_elements(item, elements, batch_size, length) * scale_now)
        rows.append({**item, "bytes_before": before, "bytes_now": now})
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------


def mib(value: float | None) -> str:
    return "—" if value is None else f"{value / MiB:,.1f}"


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return ""
    if row["status"] != "ok":
        return f"infeasible ({row['reason']})"
    return mib(row["growth_bytes"])


def run_table(run: dict[str, Any]) -> list[str]:
    lengths = sorted({row["length"] for row in run["rows"]})
    by_key = {(row["variant"], row["length"]): row for row in run["rows"]}
    variants = [v for v in VARIANTS if any(row["variant"] == v for row in run["rows"])]
    lines = [
        "| variant | " + " | ".join(f"L={length} growth MiB (step s)" for length in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for variant in variants:
        cells = []
        for length in lengths:
            row = by_key.get((variant, length))
            text = cell(row)
            if row is not None and row["status"] == "ok":
                text += f" ({row['step_seconds']:.2f})"
            cells.append(text)
        lines.append(f"| {VARIANT_LABELS[variant]} | " + " | ".join(cells) + " |")
    return lines


def comparison_table(first: tuple[str, dict], second: tuple[str, dict]) -> list[str]:
    (a_label, a), (b_label, b) = first, second
    a_rows = {(row["variant"], row["length"]): row for row in a["rows"]}
    lines = [
        f"| variant | L | {a_label} MiB | {b_label} MiB | {b_label} / {a_label} | {b_label} minus baseline MiB |",
        "|---|---|---|---|---|---|",
    ]
    b_baseline = {row["length"]: row for row in b["rows"] if row["variant"] == "hf_mlm" and row["status"] == "ok"}
    for row in b["rows"]:
        old = a_rows.get((row["variant"], row["length"]))
        ratio = extra = ""
        if row["status"] == "ok" and old is not None and old["status"] == "ok" and old["growth_bytes"] > 0:
            ratio = f"{row['growth_bytes'] / old['growth_bytes']:.2f}"
        if row["status"] == "ok" and row["length"] in b_baseline:
            extra = mib(row["growth_bytes"] - b_baseline[row["length"]]["growth_bytes"])
        lines.append(f"| {VARIANT_LABELS[row['variant']]} | {row['length']} | {cell(old)} | {cell(row)} | {ratio} | {extra} |")
    return lines


def census_lines(run: dict[str, Any], length: int) -> list[str]:
    lines = []
    for row in run["rows"]:
        if row["length"] != length or row["status"] != "ok" or "census" not in row:
            continue
        items = [
            f"{c['op']} {tuple(c['shape'])} {c['dtype']} {mib(c['bytes'])} MiB x{c['count']}"
            for c in row["census"]
        ]
        lines.append(f"- {VARIANT_LABELS[row['variant']]}: " + ("; ".join(items) if items else "none"))
    return lines


def compared_runs(runs: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """`before` and `after` when both exist, else the first and the last run, if their batch size and attention
    dropout agree."""
    if "before" in runs and "after" in runs:
        return "before", "after"
    labels = list(runs)
    if len(labels) < 2:
        return None
    keys = [(runs[label]["settings"]["batch_size"], runs[label]["settings"]["attention_dropout"]) for label in labels]
    return (labels[0], labels[-1]) if keys[0] == keys[-1] else None


def render(report: dict[str, Any]) -> str:
    runs = report["runs"]
    lines = ["# Peak memory of one training step at long inputs (CPU, tiny BERT)", ""]
    lines += [
        f"Tiny random BERT (hidden {SHAPE['hidden_size']}, {SHAPE['num_hidden_layers']} layers, "
        f"{SHAPE['num_attention_heads']} heads, intermediate {SHAPE['intermediate_size']}, vocabulary {VOCAB}), "
        "packed rows (no padding), sdpa, fp32; each run gives its batch size and attention dropout. "
        "Growth = peak RSS during one training step (forward + backward + "
        "AdamW, after a burn-in step) minus the RSS before it, each (variant, L) in a fresh process. "
        "`python benchmarks/long_inputs_memory.py` (see its docstring).",
        "",
    ]
    if report.get("summary"):
        lines += [report["summary"], ""]
    for label, run in runs.items():
        env = run["environment"]
        settings = run["settings"]
        lines += [
            f"## Run `{label}`", "",
            f"Batch {settings['batch_size']}, attention dropout {settings['attention_dropout']}; {env['hardware']}; "
            f"{env['date']}; {env['wall_seconds']} s.", "",
        ]
        if run.get("note"):
            lines += [run["note"], ""]
        lines += run_table(run) + [""]
    pair = compared_runs(runs)
    if pair is not None:
        first, second = pair
        lines += [f"## `{first}` vs `{second}`", ""]
        lines += comparison_table((first, runs[first]), (second, runs[second])) + [""]
    lengths = [int(length) for length in report["analytic"]["lengths"]]
    lines += [
        f"## What grows as L^2 in the decoder path: MiB at batch {report['analytic']['batch_size']}, "
        f"{SHAPE['num_attention_heads']} heads, before -> now (analytic; now: the most that exists at once)", "",
        "| tensor | where | " + " | ".join(f"L={length}" for length in lengths) + " | now |",
        "|---|---|" + "---|" * len(lengths) + "---|",
    ]
    for row in report["analytic"]["rows"]:
        sizes = " | ".join(
            f"{mib(row['bytes_before'][str(length)])} -> {mib(row['bytes_now'][str(length)])}" for length in lengths
        )
        now = {"whole": "kept whole", "none": "not made", "sampler": "chunks of query rows (SAMPLER_CHUNK_ELEMENTS)",
               "attention": "chunks of query rows (ATTENTION_CHUNK_ELEMENTS)", "bool": "kept whole, built in bool"}[row["now"]]
        note = f"; {row['note']}" if row.get("note") else ""
        lines.append(f"| {row['name']} | {row['where']} | {sizes} | {now}{note} |")
    lines.append("")
    for label, run in runs.items():
        census_length = run["settings"].get("census_length")
        if census_length is None:
            continue
        lines += [
            f"## Census, run `{label}`, L={census_length}: every tensor of at least B*L*L/16 elements an op created "
            "in one step (forward and backward)", "",
        ]
        lines += census_lines(run, census_length) + [""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--lengths", default=None, help=f"comma-separated sequence lengths (default {LENGTHS})")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {VARIANTS}")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--attention-dropout", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads in the probes (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probe-timeout", type=int, default=300, help="seconds one probe may run")
    parser.add_argument("--no-census", dest="census", action="store_false", help="skip the census step")
    parser.add_argument("--label", default="current", help="name of this run in the results (e.g. before / after)")
    parser.add_argument("--note", default="", help="a line shown under the run's table")
    parser.add_argument("--summary", default=None, help="the findings, shown under the title (kept until replaced)")
    parser.add_argument("--output", type=Path, default=None, help=f"JSON path (default {RESULTS}; .md beside it)")
    parser.add_argument("--tiny", action="store_true", help="L=64,128 into /tmp: proves only that the script runs")
    parser.add_argument("--render-only", action="store_true", help="rewrite the Markdown (and table) of --output")
    parser.add_argument("--in-process", action="store_true",
                        help="run the probes in this interpreter (tests; the peak then includes earlier probes)")
    parser.add_argument("--probe", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--census", dest="census", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return args
    if args.tiny:
        args.output = args.output or Path("/tmp/long_inputs_memory_tiny.json")
    lengths = args.lengths.split(",") if args.lengths else TINY_LENGTHS if args.tiny else LENGTHS
    args.lengths = tuple(int(x) for x in lengths)
    args.variant_list = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variant_list) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    args.output = args.output or RESULTS
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.probe:
        probe_main(args)
        return
    if args.render_only:  # the measured runs as stored, the analytic table from the current code
        report = common.read_json(args.output)
        report["summary"] = report.get("summary") if args.summary is None else args.summary
        write_report(report, args.output)
        return
    started = time.perf_counter()
    previous = common.read_json(args.output) if args.output.exists() else {}
    rows = []
    for length in args.lengths:
        for variant in args.variant_list:
            common.log(f"{variant} L={length}")
            row = run_probe(variant, length, args)
            rows.append(row)
            common.log(f"  {cell(row)} MiB" if row["status"] == "ok" else f"  infeasible: {row['reason']}")
    run = {
        "settings": {
            "lengths": list(args.lengths), "variants": args.variant_list, "batch_size": args.batch_size,
            "attention_dropout": args.attention_dropout, "seed": args.seed, "threads": args.threads or None,
            "shape": {**SHAPE, "vocab_size": VOCAB}, "census_length": args.lengths[-1] if args.census else None,
            "malloc_mmap_threshold": MMAP_THRESHOLD,
        },
        "environment": {
            **common.machine_facts(torch.device("cpu")), "hardware": common.hardware_summary(),
            "wall_seconds": round(time.perf_counter() - started, 1),
        },
        "note": args.note,
        "rows": rows,
    }
    summary = previous.get("summary") if args.summary is None else args.summary
    runs = {**previous.get("runs", {}), args.label: run}
    write_report({"benchmark": "long_inputs_memory", "summary": summary, "runs": runs}, args.output)


def write_report(report: dict[str, Any], output: Path) -> None:
    """The analytic table (every length of the runs, the last run's batch size), the Markdown printed and stored
    beside the JSON, and the JSON."""
    runs = list(report["runs"].values())
    lengths = tuple(sorted({length for run in runs for length in run["settings"]["lengths"]}))
    batch_size = runs[-1]["settings"]["batch_size"]
    report["analytic"] = {"lengths": list(lengths), "batch_size": batch_size, "rows": analytic_rows(lengths, batch_size)}
    report["table_markdown"] = render(report)
    print(report["table_markdown"])
    common.write_result(output, report)
    markdown = output.with_suffix(".md")
    markdown.write_text(report["table_markdown"] + "\n", encoding="utf-8")
    print(f"written {common.shown(markdown)}")


if __name__ == "__main__":
    main()
