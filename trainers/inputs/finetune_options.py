"""`retromae finetune`'s options and the stages they name."""

from __future__ import annotations

import logging
import math
import os
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Union

from sentence_transformers import SentenceTransformerTrainingArguments

from ..data.training_groups import TrainingGroup
from .errors import UserError
from .parameters import check_number, type_kinds

logger = logging.getLogger(__name__)

STAGES = ("in-batch", "hard-negatives", "distill")
NEGATIVE_STAGES = ("hard-negatives", "distill")  # the stages after in-batch: negatives from a file, the data or mining
MINING_OPTIONS = ("corpus", "mine_range_min", "mine_range_max", "mine_sampling")
NEGATIVE_OPTIONS = ("negatives_file", "num_negatives", *MINING_OPTIONS)  # read by NEGATIVE_STAGES only
DISTILL_OPTIONS = ("distill_loss_weight", "contrastive_loss_weight", "distill_temperature")  # read by distill only
PAIRS_FILE_SUFFIXES = (".jsonl", ".json")  # a training file of (query, positive, negatives): no split, no qrels
MODEL_PROMPTS = ("query", "document")  # the names --prompts takes: those the saved model's `prompts` holds


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
    eval_dataset_id: str | None = field(
        default=None, metadata={"help": "Hub dataset id of --eval-data (owner/name), which the card's model-index "
                                "names, as `retromae evaluate --dataset-ids` (default: the results are in the card's "
                                "table only)"}
    )


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
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "`last`: continue this run's stages from its work folder (finished stages "
                                "kept, the interrupted one from its newest checkpoint, a missing --eval-data "
                                "evaluation run); a checkpoint path is refused"}
    )
    prompts: Union[str, None, dict[str, str], dict[str, dict[str, str]]] = field(  # noqa: UP007 (sentence-transformers' type: HfArgumentParser reads a Union with None second)
        default=None,
        metadata={"help": 'text put before every query and document, or JSON {"query": "query: ", "document": '
                  '"passage: "}: trained with (the query column; positive and negative columns), saved as the '
                  "model's prompts (config_sentence_transformers.json) and used by mining and --eval-data"},
    )
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
    if "eval_dataset_id" in given and not data_args.eval_data:
        raise UserError("--eval-dataset-id names the Hub dataset of --eval-data: pass --eval-data FOLDER, or drop "
                        "--eval-dataset-id")
    distill = [name for name in given if FinetuneLossArguments.legacy_keys.get(name, name) in DISTILL_OPTIONS]
    if distill and "distill" not in stages:
        raise UserError(f"{_flag(sorted(distill)[0])} is read by the distill stage only: add distill to --stages (with "
                        "--teacher-scores), or drop the flag")
    if is_pairs_file(data_args.train_data):
        if "split" in given:
            raise UserError(f"--split is read for a BEIR folder's qrels or a dataset's splits only; --train-data "
                            f"{Path(data_args.train_data).name} is a file of (query, positive, negatives) without "
                            "splits: drop the flag")
        if "on_missing" in given and not data_args.eval_data and "distill" not in stages:
            raise UserError("--on-missing is read for a BEIR folder's qrels, --eval-data and the distill stage's "
                            f"teacher scores only, and this run has none (--train-data "
                            f"{Path(data_args.train_data).name} is a file of pairs): drop the flag")


def is_pairs_file(train_data: str) -> bool:
    """Whether --train-data names a file of (query, positive, negatives) lines, which has no split."""
    return Path(train_data).suffix.lower() in PAIRS_FILE_SUFFIXES and not Path(train_data).is_dir()


def model_prompts(prompts: str | Mapping[str, Any] | None) -> dict[str, str] | None:
    """The model's `prompts` (`{"query": ..., "document": ...}`) that `--prompts` gives: one text for both, or a
    mapping with those two keys (either may be left out: no prompt). None without `--prompts`.

    Raises:
        UserError: another key (sentence-transformers' column or dataset names: the stages name their columns
            themselves), or a value that is not a str.
    """
    if prompts is None:
        return None
    if isinstance(prompts, str):
        return dict.fromkeys(MODEL_PROMPTS, prompts)
    if not isinstance(prompts, Mapping):
        raise UserError(f"--prompts {prompts!r}: give a text, or JSON {{\"query\": ..., \"document\": ...}}")
    other = sorted(str(key) for key in prompts if key not in MODEL_PROMPTS)
    if other:
        raise UserError(f"--prompts names {', '.join(map(repr, other))}; it takes 'query' and 'document' (the model's "
                        "prompts: the query column and the positive and negative columns of every stage)")
    wrong = [key for key, value in prompts.items() if not isinstance(value, str)]
    if wrong:
        raise UserError(f"--prompts {wrong[0]!r}: {prompts[wrong[0]]!r} is not a text; give a string")
    return {name: prompts.get(name, "") for name in MODEL_PROMPTS}


def stage_prompts(prompts: Mapping[str, str] | None, columns: Sequence[str]) -> dict[str, str] | None:
    """sentence-transformers' column -> prompt mapping for a stage's columns: the query prompt for `query`, the
    document prompt for the positive and negative columns (a `label` column holds scores)."""
    if not prompts:
        return None
    mapping = {column: prompts["query" if column == "query" else "document"] for column in columns if column != "label"}
    return {column: text for column, text in mapping.items() if text} or None


