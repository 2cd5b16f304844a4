"""`retromae finetune`'s options and the stages they name."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

from sentence_transformers import SentenceTransformerTrainingArguments

from .errors import UserError

STAGES = ("in-batch", "hard-negatives", "distill")
NEGATIVE_STAGES = ("hard-negatives", "distill")  # the stages after in-batch: negatives from a file, the data or mining
MINING_OPTIONS = ("corpus", "mine_range_min", "mine_range_max", "mine_sampling")
NEGATIVE_OPTIONS = ("negatives_file", "num_negatives", *MINING_OPTIONS)  # read by NEGATIVE_STAGES only


@dataclass
class FinetuneModelArguments:
    model: str = field(
        metadata={"help": "starting point: a `retromae pretrain` checkpoint, a `retromae export` folder, any "
                  "sentence-transformers folder (e.g. the DupMAE hybrid export), or a plain BERT folder"}
    )
    pooling: Literal["cls", "mean"] | None = field(
        default=None,
        metadata={"help": "pooling for a folder WITHOUT modules.json, a pre-training checkpoint included: cls + dot "
                  "product (default, the papers' BEIR protocol) or mean + cosine (the head of bases such as "
                  "all-MiniLM-L6-v2); sentence-transformers folders keep their own"},
    )
    max_seq_length: int | None = field(default=None, metadata={"help": "maximum tokens per text (default: the model's)"})
    model_name: str | None = field(
        default=None, metadata={"help": "model name for the card, e.g. my-org/retromae-scifact (default: folder name)"}
    )
    base_model_name: str | None = field(
        default=None, metadata={"help": "Hub id of the starting model for the card (default: guessed, no local paths)"}
    )


@dataclass
class FinetuneDataArguments:
    train_data: str = field(
        metadata={"help": "training data: a BEIR folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv), a .jsonl file "
                  "of {query, positive, negatives}, a datasets save_to_disk folder or a Hub dataset name"}
    )
    split: str = field(default="train", metadata={"help": "qrels / dataset split to train on"})
    corpus: str | None = field(
        default=None,
        metadata={"help": "corpus.jsonl to mine negatives from when --train-data is not a BEIR folder (default: all "
                  "positives and negatives of the training data)"},
    )
    on_missing: Literal["skip", "error"] = field(
        default="error",
        metadata={"help": "qrels naming unknown queries/documents, or pairs without teacher scores: refuse (error) "
                  "or drop them with a count (skip)"},
    )
    stages: str = field(
        default="in-batch,hard-negatives",
        metadata={"help": f"comma-separated stages in order, from {', '.join(STAGES)}; distill needs --teacher-scores"},
    )
    num_negatives: int = field(default=7, metadata={"help": "hard negatives per query (RetroMAE: group of 8 = 1+7)"})
    negatives_file: str | None = field(
        default=None,
        metadata={"help": "reuse mined negatives (a hard_negatives.jsonl written by an earlier run) instead of mining"},
    )
    mine_range_min: int = field(default=10, metadata={"help": "mining: skip the top N ranks (likely unlabelled positives)"})
    mine_range_max: int = field(default=100, metadata={"help": "mining: sample negatives from ranks up to N"})
    mine_sampling: Literal["random", "top"] = field(
        default="random", metadata={"help": "mining: draw negatives at random from the rank range, or take the top"}
    )
    teacher_scores: str | None = field(
        default=None, metadata={"help": "cross-encoder scores for distill: TSV query-id, corpus-id, score"}
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "a BEIR folder to evaluate the result on (results go into the model card)"}
    )
    eval_split: str = field(default="dev", metadata={"help": "qrels split of --eval-data"})


@dataclass
class FinetuneLossArguments:
    # old option name -> new, as a config's `legacy_keys`: every loss weight is `<term>_loss_weight`
    legacy_keys = {"distill_weight": "distill_loss_weight", "contrastive_weight": "contrastive_loss_weight"}

    scale: float | None = field(
        default=None,
        metadata={"help": "contrastive logit scale = 1/temperature (default: 1 for dot-product models, 20 for cosine)"},
    )
    distill_loss_weight: float = field(default=1.0, metadata={"help": "weight of the KL (batchmean) distillation loss"})
    contrastive_loss_weight: float = field(
        default=0.0,
        metadata={"help": "weight of the in-batch contrastive loss added in the distill stage (RetroMAE code: 1e-4)"},
    )
    distill_temperature: float = field(default=1.0, metadata={"help": "temperature of student and teacher softmax"})
    gather_across_devices: bool = field(
        default=True, metadata={"help": "DDP: in-batch negatives from all ranks (global batch); no effect on 1 process"}
    )
    mini_batch_size: int | None = field(
        default=None,
        metadata={"help": "GradCache (CachedMultipleNegativesRankingLoss) in the in-batch and hard-negatives stages: "
                  "embed each column of a batch N texts at a time, so a --per-device-train-batch-size too large "
                  "for memory trains with all its in-batch negatives; the same loss, one more forward per text"},
    )

    def __post_init__(self):
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise UserError(f"--mini-batch-size {self.mini_batch_size}: give a positive number of texts")
        if self.scale is not None and not self.scale > 0:
            raise UserError(f"--scale {self.scale}: give a logit scale > 0 (1/temperature), or leave it unset")
        if not self.distill_temperature > 0:
            raise UserError(f"--distill-temperature {self.distill_temperature}: give a temperature > 0")
        if not self.distill_loss_weight > 0:
            raise UserError(f"--distill-loss-weight {self.distill_loss_weight}: give a weight > 0")
        if self.contrastive_loss_weight < 0:
            raise UserError(f"--contrastive-loss-weight {self.contrastive_loss_weight}: give a weight >= 0")


@dataclass
class FinetuneTrainingArguments(SentenceTransformerTrainingArguments):
    """sentence-transformers' training arguments with fine-tuning defaults; `output_dir` is the final model folder."""

    output_dir: str | None = field(
        default="out/retromae-finetuned", metadata={"help": "the sentence-transformers folder to write"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    work_dir: str | None = field(
        default=None, metadata={"help": "trainer checkpoints and mined negatives (default: OUTPUT_DIR.work)"}
    )
    learning_rate: float = field(default=2e-5, metadata={"help": "peak learning rate (RetroMAE MS MARCO: 2e-5)"})
    num_train_epochs: float = field(default=1.0, metadata={"help": "epochs per stage"})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "queries per device per step"})
    warmup_steps: float = field(default=0.1, metadata={"help": "warm-up steps, or a fraction of the stage if < 1"})
    logging_steps: float = field(default=10, metadata={"help": "log the loss every N steps"})
    save_strategy: str = field(default="no", metadata={"help": "trainer checkpoints: no, steps or epoch"})
    batch_sampler: str = field(
        default="no_duplicates", metadata={"help": "batch sampler (no_duplicates: no repeated text in a batch)"}
    )


