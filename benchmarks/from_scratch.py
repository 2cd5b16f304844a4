"""The papers' own comparison, from random initialisation: one MiniLM-size encoder (6 layers, hidden 384, 12 heads,
the bert-base-uncased vocabulary of the all-MiniLM-L6-v2 tokenizer), initialised randomly with the same seed for every
arm, pre-trained on enwiki-sample/train.txt + the SciFact corpus (packed) with MLM alone, RetroMAE (enhanced),
DupMAE, BoW prediction or SEED-Encoder, with identical steps, batch, L, schedule and seed; then fine-tuned
identically (`retromae finetune`, several seeds) and scored on SciFact dev (issue 33).

Every step is one of the package's commands in its own process, so the experiment tests the package:

1. ``init``: a seeded random `BertForMaskedLM` of the chosen size, saved with the MiniLM tokenizer (the
   ``--model`` of every arm; its weights digest is recorded, so two machines can show they started alike);
2. per arm ``pretrain``: `retromae pretrain --packing true` (arm flags: `common.PRETRAIN`, as in the SciFact
   experiments; ``mlm`` is the encoder's MLM loss alone), then its steps, seconds per step and tokens seen;
3. ``coverage`` / ``coverage_lm_head``: `retromae coverage` of the pre-trained encoder (through the word embeddings
   and through the trained MLM head) on the first ``--coverage-docs`` SciFact documents;
4. ``zeroshot_<variant>``: `retromae evaluate` of the pre-trained encoder's [CLS] (DupMAE: also its hybrid) on dev;
5. per seed ``finetune_<variant>_s<seed>`` + ``evaluate_<variant>_s<seed>``: `retromae finetune --stages
   in-batch,hard-negatives --eval-data <scifact> --eval-split dev` on qrels/train.tsv (the dev scores are
   `retromae evaluate`'s, computed by that same process). DupMAE is fine-tuned twice: its [CLS] export
   (``dupmae``, the like-for-like comparison) and its hybrid representation (``dupmae_hybrid``).

After the pre-training, phases 3-5 share a pool of ``--parallel-seeds`` workers, the fine-tunings first.

Nothing is tuned on dev. The ledger (``<results>/from_scratch_ledger/<arm>.phases.json``) keeps every finished phase
keyed by its settings (free of machine paths), so a run continues where the last one stopped and arms run on other
machines join by copying their ledger files in; ``--report-only`` builds ``from_scratch.{json,md}`` and
``from_scratch_ndcg.png`` from whatever the ledger holds.

Budget. The step count is a flag: ``--steps N``, or ``--steps-from-probe PROBE.json --pretrain-seconds S``
(the largest seconds per step of the probed arms, co-running as they will run, fits S). ``--probe`` measures that:
every arm's pre-training for ``--probe-steps`` steps on a slice of the corpus, arms of a group side by side
(``--groups mlm,retromae,bow/dupmae,seed``, as the committed probe ran them).

    python benchmarks/from_scratch.py --tiny                          # CPU smoke: proves the plumbing, nothing else
    python benchmarks/from_scratch.py --probe                         # per-step time of every arm (GPU)
    python benchmarks/from_scratch.py --arms mlm --steps 2000         # one arm end to end (one process per arm)
    python benchmarks/from_scratch.py --arms dupmae --steps-from-probe benchmarks/results/from_scratch_probe.json \\
        --pretrain-seconds 150
    python benchmarks/from_scratch.py --report-only                   # table, JSON and plot of the ledger

``--protocol from_mlm`` runs the papers' own setting instead: "the BERT" is pre-trained with MLM alone from the same
init for the same steps (ledger ``bert``), and every arm (MLM only as the control, RetroMAE, DupMAE, BoW) continues
from it for the same steps again; ``--arms retromae@43`` names a second pre-training seed (data order and masks).
Its ledger and report are ``from_mlm_checkpoint_ledger/`` and ``from_mlm_checkpoint.{json,md}``, with each arm's
gain over the control (paired over seeds) beside its gain from random initialisation (``from_scratch.json``).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import common  # before torch: environment defaults
from common import ENWIKI, RESULTS_DIR, ROOT, SCIFACT, Phases, log, read_json, settings_hash, weights_digest, write_json

ARMS = ["mlm", "retromae", "dupmae", "bow", "seed"]
# protocol -> (the name of its ledger and report files, its arms)
PROTOCOLS = {"scratch": ("from_scratch", ARMS), "from_mlm": ("from_mlm_checkpoint", ["mlm", "retromae", "dupmae", "bow"])}
GROUPS = "mlm,retromae,bow/dupmae,seed"
LABELS = {"mlm": "MLM only", "retromae": "RetroMAE (enhanced)", "dupmae": "DupMAE [CLS]",
          "dupmae_hybrid": "DupMAE hybrid [CLS ; OT]", "bow": "BoW prediction", "seed": "SEED-Encoder"}
# the fine-tuned variants of an arm: the [CLS] encoder always, DupMAE's hybrid beside it
VARIANTS = {"dupmae": ("dupmae", "dupmae_hybrid")}
METRICS = {"ndcg_at_10": "ndcg@10", "mrr_at_10": "mrr@10", "recall_at_100": "recall@100"}
STAGES = "in-batch,hard-negatives"
# in every fine-tuning key: fine-tunings from before 2026-11-26 mined by cosine and match no key of today's
MINING = "the model's own similarity"
SIZES = {"minilm": common.SIZES["minilm"],
         "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}}
COMMON = dict(init_seed=42, pretrain_seed=42, warmup=0.1, ft_negatives=7, parallel_seeds=1, probe_articles=400,
              workers=0, pretrain_timeout=None, stage_timeout=None)
PRESETS = {
    # a lent H100/H200, arms side by side; the step count comes from the first call's probe (--steps / --steps-from-probe);
    # fine-tuning in bf16 mixed precision (the papers fine-tune in fp16): in fp32, six took 280 s of the first call
    "gpu": dict(COMMON, size="minilm", max_seq_length=256, batch_size=128, pretrain_lr=5e-4, steps=None, bf16=True,
                enwiki_articles=None, ft_bf16=True, ft_batch_size=32, ft_max_seq_length=256, ft_lr=5e-5, ft_epochs=10,
                coverage_docs=1000, seeds="42,43,44", probe_steps=60, parallel_seeds=7, workers=2),
    # CPU smoke run: a tiny model, a few steps, a mini SciFact; proves the plumbing and nothing about the methods
    "tiny": dict(COMMON, size="tiny", max_seq_length=64, batch_size=4, pretrain_lr=5e-4, steps=3, bf16=False,
                 enwiki_articles=30, ft_bf16=False, ft_batch_size=8, ft_max_seq_length=64, ft_lr=5e-5, ft_epochs=1,
                 ft_negatives=3, coverage_docs=8, seeds="42,43", probe_steps=3, probe_articles=20),
}
TINY_NOTE = ("--tiny smoke run: a tiny model, a few pre-training steps, a mini SciFact. These numbers prove "
             "nothing about the methods.")
PRETRAIN_DONE = ".pretrain_done"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# the budgets of the papers' own runs, from the presets in configs/ (steps x sequences x L = token positions)
PAPER_BUDGETS = [
    ("SEED-Encoder, from scratch (configs/seed-wiki-book.yaml)", 1_000_000, 256, 512),
    ("BoW prediction, from bert-base-uncased (configs/bow-wiki-book.yaml)", 140_000, 2048, 512),
]
PAPER_EPOCHS_NOTE = ("RetroMAE and DupMAE (configs/retromae-wiki-book.yaml, dupmae-wiki-book.yaml): 8 epochs of "
                     "Wikipedia + BookCorpus at 256 sequences x L 512 per step, starting from bert-base-uncased")


# ---- commands --------------------------------------------------------------------------------------------------------


def run_cli(command: str, args: list[str], log_file: Path, timeout: float | None = None,
            env: dict[str, str] | None = None) -> None:
    """``retromae COMMAND ARGS`` in its own process (`common.retromae_cli`, with a time limit: a stage that hangs on a
    lent machine must not take the whole call)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ retromae {command} {' '.join(args)}\n")
        fh.flush()
        try:
            proc = subprocess.run([sys.executable, "-m", "retromae.trainers.cli", command, *args], cwd=ROOT, stdout=fh,
                                  stderr=subprocess.STDOUT, check=False, timeout=timeout,
                                  env={**os.environ, "RETROMAE_DEBUG": "1", **(env or {})})
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"retromae {command} ran past its {timeout:.0f} s limit; log {log_file}") from None
    if proc.returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
        raise RuntimeError(f"retromae {command} failed (exit {proc.returncode}); log {log_file}:\n" + "\n".join(tail))


