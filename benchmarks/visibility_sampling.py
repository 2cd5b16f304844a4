"""Time to sample RetroMAE's enhanced-decoding visibility matrix on CPU: the previous full sort vs today's sampler.

Both draw, for every real query row, a uniformly random set of exactly n_visible = n - round(n * ratio) of the n real
columns, then apply the paper's fix-ups (no diagonal, position 0 visible to rows i > 0, padding rows see position 0).

- ``sort`` (the baseline, copied below as it was): B x L x L float keys, a full sort of every row to read its
  n_visible-th smallest key, then a comparison.
- ``topk``: `enhanced_visibility_mask` as shipped: 30-bit integer keys (two per int64 draw), drawn over real rows and
  columns only, and a linear-time `topk(sorted=False)` selection per row scattered into the mask.

Layouts: ``packed`` (every row has L real tokens, as the wiki/msmarco presets pack text) and ``padded`` (right
padding, lengths drawn uniformly in [L/4, L] with a fixed seed). Calls are interleaved (sort, topk, sort, ...) so load
drift on a shared machine hits both; after `--burn-in` calls each, the median of `--repeats` is reported in ms per
sample (per row of the batch). Results: a printed table and ``benchmarks/results/visibility_sampling.json``.

A second table times the official-code sampler `reference_visibility_mask` (``decoder_visibility="reference"``,
whole words, a pool of min(n, 256) masks per sequence) at `--reference-length`, its layouts interleaved the same way:
``uniform`` is B copies of one L-token sequence, ``ragged`` B different L-token sequences (different word boundaries,
so different word counts), ``ragged+pad`` B different sequences of lengths drawn in [L/4, L]. Words start at a token
with probability 0.75 (about WordPiece's 1.3 tokens per word). The last column is the ratio of ms per sample to
``uniform`` (target: at most 1.5).

    python benchmarks/visibility_sampling.py                     # 2 threads, L=128/256/512, B=8/32
    python benchmarks/visibility_sampling.py --threads 1 --repeats 3
    python benchmarks/visibility_sampling.py --layouts none    # the reference-sampler table only
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import common  # before torch: environment defaults
import torch
from retromae.modeling.visibility import enhanced_visibility_mask, reference_visibility_mask

RESULTS = common.RESULTS_DIR / "visibility_sampling.json"
TARGET_MS_AT_512 = 5.0  # the sampler's target: at most 5 ms per sequence at L=512
TARGET_RAGGED_RATIO = 1.5  # reference sampler: a ragged batch costs at most 1.5x a uniform one per sample
WORD_START_PROBABILITY = 0.75


def sort_baseline(attention_mask: torch.Tensor, mask_ratio: float) -> torch.Tensor:
    """The previous `enhanced_visibility_mask`, unchanged: a full sort of B x L x L random keys."""
    real = attention_mask.bool()  # (B, L)
    batch_size, seq_len = real.shape
    keys = torch.rand(batch_size, seq_len, seq_len, device=real.device)  # (B, Lq, Lk)
    keys.masked_fill_(~real[:, None, :], 2.0)  # padding columns sort last, never chosen
    n_visible = (real.sum(-1) - (real.sum(-1) * mask_ratio).round()).clamp(min=1).long()  # (B,)
    kth_key = keys.sort(-1).values.gather(-1, (n_visible - 1)[:, None, None].expand(-1, seq_len, 1))  # (B, Lq, 1)
    visible = keys <= kth_key  # (B, Lq, Lk), n_visible real columns per row
    eye = torch.eye(seq_len, dtype=torch.bool, device=real.device)
    visible &= ~eye
    visible[:, 1:, 0] = True
    empty = ~visible.any(-1) | ~real
    visible[empty] = False
    visible[..., 0] |= empty
    return visible[:, None]


def attention_masks(batch_size: int, seq_len: int, layout: str) -> torch.Tensor:
    mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    if layout == "padded":
        lengths = torch.randint(seq_len // 4, seq_len + 1, (batch_size,), generator=torch.Generator().manual_seed(0))
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    return mask


def word_batches(batch_size: int, seq_len: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(attention_mask, word_starts) of the reference sampler's layouts: uniform, ragged, ragged+pad."""
    generator = torch.Generator().manual_seed(0)
    starts = (torch.rand(batch_size, seq_len, generator=generator) < WORD_START_PROBABILITY).long()
    full = torch.ones(batch_size, seq_len, dtype=torch.long)
    return {
        "uniform": (full, starts[:1].expand(batch_size, -1).contiguous()),
        "ragged": (full, starts),
        "ragged+pad": (attention_masks(batch_size, seq_len, "padded"), starts),
    }


