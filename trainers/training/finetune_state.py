"""A fine-tuning run's work folder: finished stages, their models, resuming."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer
from torch import nn
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..export.cards import FINETUNE_RUN_INFO_FILE, record_value, write_finetuned_card
from ..export.sentence_transformer import load_as_sentence_transformer
from ..inputs.finetune_options import (
    STAGES,
    FinetuneDataArguments,
    FinetuneLossArguments,
    FinetuneModelArguments,
    FinetuneTrainingArguments,
    is_pairs_file,
    model_prompts,
)
from ..inputs.folders import INTERRUPTED_HINT, hub_id_of_model, model_location, public_name
from ..inputs.io import read_json_or_empty, write_json_atomic
from ..inputs.outputs import Holding, atomic_folder
from ..inputs.sentence_models import save_without_pooler
from ..inputs.versions import library_versions, package_version
from ..methods import METHODS, hybrid_method_of
from ..retrieval.mteb import evaluate_folder
from .finetune_losses import similarity_functions
from .run_folder import RESUME_LAST

logger = logging.getLogger(__name__)

STATE_FILE = "finetune_state.json"  # in the work folder: the finished stages of a run, for resuming it
STAGE_MODEL = "model"  # in a stage's folder: the model that stage finished with


# options that decide nothing a stage trains: they may differ between a run and its resumption
MAY_CHANGE_ON_RESUME = frozenset({
    "overwrite", "resume_from_checkpoint", "logging_dir", "logging_steps", "logging_strategy", "disable_tqdm",
    "report_to", "save_steps", "save_strategy", "save_total_limit", "local_rank", "dataloader_num_workers",
    "eval_data", "eval_split", "eval_dataset_id", "model_name", "base_model_name", "mini_batch_size",
})


def finetune_run_settings(model_args, data_args, loss_args, training_args) -> dict[str, Any]:
    """The settings that decide what the stages train (not `MAY_CHANGE_ON_RESUME`), JSON-safe; an existing local
    path resolved, so that `./data` and `/abs/data` are one setting."""
    values = {**dataclasses.asdict(model_args), **dataclasses.asdict(data_args), **dataclasses.asdict(loss_args),
              **training_args.to_dict()}
    kept = {name: value for name, value in values.items() if name not in MAY_CHANGE_ON_RESUME}
    for name, value in kept.items():
        if name in {"output_dir", "work_dir"} and value:  # may not exist yet
            kept[name] = str(Path(value).expanduser().resolve())
        elif isinstance(value, str) and value:
            kept[name] = model_location(value)
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def _settings_key(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def check_earlier_progress_kept(work_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a run without --resume-from-checkpoint or --overwrite over a work folder that holds an earlier run's
    finished stages or stage checkpoints: starting over would delete them."""
    if resume or overwrite:
        return
    finished = len(read_json_or_empty(work_dir / STATE_FILE).get("stages") or [])
    checkpoints = list(work_dir.glob(f"stage-*/{PREFIX_CHECKPOINT_DIR}-*"))
    if not (finished or checkpoints):
        return
    stages = ", ".join(sorted({checkpoint.parent.name for checkpoint in checkpoints}))
    held = f"{finished} finished stage(s)" if finished else f"the checkpoints of {stages}"
    raise ValueError(f"{work_dir} holds {held} of an earlier run, which starting over would delete; continue it with "
                     "--resume-from-checkpoint last, or start over with --overwrite")


def read_state(work_dir: Path, settings: dict[str, Any], resume: bool,
                main_process: bool) -> tuple[dict[str, Any], bool]:
    """The run's state (`{"settings_key": ..., "settings": ..., "stages": [...], "negatives": ...}`) and whether it
    continues an earlier run: the work folder's when resuming a run with the same settings, else a fresh one (a
    resume that finds none is warned about), saved at once (the main process) so that a run killed in its first
    stage is resumed only with its own settings."""
    state = read_json_or_empty(work_dir / STATE_FILE)
    key = _settings_key(settings)
    if resume and state:
        if state.get("settings_key") != key:
            raise _other_settings_error(work_dir, state, settings)
        return state, True
    if resume:
        # warned, not refused as by pretrain: finetune's line after any Ctrl-C (before this state too) says `last`
        logger.warning("--resume-from-checkpoint last: nothing to resume in %s (no earlier run with this --output-dir "
                       "or --work-dir); starting from the first stage: if a run was to be continued, stop this one "
                       "and check --output-dir", work_dir)
    elif state.get("stages"):
        logger.warning("%s holds %d finished stage(s) of an earlier run; starting over (--overwrite)", work_dir,
                       len(state["stages"]))
    fresh = {"settings_key": key, "settings": settings, "stages": [], "negatives": None, "evaluated": None}
    if main_process:  # before a stage folder of an earlier run is cleared
        write_json_atomic(work_dir / STATE_FILE, fresh)
    return fresh, False