def check_mining_range(num_negatives: int, range_min: int, range_max: int) -> None:
    """Refuse a rank range `[range_min, range_max)` that cannot hold `num_negatives` (>= 1) negatives."""
    if num_negatives < 1:
        raise UserError(f"--num-negatives must be >= 1 to mine hard negatives, got {num_negatives}")
    if range_min < 0:
        raise UserError(f"--mine-range-min {range_min}: give the number of top ranks to skip, >= 0")
    if range_max - range_min < num_negatives:
        raise UserError(f"the rank range [{range_min}, {range_max}) (--mine-range-min, --mine-range-max) holds "
                            f"fewer than --num-negatives {num_negatives} candidates")


def parse_stages(text: str, teacher_scores: str | None) -> list[str]:
    stages = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise UserError(f"--stages {text!r}: unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    if len(set(stages)) != len(stages) or stages != sorted(stages, key=STAGES.index):
        raise UserError(f"--stages {text!r}: each stage at most once, in the order {', '.join(STAGES)}")
    if "distill" in stages and not teacher_scores:
        raise UserError("the distill stage needs cross-encoder scores: pass --teacher-scores FILE.tsv")
    return stages


def check_trainer_options(training_args: FinetuneTrainingArguments) -> None:
    """Refuse, before anything is read, the options sentence-transformers' TrainingArguments accept that our stages
    cannot honour: `--fsdp` / `--deepspeed` (mining between stages, the resume record and the final save assume
    whole weights in every process; no sharded fine-tuning has been run or tested), `--neftune-noise-alpha` (it
    needs a language model's input embeddings) and evaluation during training (`--eval-data` is scored after it)."""
    given = [flag for flag, value in (("--fsdp", training_args.fsdp), ("--deepspeed", training_args.deepspeed)) if value]
    if given:
        raise UserError(f"{' and '.join(given)}: retromae finetune does not shard the model (untested with its "
                        "stages, mining and saves); for several GPUs run it under DDP: torchrun --nproc_per_node N "
                        "-m retromae.trainers.cli finetune ...")
    if training_args.neftune_noise_alpha is not None:
        raise UserError(f"--neftune-noise-alpha {training_args.neftune_noise_alpha}: NEFTune adds noise to a "
                        "language model's input embeddings; retromae finetune trains a sentence encoder and does not "
                        "support it; drop the flag")
    strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)  # an IntervalStrategy
    if strategy != "no":
        raise UserError(f"--eval-strategy {strategy}: retromae finetune evaluates once, after training, on "
                        "--eval-data (a BEIR folder); drop --eval-strategy")


def check_options_read(given: Collection[str], data_args: FinetuneDataArguments) -> None:
    """Refuse a given option (a flag or a --config setting, not a default) that no stage of the run reads: it would
    be accepted and silently ignored."""
    stages = parse_stages(data_args.stages, data_args.teacher_scores)
    unread = [name for name in NEGATIVE_OPTIONS if name in given]
    if unread and not set(NEGATIVE_STAGES) & set(stages):
        raise UserError(f"{_flag(unread[0])} is read by the hard-negatives and distill stages only (they use "
                        "negatives): add one of them to --stages, or drop the flag")
    replaced = [name for name in MINING_OPTIONS if name in given]
    if replaced and data_args.negatives_file:  # the file's negatives are used as they are: nothing is mined
        flag = _flag(replaced[0])
        raise UserError(f"{flag} configures mining, which --negatives-file replaces: drop {flag} or --negatives-file")
    if "eval_split" in given and not data_args.eval_data:
        raise UserError("--eval-split names a qrels split of --eval-data: pass --eval-data FOLDER, or drop --eval-split")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


ARGUMENT_CLASSES = (FinetuneModelArguments, FinetuneDataArguments, FinetuneLossArguments, FinetuneTrainingArguments)
__all__ = ["NEGATIVE_OPTIONS", "STAGES", "check_mining_range", "check_options_read", "check_trainer_options"]