def reference_rows(batch_size: int, seq_len: int, ratio: float, burn_in: int, repeats: int) -> list[dict]:
    """Interleaved timings of `reference_visibility_mask` on each layout of `word_batches`, ms per sample."""
    batches = word_batches(batch_size, seq_len)
    seconds: dict[str, list[float]] = {name: [] for name in batches}
    for step in range(burn_in + repeats):
        for name, (mask, starts) in batches.items():
            start = time.perf_counter()
            reference_visibility_mask(mask, starts, ratio)
            if step >= burn_in:
                seconds[name].append(time.perf_counter() - start)
    ms = {name: 1000 * statistics.median(s) / batch_size for name, s in seconds.items()}
    return [{"sampler": "reference", "layout": name, "batch_size": batch_size, "seq_len": seq_len,
             "ms_per_sample": ms[name], "ratio_to_uniform": ms[name] / ms["uniform"], "seconds": seconds[name]}
            for name in batches]


def time_interleaved(
    samplers: dict[str, Callable], mask: torch.Tensor, ratio: float, burn_in: int, repeats: int
) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in samplers}
    for step in range(burn_in + repeats):
        for name, sampler in samplers.items():
            start = time.perf_counter()
            sampler(mask, ratio)
            elapsed = time.perf_counter() - start
            if step >= burn_in:
                seconds[name].append(elapsed)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", default="128,256,512")
    parser.add_argument("--batch-sizes", default="8,32")
    parser.add_argument("--layouts", default="packed,padded")
    parser.add_argument("--mask-ratio", type=float, default=0.5)
    parser.add_argument("--burn-in", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--reference-length", type=int, default=512)
    parser.add_argument("--reference-batch-size", type=int, default=8)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    samplers = {"sort": sort_baseline, "topk": enhanced_visibility_mask}
    rows = []
    print(f"{'layout':<7} {'B':>3} {'L':>4} {'sort ms/sample':>15} {'topk ms/sample':>15} {'speed-up':>9}")
    for layout in [name for name in args.layouts.split(",") if name != "none"]:
        for seq_len in map(int, args.lengths.split(",")):
            for batch_size in map(int, args.batch_sizes.split(",")):
                mask = attention_masks(batch_size, seq_len, layout)
                seconds = time_interleaved(samplers, mask, args.mask_ratio, args.burn_in, args.repeats)
                ms = {name: 1000 * statistics.median(s) / batch_size for name, s in seconds.items()}
                rows.append({"layout": layout, "batch_size": batch_size, "seq_len": seq_len,
                             "ms_per_sample": ms, "speedup": ms["sort"] / ms["topk"], "seconds": seconds})
                print(f"{layout:<7} {batch_size:>3} {seq_len:>4} {ms['sort']:>15.2f} {ms['topk']:>15.2f} "
                      f"{ms['sort'] / ms['topk']:>8.1f}x")
    at_512 = [r["ms_per_sample"]["topk"] for r in rows if r["seq_len"] == 512]
    if at_512:
        verdict = "met" if max(at_512) <= TARGET_MS_AT_512 else "missed"
        print(f"target <= {TARGET_MS_AT_512} ms/sample at L=512: worst {max(at_512):.2f} ms ({verdict})")
    reference = reference_rows(args.reference_batch_size, args.reference_length, args.mask_ratio, args.burn_in,
                               args.repeats)
    print(f"\nreference sampler {'layout':<10} {'B':>3} {'L':>4} {'ms/sample':>10} {'ragged/uniform':>15}")
    for row in reference:
        print(f"reference sampler {row['layout']:<10} {row['batch_size']:>3} {row['seq_len']:>4} "
              f"{row['ms_per_sample']:>10.2f} {row['ratio_to_uniform']:>14.2f}x")
    worst = max(row["ratio_to_uniform"] for row in reference if row["layout"] != "uniform")
    verdict = "met" if worst <= TARGET_RAGGED_RATIO else "missed"
    print(f"target ragged <= {TARGET_RAGGED_RATIO}x uniform per sample: worst {worst:.2f}x ({verdict})")
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": "cpu",
        "threads": args.threads,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "mask_ratio": args.mask_ratio,
        "burn_in": args.burn_in,
        "repeats": args.repeats,
        "statistic": "median over repeats, ms per sample (one sequence of the batch)",
        "target_ms_per_sample_at_512": TARGET_MS_AT_512,
        "rows": rows,
        "reference_rows": reference,
        "target_ragged_to_uniform": TARGET_RAGGED_RATIO,
    }
    common.write_result(args.output, result)


if __name__ == "__main__":
    main()