def _other_settings_error(work_dir: Path, state: dict[str, Any], settings: dict[str, Any]) -> ValueError:
    """The refusal of `--resume-from-checkpoint` for a run recorded with other settings, naming up to three."""
    recorded = state.get("settings") or {}
    changed = sorted(name for name in recorded.keys() | settings.keys() if recorded.get(name) != settings.get(name))
    shown = ", ".join(f"--{name.replace('_', '-')} {recorded.get(name)!r} -> {settings.get(name)!r}"
                      for name in changed[:3]) + (", ..." if len(changed) > 3 else "")
    return ValueError(
        f"--resume-from-checkpoint: the run in {work_dir} used other settings "
        f"({shown or 'not recorded by the older retromae that ran it'}); give the same options as that run "
        "(output, logging and evaluation options may change), or start over in another --output-dir "
        "(--overwrite instead of the flag starts this one over and clears its stages)"
    )


def finish_stage(state: dict[str, Any], work_dir: Path, model: SentenceTransformer, record: dict[str, Any],
                  main_process: bool) -> None:
    """Add the stage's record to `state` and save it with the stage's model in the work folder (the main process),
    so that a resumed run starts after this stage; then the stage's Trainer checkpoints, which no resume reads any
    more (hundreds of MB each, optimizer included), are deleted."""
    state["stages"].append(record)
    if main_process:
        stage_dir = work_dir / f"stage-{record['stage']}"
        with atomic_folder(stage_dir / STAGE_MODEL, overwrite=True) as build_dir:
            save_model_folder(model, build_dir)
        write_json_atomic(work_dir / STATE_FILE, state)
        for checkpoint in stage_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
            shutil.rmtree(checkpoint, ignore_errors=True)


def model_after_finished_stages(model: SentenceTransformer, stages: list[str], state: dict[str, Any],
                                 work_dir: Path) -> SentenceTransformer:
    """The model the last finished stage saved (`model` when none finished); refuses finished stages that do not
    begin `stages`."""
    finished = [record["stage"] for record in state["stages"]]
    if not finished:
        return model
    if finished != stages[: len(finished)]:
        raise ValueError(f"--resume-from-checkpoint: {work_dir} finished the stages {finished}, which do not "
                         f"begin --stages {','.join(stages)}")
    logger.info("resuming after the finished stage(s) %s", ", ".join(finished))
    return load_as_sentence_transformer(work_dir / f"stage-{finished[-1]}" / STAGE_MODEL, work_dir=work_dir)[0]


def work_dir_of(training_args: FinetuneTrainingArguments) -> Path:
    """--work-dir, by default OUTPUT_DIR.work beside the output folder."""
    output_dir = Path(training_args.output_dir)
    return Path(training_args.work_dir or output_dir.parent / f"{output_dir.name}.work")


def finished_work_dir_run(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                          loss_args: FinetuneLossArguments, training_args: FinetuneTrainingArguments,
                          stages: list[str]) -> FinetuneResult | None:
    """The result of this very run when `--resume-from-checkpoint last` finds it finished: its work folder records
    every stage under the same settings and its output folder holds the model those stages wrote. None otherwise
    (the output folder is then judged as any other, `claim_output`).

    Raises:
        ValueError: the work folder records a run with other settings (`read_state`'s refusal, before the output
            folder's, whose --overwrite would discard a finished model).
    """
    if training_args.resume_from_checkpoint not in RESUME_LAST:
        return None
    work_dir = work_dir_of(training_args)
    state = read_json_or_empty(work_dir / STATE_FILE)
    settings = finetune_run_settings(model_args, data_args, loss_args, training_args)
    if state and state.get("settings_key") != _settings_key(settings):  # finished or not: name what changed
        raise _other_settings_error(work_dir, state, settings)
    output_dir = Path(training_args.output_dir)
    info = read_json_or_empty(output_dir / FINETUNE_RUN_INFO_FILE)
    done = [record.get("stage") for record in state.get("stages") or []]
    if done != stages or [record.get("stage") for record in info.get("stages") or []] != stages:
        return None
    return FinetuneResult(output_dir, info, already_finished=True)


