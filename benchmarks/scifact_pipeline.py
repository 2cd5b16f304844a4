"""SciFact end to end on CPU: hard-negative mining over the whole corpus, then evaluation, with wall time and peak
memory per phase.

Phases (each timed; peak resident memory sampled every 50 ms by a background thread, reported as the peak RSS of
the process during the phase and its growth over the RSS at the phase's start):

1. ``read``: the BEIR folder (5,183 documents, train and dev qrels) with `retromae.trainers.retrieval.beir.read_beir`.
2. ``load``: the model (`retromae.trainers.export.sentence_transformer.load_as_sentence_transformer`).
3. ``mine``: `retromae.trainers.retrieval.mining.mine_negatives` for the train queries over the full corpus
   (exact search by the model's own similarity; ranks 10-100, 7 negatives), written to JSONL. The committed result
   (2026-11-22) predates that: it mined with sentence-transformers' `mine_hard_negatives` and a faiss flat index.
4. ``evaluate``: `retromae.trainers.retrieval.mteb.evaluate_folder` on the dev split (mteb, exact search), with the
   summary metrics.

The model defaults to all-MiniLM-L6-v2 as shipped (the only real pretrained encoder here); ``--model`` takes any
folder `retromae evaluate` accepts (e.g. a `retromae finetune` output). Results: a printed table and
``benchmarks/results/scifact_pipeline.json``.

    python benchmarks/scifact_pipeline.py [--model DIR] [--max-seq-length 256] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import common  # before torch: environment defaults
import psutil
import torch
from common import SCIFACT

RESULTS = common.RESULTS_DIR / "scifact_pipeline.json"
MiB = 1 << 20


class PeakMemory:
    """Peak RSS of this process while the `phase` context is open (sampled every `interval` seconds)."""

    def __init__(self, interval: float = 0.05):
        self.interval, self.process = interval, psutil.Process()
        self.phases: dict[str, dict[str, float]] = {}

    @contextmanager
    def phase(self, name: str):
        start_rss = self.process.memory_info().rss
        peak = [start_rss]
        stop = threading.Event()

        def sample():
            while not stop.wait(self.interval):
                peak[0] = max(peak[0], self.process.memory_info().rss)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        started = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - started
            stop.set()
            thread.join()
            peak[0] = max(peak[0], self.process.memory_info().rss)
            self.phases[name] = {"seconds": round(seconds, 2), "peak_rss_mib": round(peak[0] / MiB, 1),
                                 "growth_mib": round((peak[0] - start_rss) / MiB, 1)}
            print(f"  {name:9s} {seconds:8.1f} s   peak RSS {peak[0] / MiB:8.1f} MiB "
                  f"(+{(peak[0] - start_rss) / MiB:.1f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: all-MiniLM-L6-v2 as shipped)")
    parser.add_argument("--data", default=str(SCIFACT), help="BEIR folder (default ../shared/data/scifact)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-seq-length", type=int, default=None, help="override the model's maximum length")
    parser.add_argument("--num-negatives", type=int, default=7)
    parser.add_argument("--output", type=Path, default=RESULTS, help="result JSON")
    args = parser.parse_args(argv)
    if not Path(args.data, "corpus.jsonl").is_file():
        print(f"no BEIR folder at {args.data}; nothing to do")
        return 1

    from retromae.trainers.data.training_groups import groups_from_beir
    from retromae.trainers.retrieval.beir import read_beir
    from retromae.trainers.retrieval.mining import mine_negatives
    from retromae.trainers.retrieval.mteb import evaluate_folder

    model_path = args.model or str(common.base_model_path())
    memory = PeakMemory()
    wall = time.perf_counter()
    print(f"SciFact pipeline on CPU ({torch.get_num_threads()} threads), model {Path(model_path).name}", flush=True)
    with tempfile.TemporaryDirectory(prefix="scifact-pipeline-") as tmp:
        with memory.phase("read"):
            train = read_beir(args.data, split="train")
            groups = groups_from_beir(train)
            corpus = {doc_id: train.doc_text(doc_id) for doc_id in train.corpus}
        with memory.phase("load"):
            model = common.load_model(model_path, args.max_seq_length, Path(tmp) / "export", device=None)
        with memory.phase("mine"):
            mined = mine_negatives(model, groups, corpus, num_negatives=args.num_negatives, range_min=10,
                                   range_max=100, batch_size=args.batch_size, output_file=Path(tmp) / "negatives.jsonl")
        del model
        with memory.phase("evaluate"):
            (row,) = evaluate_folder(model_path, beir_folders=[args.data], split="dev", output_dir=Path(tmp) / "eval",
                                     batch_size=args.batch_size)
    total = time.perf_counter() - wall
    peak = psutil.Process().memory_info().rss
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "device": "cpu",
        "threads": torch.get_num_threads(), "platform": platform.platform(), "torch": torch.__version__,
        "model": Path(model_path).name, "documents": len(corpus), "train_queries": len(groups),
        "queries_with_negatives": sum(1 for g in mined.groups if g.negatives), "dev_queries": row["queries"],
        "batch_size": args.batch_size, "max_seq_length": args.max_seq_length, "phases": memory.phases,
        "wall_seconds": round(total, 1), "peak_rss_mib_overall": round(max(
            [p["peak_rss_mib"] for p in memory.phases.values()] + [peak / MiB]), 1),
        "dev_scores": {k: row[k] for k in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "recall_at_1000")},
    }
    print(f"total {total:.1f} s, peak RSS {result['peak_rss_mib_overall']:.1f} MiB; negatives for "
          f"{result['queries_with_negatives']}/{len(groups)} train queries; dev NDCG@10 {row['ndcg_at_10']:.5f}")
    common.write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