def library_versions() -> dict[str, str]:
    """The versions an arm ran with (a lent GPU has its own, see benchmarks/device/README.md)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "sentence-transformers", "huggingface_hub", "datasets", "mteb", "faiss-cpu",
                 "tokenizers", "accelerate"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def package_commit() -> str | None:
    """The commit of the tree an arm ran with: RETROMAE_COMMIT (set where the tree has no .git, e.g. a copy on a
    GPU machine), else git's."""
    if os.environ.get("RETROMAE_COMMIT"):
        return os.environ["RETROMAE_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def make_bert(out: Path, ledger: Path, init: Path, corpus: Path, cfg: dict, steps: int) -> Path:
    """"The BERT" of the from_mlm protocol: MLM alone from the random init for `steps` (the ``mlm`` arm's
    pre-training), saved as a plain `BertForMaskedLM` with its trained MLM head, as bert-base-uncased is; made once
    per machine and settings. Every arm, the control included, continues from it."""
    phases = Phases(ledger, "bert")
    args = pretrain_args("mlm", init, corpus, cfg, steps)
    key = settings_hash(args)
    phases.run("init_weights", settings_hash([str(init)]), lambda: weights_digest(init))

    def make() -> Path:
        checkpoint = pretrain("bert", out / "bert" / f"pretrained-{key}", args, out / "bert" / "log.txt", cfg)
        return masked_lm_folder(checkpoint, out / "bert" / f"bert-{key}")

    return Made(phases, "bert", key, make, PRETRAIN_DONE).get()


def masked_lm_folder(checkpoint: Path, target: Path) -> Path:
    """The MLM-only pre-training `checkpoint` (keys `bert.*`, `cls.*`) as a `BertForMaskedLM` folder with its
    tokenizer; every weight of it taken over (only the decoder tied to the word embeddings may be absent)."""
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForMaskedLM

    fields = read_json(checkpoint / "config.json")
    config = BertConfig(**{k: v for k, v in fields.items() if k in BertConfig().to_dict() and k != "model_type"})
    model = BertForMaskedLM(config)
    weights = load_file(checkpoint / "model.safetensors")
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}:
        raise RuntimeError(f"{checkpoint} is not an MLM checkpoint of BERT's layout: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:  # copied: loading would ask to trust the checkpoint's remote code
        if (checkpoint / name).is_file():
            shutil.copy(checkpoint / name, tmp / name)
    (tmp / PRETRAIN_DONE).write_text("ok\n")
    os.replace(tmp, target)
    return target


def parse_arm(spec: str, cfg: dict) -> tuple[str, int, str]:
    """`arm` or `arm@PRETRAIN_SEED` -> (arm, its pre-training seed, its ledger name: `arm_pSEED` for a seed other
    than the preset's)."""
    arm, _, seed = spec.partition("@")
    pretrain_seed = int(seed) if seed else cfg["pretrain_seed"]
    return arm, pretrain_seed, arm if pretrain_seed == cfg["pretrain_seed"] else f"{arm}_p{pretrain_seed}"


def make_init(out: Path, cfg: dict) -> Path:
    """The random encoder every arm starts from: `BertForMaskedLM` of `cfg["size"]`, seeded, with the MiniLM
    tokenizer (the bert-base-uncased vocabulary), saved once per settings."""
    sizes = SIZES[cfg["size"]]
    folder = out / f"init-{cfg['size']}-s{cfg['init_seed']}"
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = common.load_tokenizer()
    torch.manual_seed(cfg["init_seed"])
    config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=512, **sizes)
    tmp = folder.with_name(folder.name + ".tmp")
    BertForMaskedLM(config).save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


def make_corpus(out: Path, data: Path, articles: int | None, name: str = "corpus") -> Path:
    """The pre-training corpus folder: enwiki-sample/train.txt (or its first `articles` articles) and the SciFact
    corpus (`data`'s), read by `retromae pretrain` as one corpus (`read_corpus`: every .txt and .jsonl file)."""
    folder = out / (name if articles is None else f"{name}-{articles}")
    if (folder / "scifact.jsonl").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    enwiki = ENWIKI if articles is None else common.enwiki_slice(out, articles)
    (folder / "enwiki.txt").symlink_to(enwiki.resolve())
    (folder / "scifact.jsonl").symlink_to((data / "corpus.jsonl").resolve())  # not corpus.jsonl: no BEIR folder
    return folder


def method_args(arm: str, cfg: dict) -> tuple[str, list[str]]:
    """`common.PRETRAIN`'s method and flags; DupMAE's [CLS] projection at most the hidden size (the tiny model)."""
    method, extra = common.PRETRAIN[arm]
    hidden = SIZES[cfg["size"]]["hidden_size"]
    if arm == "dupmae" and hidden < 384:
        options = {**json.loads(extra[extra.index("--method_options") + 1]), "dense_dim": hidden}
        extra = ["--method_options", json.dumps(options)]
    return method, list(extra)


def pretrain_args(arm: str, init: Path, corpus: Path, cfg: dict, steps: int) -> list[str]:
    method, extra = method_args(arm, cfg)
    return ["--method", method, *extra, "--model", str(init), "--corpus", str(corpus), "--packing", "true",
            "--max_seq_length", str(cfg["max_seq_length"]), "--per_device_train_batch_size", str(cfg["batch_size"]),
            "--max_steps", str(steps), "--learning_rate", str(cfg["pretrain_lr"]),
            "--warmup_steps", str(cfg["warmup"]), "--seed", str(cfg["pretrain_seed"]),
            "--include_num_input_tokens_seen", "true", "--report_to", "none", "--disable_tqdm", "true",
            "--no_export", *(["--bf16", "true"] if cfg["bf16"] else []), *worker_args(cfg)]