def evaluation_record(data_args: FinetuneDataArguments) -> dict[str, str] | None:
    """How the work folder's state records the run's --eval-data evaluation as done (None without --eval-data)."""
    if not data_args.eval_data:
        return None
    return {"eval_data": model_location(data_args.eval_data), "eval_split": data_args.eval_split}


def evaluation_missing(work_dir: Path, data_args: FinetuneDataArguments, info: dict[str, Any]) -> bool:
    """Whether a finished run still owes the --eval-data evaluation asked for now: its state does not record that
    one as done (the run was stopped during it, or asked for another). A state written before evaluations were
    recorded counts as evaluated when the card holds results."""
    wanted = evaluation_record(data_args)
    if wanted is None:
        return False
    state = read_json_or_empty(work_dir / STATE_FILE)
    if "evaluated" not in state:
        return not info.get("eval_results")
    return state["evaluated"] != wanted


def record_evaluation(work_dir: Path, data_args: FinetuneDataArguments) -> None:
    """Record in the work folder's state that the --eval-data evaluation is done (its results are in the card)."""
    state = read_json_or_empty(work_dir / STATE_FILE)
    state["evaluated"] = evaluation_record(data_args)
    write_json_atomic(work_dir / STATE_FILE, state)


@contextlib.contextmanager
def _interrupted_hint(hint: Callable[[], str]) -> Iterator[None]:
    """What `cli.main` says after a Ctrl-C or SIGTERM inside the block; any other end of the block drops it."""
    token = INTERRUPTED_HINT.set(hint)
    try:
        yield
    except KeyboardInterrupt:  # cli.main reads the hint after this
        raise
    except BaseException:
        INTERRUPTED_HINT.reset(token)
        raise
    INTERRUPTED_HINT.reset(token)


def evaluate_written_model(output_dir: Path, data_args: FinetuneDataArguments, work_dir: Path) -> dict[str, Any]:
    """Evaluate the written model on --eval-data into its card and run record, and record in the work folder that
    it was (a resume of a run stopped during it runs it then); the updated run record."""
    hint = (f"interrupted during the --eval-data evaluation; the fine-tuned model in {output_dir} is complete: to "
            "evaluate it, run the same command again with --resume-from-checkpoint last")
    try:
        with _interrupted_hint(lambda: hint):
            evaluate_folder(output_dir, beir_folders=[data_args.eval_data], split=data_args.eval_split,
                            output_dir=work_dir / "eval", update_card=True, on_missing=data_args.on_missing,
                            dataset_ids=[data_args.eval_dataset_id] if data_args.eval_dataset_id else None,
                            overwrite=True)  # the run's own folder
    except ValueError as error:
        raise ValueError(f"{error}; the fine-tuned model is written to {output_dir}: evaluate it with "
                         "`retromae evaluate` once that is fixed") from None
    record_evaluation(work_dir, data_args)
    return read_json_or_empty(output_dir / FINETUNE_RUN_INFO_FILE)


def work_dir_holding(work_dir: Path) -> Holding:
    """`claim_output`'s owner of a work folder: files no fine-tuning run made are kept (a run writes and clears its
    stage folders and negatives there). A run's own folder holds `STATE_FILE` (written when it starts); before that,
    only the export of a pre-training checkpoint and temporary siblings."""
    ours = {"pretrained-encoder"}
    if (work_dir / STATE_FILE).is_file():
        ours |= {STATE_FILE, NEGATIVES_FILE, "eval", *(f"stage-{stage}" for stage in STAGES)}
    foreign = sorted(p.name for p in work_dir.iterdir() if p.name not in ours and not p.name.startswith("."))
    if not foreign:
        return None
    return f"files no `retromae finetune` run made ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''})", True


NEGATIVES_FILE = "hard_negatives.jsonl"


@dataclass
class FinetuneResult:
    output_dir: Path
    info: dict[str, Any]
    already_finished: bool = False  # resumed after its end: nothing was trained
    evaluated_now: bool = False  # with already_finished: the --eval-data evaluation it had left was run (card updated)


