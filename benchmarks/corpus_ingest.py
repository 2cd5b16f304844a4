"""Corpus reading throughput: `retromae`'s reader against `datasets.load_dataset` with the same builder, side by side.

Builds a corpus from the shared Wikipedia sample (`../shared/data/enwiki-sample/train.txt`, repeated until it
reaches `--size-mb`; each repetition's passages end with a marker ` [rN]` so that no two are equal) in three
formats: `.jsonl` ({"text": ...} per line), `.txt` (one passage per line) and `.parquet` (a `text` column). Each
reader runs in a fresh process with a fresh `datasets` cache, `--repeats` times, alternating ours and theirs;
the median is reported as MB/s of the file read. Ours includes what `datasets` does not: forming the passages
(whitespace collapsed, blank ones dropped) and the checks of a corpus file.

    python benchmarks/corpus_ingest.py                 # 1024 MB, the issue's size
    python benchmarks/corpus_ingest.py --size-mb 100   # a quicker look

Writes `benchmarks/results/corpus_ingest.json` (`environment`, `rows`: format, size_mb, ours_mb_per_s,
datasets_mb_per_s, ratio). Not measured here yet: tokenising throughput, streaming memory, resume against replay,
the shuffle buffer's cost.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

SOURCE = common.DATA / "enwiki-sample" / "train.txt"
FORMATS = ("jsonl", "txt", "parquet")
BUILDERS = {"jsonl": "json", "txt": "text", "parquet": "parquet"}
# One read in a fresh interpreter: ours (`read_corpus`) or datasets' builder; prints the seconds and the row count.
READ = """
import sys, time
which, path, builder = sys.argv[1:4]
started = time.perf_counter()
if which == "ours":
    from retromae.trainers.data.reading import read_corpus
    rows = len(read_corpus(path, text_format="lines" if path.endswith(".txt") else "auto"))
else:
    import datasets
    rows = len(datasets.load_dataset(builder, data_files=path, split="train"))
print(time.perf_counter() - started, rows)
"""


def passages(size_mb: int) -> list[str]:
    """Non-blank lines of the sample, repeated with a repetition marker until `size_mb` of text."""
    base = [line.strip() for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    out, total, repetition = [], 0, 0
    while total < size_mb * 2**20:
        for line in base:
            text = f"{line} [r{repetition}]"
            out.append(text)
            total += len(text.encode()) + 1
            if total >= size_mb * 2**20:
                break
        repetition += 1
    return out


def write_corpus(texts: list[str], folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = {fmt: folder / f"corpus.{fmt}" for fmt in FORMATS}
    with paths["jsonl"].open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    paths["txt"].write_text("\n".join(texts) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"text": texts}), paths["parquet"])
    return paths


def timed_read(which: str, path: Path, builder: str, cache: Path) -> tuple[float, int]:
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", READ, which, str(path), builder], env=env, check=True,
                          capture_output=True, text=True)
    seconds, rows = done.stdout.split()[-2:]
    return float(seconds), int(rows)


def measure(paths: dict[str, Path], repeats: int, work: Path) -> list[dict[str, Any]]:
    rows = []
    for fmt, path in paths.items():
        size_mb = path.stat().st_size / 2**20
        times: dict[str, list[float]] = {"ours": [], "datasets": []}
        counts = {}
        for repeat in range(repeats):
            for which in ("ours", "datasets"):
                seconds, count = timed_read(which, path, BUILDERS[fmt], work / f"cache-{fmt}-{which}-{repeat}")
                times[which].append(seconds)
                counts[which] = count
                common.log(f"{fmt} {which} #{repeat}: {seconds:.2f} s, {count} rows")
        ours, theirs = (size_mb / statistics.median(times[w]) for w in ("ours", "datasets"))
        rows.append({"format": fmt, "size_mb": round(size_mb, 1), "ours_mb_per_s": round(ours, 1),
                     "datasets_mb_per_s": round(theirs, 1), "ratio": round(ours / theirs, 3),
                     "rows": counts, "seconds": times, "target": "ratio >= 0.9"})
    return rows


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [f"## Corpus reading: ours vs datasets.load_dataset ({env['cpu']}, {env['threads']} threads, "
             f"datasets {env['datasets']}, {env['date']})", "",
             "| format | MB | ours MB/s | datasets MB/s | ours / datasets | target ≥ 0.9 |", "|---|---:|---:|---:|---:|---|"]
    for row in report["rows"]:
        met = "met" if row["ratio"] >= 0.9 else "MISSED"
        lines.append(f"| {row['format']} | {row['size_mb']} | {row['ours_mb_per_s']} | {row['datasets_mb_per_s']} | "
                     f"{row['ratio']:.2f} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--size-mb", type=int, default=1024, help="corpus size in MB of text")
    parser.add_argument("--repeats", type=int, default=3, help="reads per reader and format (median reported)")
    parser.add_argument("--output", type=Path, default=common.RESULTS_DIR / "corpus_ingest.json")
    args = parser.parse_args(argv)
    if not SOURCE.is_file():
        raise SystemExit(f"the shared Wikipedia sample is not at {SOURCE}; this benchmark needs it")
    import datasets

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="corpus-ingest-") as tmp:
        work = Path(tmp)
        paths = write_corpus(passages(args.size_mb), work)
        report = {"environment": {"cpu": common.hardware_summary(), "threads": os.cpu_count(),
                                  "date": common.utc_now(), "datasets": datasets.__version__,
                                  "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
                                  "load_average_start": common.load_average()},
                  "rows": measure(paths, args.repeats, work)}
    common.finish_report(report, started, render, args.output)


if __name__ == "__main__":
    main()