def worker_args(cfg: dict) -> list[str]:
    """DataLoader workers: they pad (pre-training) or tokenise (fine-tuning) the next batch while the GPU runs this
    one; the weights are the same with or without them (the fine-tuning's settings key leaves them out)."""
    return ["--dataloader_num_workers", str(cfg["workers"])] if cfg["workers"] else []


def pretrain(arm: str, folder: Path, args: list[str], logf: Path, cfg: dict) -> Path:
    """`retromae pretrain ARGS` into `folder` (one checkpoint, at the end); its own datasets cache, so arms side by
    side do not write the same cache files."""
    flags = ["--output_dir", str(folder), "--logging_steps", "50", "--save_steps", args[args.index("--max_steps") + 1],
             "--save_total_limit", "1", "--overwrite_output_dir"]
    run_cli("pretrain", args + flags, logf, cfg["pretrain_timeout"],
            env={"HF_DATASETS_CACHE": str(folder.parent / f"datasets-cache-{arm}")})
    (folder / PRETRAIN_DONE).write_text("ok\n")
    return folder


def pretraining_record(folder: Path, cfg: dict) -> dict:
    """Steps, seconds, seconds per step and token positions trained on (the Trainer's count; packed sequences are
    full length, so it is the real count but for the corpus's last block) of a finished pre-training, and its last
    logged encoder MLM accuracy."""
    from retromae.trainers.training.run_folder import last_complete_checkpoint

    state = read_json(last_complete_checkpoint(folder) / "trainer_state.json")
    runtime = next((e["train_runtime"] for e in reversed(state["log_history"]) if "train_runtime" in e), None)
    logged = [e for e in state["log_history"] if "loss" in e]
    losses = [e["loss"] for e in logged]
    accuracies = [e["encoder_mlm_accuracy"] for e in logged if "encoder_mlm_accuracy" in e]
    steps = state["global_step"]
    return {"steps": steps, "batch_size": cfg["batch_size"], "max_seq_length": cfg["max_seq_length"],
            "train_seconds": runtime and round(float(runtime), 1),
            "seconds_per_step": round(float(runtime) / steps, 4) if runtime else None,
            "tokens_seen": state.get("num_input_tokens_seen"), "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "encoder_mlm_accuracy": accuracies[-1] if accuracies else None}


def coverage(model: Path, data: Path, out: Path, cfg: dict, projection: str, logf: Path) -> dict:
    """`retromae coverage` of `model` on the first documents of `data`'s corpus; {k: coverage@k}."""
    run_cli("coverage", ["--model", str(model), "--corpus", str(data), "--max-texts", str(cfg["coverage_docs"]),
                         "--max-seq-length", str(cfg["max_seq_length"]), "--projection", projection,
                         "--output-dir", str(out), "--no-progress"], logf, cfg["stage_timeout"])
    return {k: round(v, 4) for k, v in read_json(out / "coverage.json")["coverage"][str(model)].items()}


def scores(summary: Path) -> dict:
    """NDCG@10, MRR@10 and Recall@100 of a `retromae evaluate` summary.json (one task, one split)."""
    (row,) = read_json(summary)["results"]
    return {k: row[k] for k in (*METRICS, "queries")}


def zero_shot(model: Path, data: Path, out: Path, cfg: dict, logf: Path) -> dict:
    """`retromae evaluate` of a pre-trained encoder before any fine-tuning, on dev."""
    run_cli("evaluate", [str(model), "--beir-folder", str(data), "--split", "dev", "--output-dir", str(out),
                         "--no-progress"], logf, cfg["stage_timeout"])
    return scores(out / "summary.json")


def dupmae_cls_export(ckpt: Path, target: Path, cfg: dict) -> Path:
    """DupMAE's encoder with its [CLS] state alone as the representation (no projection, no sparse part)."""
    from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer

    build_dupmae_sentence_transformer(str(ckpt), None, target, overwrite=True, representation="cls",
                                      dense_dim=read_json(ckpt / "config.json")["hidden_size"],
                                      max_seq_length=cfg["ft_max_seq_length"])
    return target


def finetune(start: Path, data: Path, output: Path, cfg: dict, seed: int, logf: Path) -> dict:
    """`retromae finetune` (in-batch, then negatives mined with the stage-1 model) and its dev evaluation."""
    work = output.parent / f"{output.name}.work"
    args = [str(start), str(data), "--output_dir", str(output), "--overwrite", "--stages", STAGES,
            "--num_train_epochs", str(cfg["ft_epochs"]), "--per_device_train_batch_size", str(cfg["ft_batch_size"]),
            "--max_seq_length", str(cfg["ft_max_seq_length"]), "--learning_rate", str(cfg["ft_lr"]),
            "--num_negatives", str(cfg["ft_negatives"]), "--seed", str(seed), "--report_to", "none",
            "--disable_tqdm", "true", "--work_dir", str(work), "--eval_data", str(data), "--eval_split", "dev",
            *(["--bf16", "true"] if cfg["ft_bf16"] else []), *worker_args(cfg)]
    run_cli("finetune", args, logf, cfg["stage_timeout"])
    stages = read_json(output / "retromae_finetune.json")["stages"]
    return {"stages": {s["stage"]: {k: s.get(k) for k in ("steps", "seconds", "examples", "train_loss")}
                       for s in stages}, "dev": scores(work / "eval" / "summary.json")}


# ---- one arm ---------------------------------------------------------------------------------------------------------


class Made:
    """A folder a phase makes (the pre-training, DupMAE's [CLS] export): known from the ledger without the folder,
    made (again) only when a phase that is not in the ledger needs it, once however many threads ask."""

    def __init__(self, phases: Phases, name: str, key: str, make: Callable[[], Path], done_file: str):
        self.phases, self.name, self.key, self.make, self.done_file = phases, name, key, make, done_file
        self._lock, self._made = threading.Lock(), None

    def get(self) -> Path:
        with self._lock:
            if self._made is None:
                result = self.phases.run(self.name, self.key, lambda: common.ledger_path(self.make()),
                                         needs=lambda r: common.folder_of(r) / self.done_file)
                self._made = common.folder_of(result)
                self.phases.run(f"{self.name}_weights", self.key, lambda: weights_digest(self._made))
            return self._made


def run_arm(arm: str, out: Path, ledger: Path, data: Path, init: Path, corpus: Path, cfg: dict, steps: int,
            command: str = "", name: str | None = None) -> dict:
    """Pre-train `arm` from `init`, then its coverage, zero-shot and fine-tuning phases; `name` (default `arm`)
    names its ledger and folder (an arm run with another pre-training seed)."""
    name = name or arm
    phases = Phases(ledger, name)
    folder, logf = out / name, out / name / "log.txt"
    args = pretrain_args(arm, init, corpus, cfg, steps)
    key = settings_hash(args)
    phases.run("command", key, lambda: command)  # the invocation that first ran the arm, for the report
    phases.run("libraries", key, library_versions)
    phases.run("commit", key, package_commit)
    phases.run("init_weights", settings_hash([str(init)]), lambda: weights_digest(init))
    ckpt = Made(phases, "pretrain", key, lambda: pretrain(arm, folder / f"pretrained-{key}", args, logf, cfg),
                PRETRAIN_DONE)
    starts: dict[str, Callable[[], Path]] = {arm: ckpt.get}
    if arm == "dupmae":  # the [CLS] view is exported here; the checkpoint itself is the hybrid model
        cls_key = settings_hash([key, cfg["ft_max_seq_length"]])
        cls_view = Made(phases, "export_cls", cls_key, lambda: dupmae_cls_export(
            ckpt.get(), folder / f"export-cls-{cls_key}", cfg), "modules.json")
        starts = {"dupmae": cls_view.get, "dupmae_hybrid": ckpt.get}
    ft_cfg = {k: cfg[k] for k in sorted(cfg) if k.startswith("ft_")}
    jobs: list[tuple[list[tuple[str, str]], Callable[[], object]]] = []  # (the phases a job makes, the job)

    def one_seed(variant: str, start: Callable[[], Path], seed: int, name: str, ft_key: str) -> None:
        ft_dir = folder / f"finetuned-{variant}-s{seed}-{ft_key}"
        seed_log = folder / f"log-{name}.txt"  # one per fine-tuning: they run side by side
        result = phases.run(f"finetune_{name}", ft_key, lambda: finetune(start(), data, ft_dir, cfg, seed, seed_log),
                            notes=lambda: {"start_weights": weights_digest(ckpt.get())})
        phases.run(f"evaluate_{name}", ft_key, lambda: result["dev"])

    def add_phase(name: str, phase_key: str, fn: Callable[[], object]) -> None:
        jobs.append(([(name, phase_key)], lambda: phases.run(name, phase_key, fn)))

    for variant, start in starts.items():
        for seed in cfg["seed_list"]:
            ft_key, name = settings_hash([key, variant, str(data), seed, ft_cfg, STAGES, MINING]), f"{variant}_s{seed}"
            jobs.append(([(f"finetune_{name}", ft_key), (f"evaluate_{name}", ft_key)],
                         partial(one_seed, variant, start, seed, name, ft_key)))
    add_phase("pretraining_record", key, lambda: pretraining_record(ckpt.get(), cfg))
    cov_key = settings_hash([key, cfg["coverage_docs"], cfg["max_seq_length"], str(data)])
    for name, projection in (("coverage", "embeddings"), ("coverage_lm_head", "lm_head")):
        add_phase(name, cov_key, lambda p=projection: coverage(ckpt.get(), data, folder / f"{p}-{cov_key}", cfg, p,
                                                               logf))
    for variant, start in starts.items():
        zs_key = settings_hash([key, variant, str(data)])
        add_phase(f"zeroshot_{variant}", zs_key, lambda s=start, z=folder / f"zeroshot-{variant}-{zs_key}": zero_shot(
            s(), data, z, cfg, logf))
    pending = [job for made, job in jobs if not all(phases.cached(*m) for m in made)]
    if not pending:  # a finished arm: its checkpoint is not made again
        return phases.done
    for start in starts.values():  # the pre-training (and DupMAE's export) before the rest, which all read it
        start()
    # the fine-tunings, the long GPU work, first in the queue; the diagnostics take the pool's other workers
    with ThreadPoolExecutor(max_workers=max(1, cfg["parallel_seeds"])) as pool:
        for future in [pool.submit(job) for job in pending]:
            future.result()
    return phases.done


# ---- probe and budget ------------------------------------------------------------------------------------------------


def parse_groups(text: str, arms: list[str]) -> list[list[str]]:
    groups = [[a for a in g.split(",") if a in arms] for g in text.split("/")]
    return [g for g in groups if g]


def probe(out: Path, init: Path, corpus: Path, cfg: dict, groups: list[list[str]]) -> dict:
    """Each arm's pre-training for `probe_steps` steps on a corpus slice, the arms of a group side by side (as the
    GPU calls run them): seconds per step from the Trainer's runtime (start-up of the first steps included, so an
    over- rather than an under-estimate)."""
    steps = cfg["probe_steps"]
    result: dict = {"steps": steps, "groups": groups, "hardware": common.hardware_summary(), "date": common.utc_now(),
                    "settings": {k: cfg[k] for k in ("size", "max_seq_length", "batch_size", "bf16")}, "arms": {}}
    for group in groups:
        started = time.perf_counter()

        def one(arm: str, group=group) -> tuple[str, dict]:
            args = pretrain_args(arm, init, corpus, cfg, steps)
            folder = out / "probe" / f"{arm}-{settings_hash(args)}"
            pretrain(arm, folder, args, out / "probe" / f"{arm}.log", cfg)
            return arm, {**pretraining_record(folder, cfg), "side_by_side": group}

        with ThreadPoolExecutor(max_workers=len(group)) as pool:
            for arm, record in pool.map(one, group):
                result["arms"][arm] = record
        log(f"probe {group}: {time.perf_counter() - started:.0f} s, "
            + ", ".join(f"{a} {result['arms'][a]['seconds_per_step']} s/step" for a in group))
    return result


def steps_from_probe(probe_file: Path, seconds: float) -> tuple[int, dict]:
    """The step count whose pre-training takes at most `seconds` for the slowest probed arm (a multiple of 10)."""
    found = read_json(probe_file)
    per_step = max(a["seconds_per_step"] for a in found["arms"].values())
    steps = max(10, int(seconds / per_step) // 10 * 10)
    return steps, {"probe": common.ledger_path(probe_file), "pretrain_seconds": seconds,
                   "slowest_seconds_per_step": per_step, "probe_hardware": found.get("hardware")}


# ---- report ----------------------------------------------------------------------------------------------------------


def seed_rows(done: dict, variant: str) -> list[dict]:
    """The seeds of `variant` both fine-tuned and evaluated in an arm's ledger, as [{seed, ndcg@10, ...}]."""
    rows = []
    for name, entry in done.items():
        prefix = f"evaluate_{variant}_s"
        seed = name[len(prefix):]
        if name.startswith(prefix) and seed.isdigit() and f"finetune_{variant}_s{seed}" in done:
            finetuned = done[f"finetune_{variant}_s{seed}"]
            rows.append({"seed": int(seed), **{label: entry["result"][k] for k, label in METRICS.items()},
                         "hardware": finetuned.get("hardware"), "start_weights": finetuned.get("start_weights")})
    return sorted(rows, key=lambda r: r["seed"])


def mixed_starts(variant: dict) -> str | None:
    """A sentence when a variant's seeds were fine-tuned from more than one pre-training (an arm pre-trained again on
    a new machine: GPU pre-training is not bit-reproducible), naming which seeds used which weights; else None."""
    starts: dict[str, list[int]] = {}
    for row in variant["seeds"]:
        if row.get("start_weights"):
            starts.setdefault(row["start_weights"], []).append(row["seed"])
    if len(starts) < 2:
        return None
    groups = "; ".join(f"{digest}: seeds {', '.join(map(str, seeds))}" for digest, seeds in starts.items())
    return (f"{variant['label']}: its seeds were fine-tuned from {len(starts)} pre-training runs of the same settings "
            f"({groups}), so their spread includes the pre-training's.")


def summary(rows: list[dict]) -> dict:
    """Mean and sample std over seeds of each metric (std None for one seed)."""
    out = {}
    for label in METRICS.values():
        mean, std = common.mean_std([r[label] for r in rows]) if rows else (None, None)
        out[label] = mean
        out[f"{label}_std"] = std
    return out


def variant_record(done: dict, variant: str) -> dict:
    rows = seed_rows(done, variant)
    zs = (done.get(f"zeroshot_{variant}") or {}).get("result")
    return {"label": LABELS[variant], "seeds": rows, **summary(rows),
            "zero_shot": zs and {label: zs[k] for k, label in METRICS.items()}}


def wall_seconds(done: dict) -> float:
    """Seconds in which some phase of an arm ran: the union of the phases' spans, so phases side by side count once
    and the time between two calls not at all. An entry without its finish time adds its seconds."""
    spans, loose = [], 0.0
    for entry in done.values():
        seconds = entry.get("seconds") or 0.0
        if entry.get("finished"):
            end = datetime.datetime.fromisoformat(entry["finished"]).timestamp()
            spans.append((end - seconds, end))
        else:
            loose += seconds
    total, reached = loose, float("-inf")
    for start, end in sorted(spans):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return round(total, 1)


def arm_record(done: dict, arm: str) -> dict | None:
    """An arm as the results JSON holds it (from its ledger); None when the ledger holds nothing of it."""
    if not done:
        return None
    pre = (done.get("pretraining_record") or {}).get("result")
    record = {"arm": arm, **variant_record(done, arm), "pretraining": pre,
              "command": (done.get("command") or {}).get("result"),
              "libraries": (done.get("libraries") or {}).get("result"),
              "init_weights": (done.get("init_weights") or {}).get("result"),
              "pretrain_weights": (done.get("pretrain_weights") or {}).get("result"),
              "coverage": (done.get("coverage") or {}).get("result"),
              "coverage_lm_head": (done.get("coverage_lm_head") or {}).get("result"),
              "hardware": sorted({e["hardware"] for e in done.values() if e.get("hardware")}),
              "wall_s": wall_seconds(done),
              "phase_seconds": {name: e.get("seconds") for name, e in done.items()}}
    if arm == "dupmae":
        record["hybrid"] = variant_record(done, "dupmae_hybrid")
    return record


def versus_mlm(arms: dict) -> list[dict]:
    """Each arm's fine-tuned NDCG@10 minus MLM-only's: seed by seed (a shared seed shares the fine-tuning noise), the
    difference of the means, and whether it exceeds twice the larger seed spread (the issue's bar); zero-shot too."""
    mlm = arms.get("mlm")
    if not mlm or not mlm["seeds"]:
        return []
    base = {r["seed"]: r["ndcg@10"] for r in mlm["seeds"]}
    out = []
    for arm, rec in arms.items():
        for variant in ([rec] + ([rec["hybrid"]] if rec.get("hybrid") else [])):
            if arm == "mlm" or not variant["seeds"]:
                continue
            diffs = {r["seed"]: r["ndcg@10"] - base[r["seed"]] for r in variant["seeds"] if r["seed"] in base}
            spread = max(s for s in (variant["ndcg@10_std"], mlm["ndcg@10_std"], 0.0) if s is not None)
            delta = variant["ndcg@10"] - mlm["ndcg@10"]
            zs = (variant["zero_shot"] or {}).get("ndcg@10")
            out.append({"arm": arm, "label": variant["label"], "ndcg@10_diff_by_seed": diffs,
                        "ndcg@10_diff_mean": delta, "larger_seed_std": spread,
                        "beats_mlm_by_2x_spread": delta > 2 * spread if len(variant["seeds"]) > 1 else None,
                        "zero_shot_ndcg@10_diff": None if zs is None or not mlm["zero_shot"]
                        else zs - mlm["zero_shot"]["ndcg@10"]})
    return out


def budget_lines(cfg: dict, steps: int | None) -> list[str]:
    if not steps:
        return []
    ours = steps * cfg["batch_size"] * cfg["max_seq_length"]
    lines = [f"Budget: {steps} steps x {cfg['batch_size']} sequences x L {cfg['max_seq_length']} = {ours:,} token "
             "positions per arm (packed). The papers' own runs:"]
    for name, p_steps, batch, length in PAPER_BUDGETS:
        theirs = p_steps * batch * length
        lines.append(f"- {name}: {p_steps:,} steps x {batch} x L {length} = {theirs:,} positions, "
                     f"{theirs / ours:,.0f} times this budget;")
    lines.append(f"- {PAPER_EPOCHS_NOTE}.")
    return lines


def fmt(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" + ("" if std is None else f" ± {std:.4f}")


def cov_cell(cov: dict | None) -> str:
    return "-" if not cov else " / ".join(f"{cov[k]:.3f}" for k in ("10", "20", "50", "100"))


def markdown(payload: dict) -> str:
    meta, cfg, arms = payload["meta"], payload["settings"], payload["arms"]
    header = ("arm", "dev NDCG@10", "MRR@10", "Recall@100", "NDCG@10 per seed", "zero-shot NDCG@10 / MRR@10 / R@100",
              "coverage@10/20/50/100, LM head", "coverage, Eᵀ", "MLM accuracy, last step", "steps", "tokens seen",
              "s/step", "wall (s)")
    lines = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    mixed = []  # the variants whose seeds started from more than one pre-training
    for arm in ARMS:
        rec = arms.get(arm)
        if rec is None:
            continue
        pre = rec.get("pretraining") or {}
        for variant in [rec] + ([rec["hybrid"]] if rec.get("hybrid") else []):
            zs = variant.get("zero_shot")
            planned = len(cfg["seed_list"])
            label = variant["label"] + (f" ({len(variant['seeds'])} of {planned} seeds)"
                                        if len(variant["seeds"]) < planned else "")
            cells = (label, fmt(variant["ndcg@10"], variant["ndcg@10_std"]), fmt(variant["mrr@10"], variant["mrr@10_std"]),
                     fmt(variant["recall@100"], variant["recall@100_std"]),
                     ", ".join(f"{r['seed']}: {r['ndcg@10']:.4f}" for r in variant["seeds"]) or "-",
                     " / ".join(fmt(zs[m]) for m in METRICS.values()) if zs else "-",
                     cov_cell(rec.get("coverage_lm_head")), cov_cell(rec.get("coverage")),
                     fmt(pre.get("encoder_mlm_accuracy")),
                     str(pre.get("steps", "-")), f"{pre['tokens_seen']:,}" if pre.get("tokens_seen") else "-",
                     str(pre.get("seconds_per_step", "-")), f"{rec['wall_s']:.0f}")
            lines.append("| " + " | ".join(cells) + " |")
            sentence = mixed_starts(variant)
            if sentence:
                mixed.append(sentence)
    if mixed:
        lines += ["", *mixed]
    if payload.get("bm25"):
        ref = payload["bm25"]
        lines += ["", f"For scale, lexical retrieval on the same dev queries: {ref['label']}, "
                  f"NDCG@10 {ref['ndcg@10']:.4f}, MRR@10 {ref['mrr@10']:.4f}, Recall@100 {ref['recall@100']:.4f}."]
    if payload["versus_mlm"]:
        lines += ["", "| vs MLM only (dev NDCG@10) | per seed | mean difference | > 2 x seed std | zero-shot difference |",
                  "|---|---|---|---|---|"]
        for d in payload["versus_mlm"]:
            per_seed = ", ".join(f"{s}: {v:+.4f}" for s, v in d["ndcg@10_diff_by_seed"].items())
            bar = {True: "yes", False: "no", None: "-"}[d["beats_mlm_by_2x_spread"]]
            zs = "-" if d["zero_shot_ndcg@10_diff"] is None else f"{d['zero_shot_ndcg@10_diff']:+.4f}"
            lines.append(f"| {d['label']} | {per_seed} | {d['ndcg@10_diff_mean']:+.4f} | {bar} "
                         f"(2 x {d['larger_seed_std']:.4f}) | {zs} |")
    hardware = sorted({h for rec in arms.values() for h in rec["hardware"]})
    commands, libraries = {}, {}
    for arm, rec in arms.items():
        commands.setdefault(rec.get("command") or "-", []).append(arm)
        if rec.get("libraries"):
            libraries.setdefault(", ".join(f"{k} {v}" for k, v in rec["libraries"].items() if v), []).append(arm)
    init_digests = sorted({rec["init_weights"] for rec in arms.values() if rec.get("init_weights")})
    lines += ["", f"Preset {meta['preset']}: a {cfg['size']} encoder ({SIZES[cfg['size']]}), random init seed "
              f"{cfg['init_seed']} (weights {', '.join(init_digests) or '-'}), pre-trained on enwiki-sample + the "
              f"SciFact corpus, packed, L {cfg['max_seq_length']}, batch {cfg['batch_size']}, lr {cfg['pretrain_lr']} "
              f"(warm-up {cfg['warmup']}, linear decay), seed {cfg['pretrain_seed']}{', bf16' if cfg['bf16'] else ''}; "
              f"fine-tuning ({'bf16 mixed precision' if cfg['ft_bf16'] else 'fp32'}) `retromae finetune --stages "
              f"{STAGES}` on qrels/train.tsv ({cfg['ft_epochs']} epochs per stage, batch {cfg['ft_batch_size']}, L {cfg['ft_max_seq_length']}, lr {cfg['ft_lr']}, "
              f"{cfg['ft_negatives']} mined negatives), seeds {cfg['seed_list']} (mean ± sample std); dev scores by "
              f"`retromae evaluate`. Nothing was tuned on dev.",
              f"Machines: {'; '.join(hardware) or '-'}. Arms run by: "
              + "; ".join(f"{', '.join(a)}: `{c}`" for c, a in commands.items()) + f". Report: `{meta['command']}`."
              + ("" if not libraries else " Libraries: " + "; ".join(f"{', '.join(a)}: {v}"
                                                                   for v, a in libraries.items()) + ".")]
    if meta.get("steps_from"):
        sf = meta["steps_from"]
        lines.append(f"Steps fixed from the probe {sf['probe']} ({sf['probe_hardware']}): slowest arm "
                     f"{sf['slowest_seconds_per_step']} s/step, {sf['pretrain_seconds']} s of pre-training.")
    lines += ["", *budget_lines(cfg, meta.get("steps"))]
    if meta["preset"] == "tiny":
        lines.insert(0, f"**{TINY_NOTE}**\n")
    return "\n".join(lines) + "\n"


def plot(payload: dict, path: Path) -> None:
    """Fine-tuned dev NDCG@10 per arm (error bars: std over seeds) beside zero-shot, MLM-only dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for arm in ARMS:
        rec = payload["arms"].get(arm)
        for variant in ([rec] + ([rec["hybrid"]] if rec.get("hybrid") else [])) if rec else []:
            if variant["seeds"]:
                rows.append(variant)
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(8, 4.4))
    ys = list(range(len(rows)))[::-1]
    ax.barh(ys, [r["ndcg@10"] for r in rows], xerr=[r["ndcg@10_std"] or 0 for r in rows], color="#3b75af",
            height=0.6, label="fine-tuned (mean ± std over seeds)")
    zs = [((r.get("zero_shot") or {}).get("ndcg@10")) for r in rows]
    ax.scatter([z for z in zs if z is not None], [y for y, z in zip(ys, zs, strict=True) if z is not None],
               color="#d62728", marker="|", s=300, label="zero-shot, before fine-tuning", zorder=3)
    mlm = payload["arms"].get("mlm")
    if mlm and mlm["seeds"]:
        ax.axvline(mlm["ndcg@10"], ls="--", lw=0.8, color="#444444")
    if payload.get("bm25"):
        ax.axvline(payload["bm25"]["ndcg@10"], ls=":", lw=1.2, color="#888888")
    ax.set_yticks(ys, [r["label"] for r in rows])
    ax.set_xlabel("SciFact dev NDCG@10 (dashed: MLM only" + (", dotted: BM25)" if payload.get("bm25") else ")"))
    title = f"From random init, {payload['meta'].get('steps')} pre-training steps ({payload['meta']['preset']})"
    ax.set_title(title + (" — smoke run, proves nothing" if payload["meta"]["preset"] == "tiny" else ""), fontsize=10)
    # below the axes: inside, any corner can cover a bar, its error bar or the MLM line
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=120)
    os.replace(tmp, path)
    plt.close(fig)


def lexical_reference(data: Path) -> dict | None:
    """BM25 on the dev split, for scale beside the dense arms and the hybrid's lexical channel; None where bm25s is
    not installed (the lent GPU machine): the report here, after the session, adds it."""
    try:
        import bm25s  # noqa: F401
    except ImportError:
        return None
    scores = common.bm25_reference(data)
    return {"label": "BM25 (bm25s, k1 1.5, b 0.75)", **{name: scores[key] for key, name in METRICS.items()}}


def report(results_dir: Path, ledger: Path, cfg: dict, meta: dict, bm25: dict | None = None) -> dict:
    """`from_scratch.{json,md}` and `from_scratch_ndcg.png` from every arm the ledger holds; `bm25`
    (lexical_reference's) adds a line for scale to the table and the plot."""
    arms = {}
    for arm in ARMS:
        file = ledger / f"{arm}.phases.json"
        record = arm_record(read_json(file), arm) if file.is_file() else None
        if record is not None:
            arms[arm] = record
    steps = {rec["pretraining"]["steps"] for rec in arms.values() if rec.get("pretraining")}
    if meta.get("steps") is None and len(steps) == 1:
        meta["steps"] = steps.pop()
    payload = {"meta": meta, "settings": cfg, "arms": arms, "versus_mlm": versus_mlm(arms),
               "bm25": bm25}
    if meta["preset"] == "tiny":
        payload["note"] = TINY_NOTE
    payload["table_markdown"] = markdown(payload)
    write_json(results_dir / "from_scratch.json", payload)
    (results_dir / "from_scratch.md").write_text(payload["table_markdown"], encoding="utf-8")
    plot(payload, results_dir / "from_scratch_ndcg.png")
    return payload


# ---- the from_mlm protocol's report -----------------------------------------------------------------------------------


def from_mlm_runs(ledger: Path, cfg: dict) -> dict[str, list[dict]]:
    """Each fine-tuned variant's rows over every pre-training seed: variant -> [{pretrain_seed, seed, ndcg@10, ...,
    init_weights}] (DupMAE's hybrid as `dupmae_hybrid`)."""
    runs: dict[str, list[dict]] = {}
    for file in sorted(ledger.glob("*.phases.json")):
        name = file.name.removesuffix(".phases.json")
        arm, _, seed = name.partition("_p")
        if arm not in PROTOCOLS["from_mlm"][1] or (seed and not seed.isdigit()):
            continue  # the BERT's own ledger
        done = read_json(file)
        init = (done.get("init_weights") or {}).get("result")
        for variant in VARIANTS.get(arm, (arm,)):
            runs.setdefault(variant, []).extend(
                {"pretrain_seed": int(seed) if seed else cfg["pretrain_seed"], **row, "init_weights": init}
                for row in seed_rows(done, variant))
    return runs


def paired_gain(rows: list[dict], control: list[dict]) -> dict | None:
    """The mean NDCG@10 gain over the control on the (pre-training seed, fine-tuning seed) pairs both have, and the
    two-sided p of a paired t-test over them (None below 2 pairs)."""
    base = {(r["pretrain_seed"], r["seed"]): r["ndcg@10"] for r in control}
    diffs = [r["ndcg@10"] - base[(r["pretrain_seed"], r["seed"])] for r in rows if (r["pretrain_seed"], r["seed"]) in base]
    if not diffs:
        return None
    p_value = None
    if len(diffs) > 1 and any(diffs):
        from scipy.stats import ttest_1samp

        p_value = float(ttest_1samp(diffs, 0.0).pvalue)
    return {"pairs": len(diffs), "mean": sum(diffs) / len(diffs), "paired_p": p_value}


def scratch_gain(scratch: dict | None, variant: str) -> float | None:
    """The same variant's mean NDCG@10 gain over MLM only from random initialisation (`from_scratch.json`)."""
    for entry in (scratch or {}).get("versus_mlm", []):
        if entry["label"] == LABELS[variant]:
            return entry["ndcg@10_diff_mean"]
    return None


def report_from_mlm(results_dir: Path, ledger: Path, cfg: dict, meta: dict) -> dict:
    """`from_mlm_checkpoint.{json,md}`: per variant its rows, mean and std over all rows and per pre-training seed,
    its paired gain over the control and its gain from random initialisation."""
    runs = from_mlm_runs(ledger, cfg)
    scratch_file = results_dir / "from_scratch.json"
    scratch = read_json(scratch_file) if scratch_file.is_file() else None
    control = runs.get("mlm", [])
    arms = {}
    for variant, rows in runs.items():
        by_seed = {}
        for pretrain_seed in sorted({r["pretrain_seed"] for r in rows}):
            chosen = [r["ndcg@10"] for r in rows if r["pretrain_seed"] == pretrain_seed]
            mean, std = common.mean_std(chosen)
            by_seed[str(pretrain_seed)] = {"ndcg@10": mean, "ndcg@10_std": std, "seeds": len(chosen)}
        mean, std = common.mean_std([r["ndcg@10"] for r in rows]) if rows else (None, None)
        gain = None if variant == "mlm" else paired_gain(rows, control)
        arms[variant] = {
            "label": LABELS[variant], "seeds": [{k: r[k] for k in ("pretrain_seed", "seed", "ndcg@10")} for r in rows],
            "ndcg@10": mean, "ndcg@10_std": std, "by_pretrain_seed": by_seed, "gain_over_control": gain,
            "gain_from_scratch": None if variant == "mlm" else scratch_gain(scratch, variant),
            "berts": sorted({r["init_weights"] for r in rows if r["init_weights"]}),
        }
    commits = sorted({c for f in ledger.glob("*.phases.json") if (c := (read_json(f).get("commit") or {}).get("result"))})
    hardware = sorted({r["hardware"] for rows in runs.values() for r in rows if r.get("hardware")})
    payload = {"environment": {"device_name": hardware, "commit": commits, "date": meta["date"]},
               "meta": meta, "settings": cfg, "arms": arms}
    if meta["preset"] == "tiny":
        payload["note"] = TINY_NOTE
    payload["table_markdown"] = from_mlm_markdown(payload)
    write_json(results_dir / "from_mlm_checkpoint.json", payload)
    (results_dir / "from_mlm_checkpoint.md").write_text(payload["table_markdown"], encoding="utf-8")
    return payload


def from_mlm_markdown(payload: dict) -> str:
    env = payload["environment"]
    lines = [f"## Continued from an MLM checkpoint ({', '.join(env['device_name']) or 'no run yet'}; commit "
             f"{', '.join(c[:12] for c in env['commit']) or '?'})", "",
             "| arm | NDCG@10 (mean ± std, all seeds) | per pre-training seed | gain over MLM only (paired p) | "
             "gain from random init |", "|---|---|---|---|---|"]
    for record in payload["arms"].values():
        per_seed = "; ".join(f"{seed}: {fmt(v['ndcg@10'], v['ndcg@10_std'])} ({v['seeds']})"
                             for seed, v in record["by_pretrain_seed"].items())
        gain = record["gain_over_control"]
        gain_text = "control" if record["label"] == LABELS["mlm"] else "–" if gain is None else (
            f"{gain['mean']:+.4f} over {gain['pairs']} pairs" + (f" (p = {gain['paired_p']:.3f})"
                                                                 if gain["paired_p"] is not None else ""))
        scratch = record["gain_from_scratch"]
        lines.append(f"| {record['label']} | {fmt(record['ndcg@10'], record['ndcg@10_std'])} | {per_seed} | "
                     f"{gain_text} | {'–' if scratch is None else f'{scratch:+.4f}'} |")
    berts = {b for record in payload["arms"].values() for b in record["berts"]}
    if len(berts) > 1:
        lines += ["", f"The arms continued from {len(berts)} different BERTs ({', '.join(sorted(berts))}): GPU "
                  "pre-training is not bit-reproducible, so compare only arms of one BERT."]
    if payload.get("note"):
        lines += ["", payload["note"]]
    return "\n".join(lines) + "\n"


# ---- main ------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None):
    p = common.argument_parser(__doc__)
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny model, 3 steps, mini SciFact; proves nothing")
    p.add_argument("--arms", help=f"comma-separated subset of {','.join(ARMS)} (default: the protocol's); "
                   "from_mlm: ARM@SEED for another pre-training seed")
    p.add_argument("--protocol", choices=sorted(PROTOCOLS), default="scratch",
                   help="scratch: every arm from the random init; from_mlm: from the BERT (MLM alone from the init)")
    p.add_argument("--steps", type=int, help="pre-training steps of every arm")
    p.add_argument("--steps-from-probe", type=Path, help="a --probe result: steps so that the slowest arm fits "
                   "--pretrain-seconds")
    p.add_argument("--pretrain-seconds", type=float, help="pre-training seconds per arm, with --steps-from-probe")
    p.add_argument("--probe", action="store_true", help="measure each arm's seconds per step (see --groups)")
    p.add_argument("--groups", default=GROUPS, help=f"arms run side by side, groups split by '/' (default {GROUPS})")
    p.add_argument("--prepare", action="store_true", help="only make the random init and the corpus folder (before "
                   "arms start side by side); from_mlm: the BERT too (with the steps)")
    p.add_argument("--report-only", action="store_true", help="run nothing; report what the ledger holds")
    p.add_argument("--output-dir", help="default out/from_scratch (--tiny: out/from_scratch_tiny); with --tiny or "
                   "this flag the ledger and results go there too")
    p.add_argument("--results-dir", type=Path, help="where the ledger and results go (default: benchmarks/results, "
                   "or the output dir for --tiny)")
    for name, kind, text in (
        ("size", str, "encoder size: minilm or tiny"), ("max-seq-length", int, "pre-training L"),
        ("batch-size", int, "pre-training batch"), ("pretrain-lr", float, "pre-training peak learning rate"),
        ("enwiki-articles", int, "use the first N enwiki articles (default: all)"),
        ("ft-batch-size", int, "fine-tuning batch"), ("ft-max-seq-length", int, "fine-tuning and evaluation L"),
        ("ft-epochs", int, "fine-tuning epochs per stage"), ("ft-lr", float, "fine-tuning learning rate"),
        ("ft-negatives", int, "mined hard negatives per query"), ("coverage-docs", int, "documents for coverage"),
        ("seeds", str, "fine-tuning seeds, e.g. 42,43,44"),
        ("parallel-seeds", int, "phases side by side after the pre-training, fine-tunings first"),
        ("probe-steps", int, "steps of each --probe run"),
        ("workers", int, "DataLoader workers of each pre-training and fine-tuning"),
        ("pretrain-timeout", float, "seconds a pre-training may take before it is stopped"),
        ("stage-timeout", float, "seconds any other command may take"),
    ):
        p.add_argument(f"--{name}", type=kind, help=text)
    return p.parse_args(argv)


def settings(args) -> tuple[str, dict]:
    preset = "tiny" if args.tiny else "gpu"
    cfg = dict(PRESETS[preset])
    for name in cfg:
        value = getattr(args, name, None)
        if value is not None:
            cfg[name] = value
    if cfg["size"] not in SIZES:
        raise SystemExit(f"--size: one of {', '.join(SIZES)}")
    cfg["seed_list"] = [int(s) for s in str(cfg["seeds"]).split(",") if s.strip()]
    return preset, cfg


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    preset, cfg = settings(args)
    results_name, protocol_arms = PROTOCOLS[args.protocol]
    arms = args.arms.split(",") if args.arms else list(protocol_arms)
    unknown = sorted({a.partition("@")[0] for a in arms} - set(protocol_arms))
    if unknown or (args.protocol == "scratch" and any("@" in a for a in arms)):
        raise SystemExit(f"--arms: {unknown or 'ARM@SEED'} not in protocol {args.protocol}; choose from "
                         f"{','.join(protocol_arms)}" + (" (ARM@SEED for another pre-training seed)"
                                                         if args.protocol == "from_mlm" else ""))
    if not (SCIFACT / "corpus.jsonl").is_file() or not ENWIKI.is_file():
        print(f"SciFact or enwiki-sample not found under {common.DATA}; nothing to do", file=sys.stderr)
        return 0
    out = ROOT / (args.output_dir or ("out/from_scratch_tiny" if args.tiny else "out/from_scratch"))
    out.mkdir(parents=True, exist_ok=True)
    results_dir = args.results_dir or (out if (args.tiny or args.output_dir) else RESULTS_DIR)
    ledger = results_dir / f"{results_name}_ledger"
    argv_used = sys.argv[1:] if argv is None else argv
    meta = {"date": common.utc_now(), "preset": preset, "arms": arms, "protocol": args.protocol,
            "command": " ".join(["python benchmarks/from_scratch.py", *argv_used])}
    bm25 = None if args.tiny else lexical_reference(SCIFACT)
    write_report = (partial(report_from_mlm, results_dir, ledger, cfg, meta) if args.protocol == "from_mlm"
                    else partial(report, results_dir, ledger, cfg, meta, bm25))
    if args.report_only:
        print(write_report()["table_markdown"], flush=True)
        return 0
    data = common.make_quick_beir(out) if args.tiny else SCIFACT
    init = make_init(out, cfg)
    meta["init_weights"] = weights_digest(init)
    log(f"from scratch: preset {preset}, arms {arms}, init {common.ledger_path(init)} ({meta['init_weights']}), {cfg}")
    if args.probe:
        corpus = make_corpus(out, data, cfg["probe_articles"], "probe-corpus")
        result = probe(out, init, corpus, cfg, parse_groups(args.groups, arms))
        write_json(results_dir / "from_scratch_probe.json", result)
        print(json.dumps({a: r["seconds_per_step"] for a, r in result["arms"].items()}), flush=True)
        return 0
    corpus = make_corpus(out, data, cfg["enwiki_articles"])
    if args.prepare and args.protocol == "scratch":
        return 0
    if args.steps_from_probe:
        if not args.pretrain_seconds:
            raise SystemExit("--steps-from-probe needs --pretrain-seconds")
        steps, meta["steps_from"] = steps_from_probe(args.steps_from_probe, args.pretrain_seconds)
    else:
        steps = cfg["steps"]
        if not steps:
            raise SystemExit("the gpu preset needs --steps N or --steps-from-probe FILE --pretrain-seconds S "
                             "(benchmarks/device/README.md)")
    cfg["steps"] = meta["steps"] = steps
    if args.protocol == "from_mlm":  # every arm continues from the BERT: made first (--prepare: only that)
        init = make_bert(out, ledger, init, corpus, cfg, steps)
        meta["bert_weights"] = weights_digest(init)
        if args.prepare:
            return 0
    started, failed = time.perf_counter(), {}
    for spec in arms:
        arm, pretrain_seed, name = parse_arm(spec, cfg)
        try:
            run_arm(arm, out, ledger, data, init, corpus, {**cfg, "pretrain_seed": pretrain_seed}, steps,
                    meta["command"], name)
        except Exception as error:
            failed[name] = common.arm_failed(name, error)
    meta.update(wall_s=round(time.perf_counter() - started, 1), failed_arms=failed)
    payload = write_report()
    print(payload["table_markdown"] + ("\nFailed arms (rerun to continue): " + "; ".join(
        f"{a}: {e}" for a, e in failed.items()) if failed else ""), flush=True)
    log(f"results: {results_dir / results_name}.json and .md; {meta['wall_s']:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
