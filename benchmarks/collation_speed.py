"""What a pre-training DataLoader worker spends per batch on CPU: fetching the rows and padding them, before and now.

- ``numpy rows`` (before): `datasets`' numpy format, ``__getitems__`` (one array per row and column), then
  `PretrainingCollator.pad` on that list.
- ``arrow batch`` (now, `RetroMAETrainer`'s reads through `array_rows`): one Arrow take, each column kept flat with its
  row lengths (`RowBatch`), then the same `pad`, which scatters the flat values in one step.

Both give the same tensors bit for bit (checked on every batch shape before timing). Rows are random ids of the
all-MiniLM-L6-v2 vocabulary with word starts, stored as `tokenize_corpus` stores them (int32 ids, int8 word starts).
Layouts: ``packed`` (every row has L tokens) and ``padded`` (lengths drawn in [L/4, L] with a fixed seed). Calls are
interleaved so load drift hits both; after `--burn-in` calls each, the median of `--repeats` is reported in ms per
batch, on `--threads` torch threads (a DataLoader worker runs one). This is a CPU-side figure: on a GPU run the
workers overlap it with the step, and the breakdown in `pretrain_throughput.py --breakdown` reports it beside the
step time. Results: a printed table and ``benchmarks/results/collation_speed.json``.

    python benchmarks/collation_speed.py                      # L=128/512, B=32/64, 1 thread
    python benchmarks/collation_speed.py --repeats 5 --lengths 128 --batch-sizes 8
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import common  # before torch: environment defaults
import datasets
import numpy as np
import torch
from retromae.trainers.data.collator import PretrainingCollator
from retromae.trainers.data.token_rows import array_rows

RESULTS = common.RESULTS_DIR / "collation_speed.json"
ROWS = 512  # rows in the dataset; batches are drawn from them in a fixed random order
WORD_START_PROBABILITY = 0.75  # about WordPiece's 1.3 tokens per word


def token_dataset(length: int, layout: str, vocab_size: int) -> datasets.Dataset:
    """``ROWS`` rows of ``input_ids`` (int32) and ``word_starts`` (int8), as `tokenize_corpus` writes them."""
    generator = np.random.default_rng(0)
    lengths = np.full(ROWS, length) if layout == "packed" else generator.integers(length // 4, length + 1, ROWS)
    ids = [generator.integers(1000, vocab_size, n).astype(np.int32) for n in lengths]
    starts = [(generator.random(n) < WORD_START_PROBABILITY).astype(np.int8) for n in lengths]
    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32")),
                                  "word_starts": datasets.List(datasets.Value("int8"))})
    return datasets.Dataset.from_dict({"input_ids": ids, "word_starts": starts}, features=features)


def readers(dataset: datasets.Dataset) -> dict[str, Any]:
    """The two ways a worker fetches a batch: name -> the object whose ``__getitems__`` it calls."""
    return {"numpy rows": dataset.with_format("numpy"), "arrow batch": array_rows(dataset)}


def check_equal(collator: PretrainingCollator, ways: dict[str, Any], batches: list[list[int]]) -> None:
    """Refuse to time two ways that pad differently."""
    for indices in batches:
        padded = [collator.pad(way.__getitems__(indices)) for way in ways.values()]
        if not all(torch.equal(padded[0][key], other[key]) for other in padded[1:] for key in padded[0]):
            raise SystemExit(f"the ways pad batch {indices[:4]}... differently: {list(ways)}")


def time_row(collator: PretrainingCollator, dataset: datasets.Dataset, batch_size: int, args) -> dict[str, Any]:
    ways = readers(dataset)
    order = np.random.default_rng(1).permutation(ROWS).tolist()
    batches = [[order[(step * batch_size + i) % ROWS] for i in range(batch_size)]
               for step in range(args.burn_in + args.repeats)]
    check_equal(collator, ways, batches[:2])
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    for step, indices in enumerate(batches):
        for name, way in ways.items():
            start = time.perf_counter()
            collator.pad(way.__getitems__(indices))
            if step >= args.burn_in:
                seconds[name].append(time.perf_counter() - start)
    ms = {name: 1000 * statistics.median(values) for name, values in seconds.items()}
    return {"ms_per_batch": ms, "speedup": ms["numpy rows"] / ms["arrow batch"], "seconds": seconds}


def render(report: dict[str, Any]) -> str:
    lines = ["| layout | B | L | numpy rows, ms/batch | arrow batch, ms/batch | speed-up |", "|---|---|---|---|---|---|"]
    for row in report["rows"]:
        ms = row["ms_per_batch"]
        lines.append(f"| {row['layout']} | {row['batch_size']} | {row['length']} | {ms['numpy rows']:.3f} | "
                     f"{ms['arrow batch']:.3f} | {row['speedup']:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lengths", default="128,512")
    parser.add_argument("--batch-sizes", default="32,64")
    parser.add_argument("--layouts", default="packed,padded")
    parser.add_argument("--burn-in", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    datasets.disable_progress_bars()
    tokenizer = common.load_tokenizer()
    collator = PretrainingCollator(tokenizer)
    environment = {**common.machine_facts(torch.device("cpu")), "hardware": common.hardware_summary(),
                   "threads": args.threads, "datasets": datasets.__version__, "burn_in": args.burn_in,
                   "repeats": args.repeats, "statistic": "median over repeats, ms per batch (fetch + pad)"}
    rows = []
    for layout in args.layouts.split(","):
        for length in map(int, args.lengths.split(",")):
            dataset = token_dataset(length, layout, len(tokenizer))
            for batch_size in map(int, args.batch_sizes.split(",")):
                common.log(f"{layout} L={length} B={batch_size}")
                rows.append({"layout": layout, "length": length, "batch_size": batch_size,
                             **time_row(collator, dataset, batch_size, args)})
    common.finish_report({"environment": environment, "rows": rows}, started, render, args.output)


if __name__ == "__main__":
    main()