def save_model_folder(model: SentenceTransformer, folder: Path) -> None:
    """The sentence-transformers files of `model` (a hybrid model with its module's remote code), without a card."""
    hybrid = hybrid_method_of(model)
    if hybrid is not None:
        hybrid.pooling_module.save(model, folder, create_model_card=False)
    else:
        model.save(str(folder), create_model_card=False)
        save_without_pooler(model, folder)


def loss_config_of(loss: nn.Module) -> dict[str, Any]:
    config = loss.get_config_dict() if hasattr(loss, "get_config_dict") else {}
    return {k: (v if isinstance(v, int | float | str | bool | dict | type(None)) else str(v)) for k, v in config.items()}


def finetune_run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
              stage_records, output_dir: Path) -> dict[str, Any]:

    # a local starting folder is recorded by its own Hub id when it names one, never by its path
    base = model_args.base_model_name or hub_id_of_model(model_args.model)
    train_name = beir.name if beir is not None else public_name(data_args.train_data) or "training data"
    hyper = {
        "learning_rate": training_args.learning_rate,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "world_size": training_args.world_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "num_train_epochs": training_args.num_train_epochs,
        "max_steps": training_args.max_steps,
        "warmup_steps": training_args.warmup_steps,
        "weight_decay": training_args.weight_decay,
        "lr_scheduler_type": str(record_value(training_args.lr_scheduler_type)),
        "batch_sampler": str(record_value(training_args.batch_sampler)),
        "seed": training_args.seed,
        "max_seq_length": model.max_seq_length,
        "num_negatives": data_args.num_negatives,
        "scale": loss_args.scale or similarity_functions(model)[2],
        "gather_across_devices": loss_args.gather_across_devices,
    }
    if loss_args.mini_batch_size is not None:
        hyper["mini_batch_size"] = loss_args.mini_batch_size
    prompts = model_prompts(training_args.prompts)
    if prompts:
        hyper.update({f"{name}_prompt": text for name, text in prompts.items() if text})
    if "distill" in [r["stage"] for r in stage_records]:
        hyper.update(distill_loss_weight=loss_args.distill_loss_weight, contrastive_loss_weight=loss_args.contrastive_loss_weight,
                     distill_temperature=loss_args.distill_temperature)
    return {
        "model_name": model_args.model_name or output_dir.name,
        "base_model": base,
        "starting_point": model_info["kind"],
        "pretraining_method": model_info.get("pretraining_method"),
        "pooling": _pooling_description(model),
        "similarity": model.similarity_fn_name,
        "embedding_dim": model.get_embedding_dimension(),
        "max_seq_length": model.max_seq_length,
        "trust_remote_code": bool(model_info.get("trust_remote_code") or hybrid_method_of(model) is not None),
        "train_data": {"name": train_name,
                       "split": None if is_pairs_file(data_args.train_data) else data_args.split,  # a file has none
                       "queries": len(groups), "format": "beir" if beir is not None else "pairs", "dropped": dropped},
        "stages": stage_records,
        "hyperparameters": hyper,
        "eval_results": [],
        "retromae_version": package_version(),
        "library_versions": library_versions(),
    }


def save_finetuned_model(model: SentenceTransformer, output_dir: str | os.PathLike, info: dict[str, Any],
                         overwrite: bool = False) -> Path:
    """Write `model` + its card + the run record to `output_dir`, atomically (temporary sibling, then rename)."""
    output_dir = Path(output_dir)
    with atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        save_model_folder(model, build_dir)
        write_finetuned_card(build_dir, info, METHODS)
    logger.info("fine-tuned model written to %s", output_dir)
    return output_dir


def _pooling_description(model: SentenceTransformer) -> str:
    hybrid = hybrid_method_of(model)
    if hybrid is not None:  # the method's own module
        return hybrid.pooling_module.describe(model)
    for module in model.modules():
        name = type(module).__name__
        if name == "Pooling":
            config = module.get_config_dict()
            mode = config.get("pooling_mode")
            if mode is None:  # legacy keys
                mode = next((k[len("pooling_mode_"):].removesuffix("_token").removesuffix("_tokens")
                             for k, v in config.items() if k.startswith("pooling_mode_") and v), "unknown")
            return str(mode)
    return "unknown"