def check_full_batches(stage: str, examples: int, batch_size: int, world_size: int, drop_last: bool) -> None:
    """Refuse a stage whose dataloader gives a process no batch (0 optimisation steps: the starting weights would
    be written as the result). Incomplete batches are dropped under DDP (all_gather needs equal batches) or with
    --dataloader-drop-last, and DDP deals whole batches to the processes in turn."""
    batches = examples // batch_size if drop_last else math.ceil(examples / batch_size)
    if (batches // world_size if drop_last else batches) >= 1:
        return
    largest = examples // world_size
    fix = (f"lower --per-device-train-batch-size to {largest} or less, or give more training data" if largest >= 1
           else "give more training data")
    if world_size > 1:
        raise UserError(f"stage {stage}: {examples} training examples over {world_size} processes leave no full batch "
                        f"of {batch_size} per process (DDP drops incomplete batches): {fix}")
    raise UserError(f"stage {stage}: {examples} training examples leave no full batch of {batch_size} "
                    f"(--dataloader-drop-last drops incomplete batches): {fix}, or drop --dataloader-drop-last")


def check_option_types(where: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (Python keyword arguments) with a path-like text option as a str, after refusing a value of the
    wrong type for a field of the model, data and loss options: a number, a text, one of a `Literal`'s choices
    (`TrainingArguments` fields are checked by `training_checks.check_training_arguments`, bools by
    `parameters.check_bool_options`).

    Raises:
        TypeError: a value of another type, naming the parameter and the type to pass.
        ValueError: a text that is none of a `Literal` field's choices.
    """
    checked = dict(values)
    for options_class in ARGUMENT_CLASSES[:3]:
        for name, hint in typing.get_type_hints(options_class).items():
            if name not in values:
                continue
            value = values[name]
            kinds = type_kinds(hint)
            optional = type(None) in kinds
            if (value is None and optional) or bool in kinds:
                continue
            choices = next((typing.get_args(kind) for kind in kinds if typing.get_origin(kind) is Literal), None)
            if int in kinds or float in kinds:
                check_number(where, name, value, integer=float not in kinds, optional=optional)
            elif choices is not None and value not in choices:
                if not isinstance(value, str):
                    raise TypeError(f"{where}: {name}={value!r} is not a str; give one of {', '.join(choices)}")
                raise ValueError(f"{where}: {name}={value!r}; give one of {', '.join(choices)}")
            elif str in kinds:
                if not isinstance(value, str | os.PathLike):
                    raise TypeError(f"{where}: {name}={value!r} ({type(value).__name__}) is not a str; give a str or "
                                    f"os.PathLike{' (or None)' if optional else ''}")
                checked[name] = os.fspath(value)
    return checked


def check_pool_holds_negatives(pool_size: int, data_args: FinetuneDataArguments) -> None:
    """Refuse mining that cannot give any query `--num-negatives` negatives: the ranks it takes them from,
    [`--mine-range-min`, `--mine-range-max`), stop at the pool's size."""
    available = min(data_args.mine_range_max, pool_size) - data_args.mine_range_min
    if available < data_args.num_negatives:
        raise ValueError(
            f"mining ranks the {pool_size} documents of the corpus and takes negatives from ranks "
            f"[{data_args.mine_range_min}, {min(data_args.mine_range_max, pool_size)}): at most {max(available, 0)} "
            f"per query, fewer than --num-negatives {data_args.num_negatives}; lower --num-negatives or "
            "--mine-range-min, or give a larger --corpus"
        )


def check_positives_scored(groups: list[TrainingGroup], teacher_scores: dict[str, dict[str, float]],
                            data_args: FinetuneDataArguments) -> None:
    """Refuse teacher scores that miss every positive of a query (the distill stage needs the positive's score as
    much as its mined negatives'): any query with `--on-missing error`, all of them otherwise."""
    unscored = [g for g in groups if not any(doc_id in teacher_scores.get(g.query_id, {}) for doc_id, _ in g.positives)]
    if not unscored or (data_args.on_missing != "error" and len(unscored) < len(groups)):
        return
    example = unscored[0]
    fix = ("score them, or pass --on-missing skip to drop those queries" if len(unscored) < len(groups)
           else "check that its query and document ids are those of --train-data")
    raise ValueError(f"--teacher-scores {data_args.teacher_scores} scores no positive of {len(unscored)} of the "
                     f"{len(groups)} training queries (e.g. query {example.query_id!r}, document "
                     f"{example.positives[0][0]!r}); {fix}")


def negatives_unread_dropped(groups: list[TrainingGroup], stages: Sequence[str],
                             train_data: str) -> list[TrainingGroup]:
    """`groups` without their negatives, said in one warning, when no stage of the run reads them (in-batch alone):
    unsaid, the user would think them trained on (and cleaning them would count drops as if they were used)."""
    given = sum(1 for group in groups if group.negatives)
    if not given or set(NEGATIVE_STAGES) & set(stages):
        return groups
    logger.warning("--train-data %s gives negatives (%d of its %d examples), which the in-batch stage does not use "
                   "(it trains on the other queries' positives): to train on them, add the hard-negatives stage "
                   "(--stages in-batch,hard-negatives, or hard-negatives)", train_data, given, len(groups))
    return [replace(group, negatives=[]) for group in groups]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


ARGUMENT_CLASSES = (FinetuneModelArguments, FinetuneDataArguments, FinetuneLossArguments, FinetuneTrainingArguments)
__all__ = ["NEGATIVE_OPTIONS", "STAGES", "check_full_batches", "check_mining_range", "check_option_types",
           "check_options_read", "check_pool_holds_negatives", "check_positives_scored", "check_trainer_options",
           "is_pairs_file", "model_prompts", "negatives_unread_dropped", "stage_prompts"]
