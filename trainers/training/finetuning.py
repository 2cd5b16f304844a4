"""Fine-tuning a retrieval bi-encoder in stages (in-batch, hard negatives, distillation), resumable stage by stage."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset
from retromae.modeling.configuration_retromae import rename_legacy_keys
from sentence_transformers import SentenceTransformer
from sentence_transformers.util import (
    fullname,
)
from torch import nn
from transformers import set_seed

from ..data.training_groups import (
    TrainingGroup,
    clean_groups,
    groups_to_dataset,
    groups_to_distillation_dataset,
    load_training_groups,
    negatives_by_query,
    read_training_jsonl,
)
from ..export.publishing import check_model_name
from ..export.sentence_transformer import load_as_sentence_transformer
from ..inputs.finetune_options import (
    ARGUMENT_CLASSES,
    FinetuneDataArguments,
    FinetuneLossArguments,
    FinetuneModelArguments,
    FinetuneTrainingArguments,
    check_full_batches,
    check_mining_range,
    check_option_types,
    check_options_read,
    check_pool_holds_negatives,
    check_positives_scored,
    check_trainer_options,
    model_prompts,
    negatives_unread_dropped,
    parse_stages,
    stage_prompts,
)
from ..inputs.folders import check_dataset_ids, is_hub_id
from ..inputs.io import write_json_atomic
from ..inputs.outputs import claim_output, model_holding
from ..inputs.parameters import check_bool_options, check_path, list_parameter
from ..inputs.sentence_models import save_without_pooler
from ..inputs.training_checks import check_training_arguments
from ..methods import hybrid_method_of
from ..retrieval.beir import (
    RetrievalData,
    content_id,
    doc_text,
    drop_blank_queries,
    read_beir,
    read_beir_corpus,
    read_teacher_scores,
)
from ..retrieval.mining import mine_negatives
from .divergence import divergence
from .finetune_losses import DistillationLoss, contrastive_loss
from .finetune_state import (
    NEGATIVES_FILE,
    STATE_FILE,
    FinetuneResult,
    check_earlier_progress_kept,
    evaluate_written_model,
    evaluation_missing,
    finetune_run_info,
    finetune_run_settings,
    finish_stage,
    finished_work_dir_run,
    loss_config_of,
    model_after_finished_stages,
    read_state,
    save_finetuned_model,
    work_dir_holding,
    work_dir_of,
)
from .lock import folder_lock
from .processes import check_processes_agree
from .run_folder import RESUME_LAST, clean_killed_saves, last_complete_checkpoint
from .stage_trainer import StageTrainer

logger = logging.getLogger(__name__)


def _corpus_pool(data_args: FinetuneDataArguments, beir: RetrievalData | None,
                 groups: list[TrainingGroup]) -> dict[str, str]:
    if data_args.corpus:
        corpus_file = Path(data_args.corpus)
        if not corpus_file.is_file():
            raise ValueError(f"--corpus {data_args.corpus} does not exist")
        return {doc_id: doc_text(d["title"], d["text"]) for doc_id, d in read_beir_corpus(corpus_file).items()}
    if beir is not None:
        return {doc_id: beir.doc_text(doc_id) for doc_id in beir.corpus}
    pool: dict[str, str] = {}
    for group in groups:
        pool.update(group.positives)
        pool.update(group.negatives)
    return pool


def _negatives_from_file(path: str, groups: list[TrainingGroup],
                         corpus: Mapping[str, Any] | None = None) -> list[TrainingGroup]:
    """`groups` with the negatives that `path` lists for their queries; what does not match the training data (query
    ids, or negative ids absent from `corpus` when given) is warned about, no match at all refused. A query's
    negatives are merged over all its lines."""
    mined = negatives_by_query(read_training_jsonl(path))
    result = [TrainingGroup(g.query_id, g.query, g.positives, mined.get(g.query_id, [])) for g in groups]
    found = sum(1 for g in result if g.negatives)
    if not found:
        raise ValueError(
            f"--negatives-file {Path(path).name} has no negatives for any training query (query ids do not match; "
            "was it mined from this training data?)"
        )
    unknown = sorted(set(mined) - {g.query_id for g in groups})
    if unknown:
        logger.warning("--negatives-file %s: %d of its queries are not in the training data (e.g. %s); their lines "
                       "are not used", Path(path).name, len(unknown), unknown[0])
    if corpus is not None:  # ids the file's lines gave (not derived from a text) that name no document here
        foreign = sorted({doc_id for g in result for doc_id, text in g.negatives
                          if doc_id not in corpus and doc_id != content_id("d:", text)})
        if foreign:
            logger.warning("--negatives-file %s: %d of its negative ids are not in the training data's corpus (e.g. "
                           "%s): was it mined from another corpus? The file's texts are used", Path(path).name,
                           len(foreign), foreign[0])
    log = logger.info if found == len(groups) else logger.warning  # short of every query: said, not just logged
    log("negatives for %d of %d training queries read from %s", found, len(groups), Path(path).name)
    return result


def _stage_args(training_args: FinetuneTrainingArguments, work_dir: Path, stage: str, columns: list[str],
                hybrid: bool):
    args = copy.copy(training_args)
    args.output_dir = str(work_dir / f"stage-{stage}")
    args.prompts = stage_prompts(model_prompts(training_args.prompts), columns)  # --prompts names no columns
    if training_args.world_size > 1:
        args.dataloader_drop_last = True  # all_gather needs equal batch sizes on every rank
    if args.device.type == "cpu":
        args.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every DataLoader
    if hybrid and not args.router_mapping:
        # query column = task "query" (full OT vector), the others "document" (top-k); sentence-transformers 6.2
        # stamps it into each column's features as features["task"]
        args.router_mapping = {c: ("query" if c == "query" else "document") for c in columns}
    return args


def _prepare_checkpoint(model: SentenceTransformer, checkpoint: Path) -> None:
    """The trainer reloads a checkpoint as a SentenceTransformer built from the classes its modules.json names: name
    the classes of the model in training (a DupMAE hybrid model's pooling module is remote code, imported under
    another module path), and keep a pooler-less encoder without a pooler."""
    modules_file = checkpoint / "modules.json"
    entries = json.loads(modules_file.read_text(encoding="utf-8"))
    for entry in entries:
        entry["type"] = fullname(model[int(entry["idx"])])
    write_json_atomic(modules_file, entries)
    save_without_pooler(model, checkpoint)


def _train_stage(model, args, dataset, loss, stage: str, resume: bool) -> dict[str, Any]:
    """Train one stage; resuming, from the newest complete trainer checkpoint in its folder (if any), else afresh."""
    started = time.time()
    checkpoint = last_complete_checkpoint(args.output_dir) if resume else None
    if checkpoint is None:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # this run's own stage folder: checkpoints of an older run
    else:
        logger.info("stage %s: continuing from %s", stage, checkpoint)
        clean_killed_saves(args.output_dir)
        _prepare_checkpoint(model, checkpoint)
    trainer = StageTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    output = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if output.global_step == 0:  # the dataloader gave no batch: the starting weights are no result
        raise ValueError(f"stage {stage} trained 0 steps ({len(dataset)} examples, batches of "
                         f"{args.per_device_train_batch_size}): lower --per-device-train-batch-size or give more "
                         "training data (nothing was written)")
    _check_finite(model, trainer.state.log_history, stage, output.global_step)
    logger.info("stage %s: %d steps, training loss %.4f", stage, output.global_step, output.training_loss)
    record = {"steps": output.global_step, "train_loss": round(float(output.training_loss), 4),
              "seconds": round(time.time() - started, 1)}
    if checkpoint is not None:  # the Trainer's mean covers the steps after the checkpoint only
        record["train_loss_from_step"] = int(checkpoint.name.rsplit("-", 1)[1]) + 1
    return record


def _check_finite(model: SentenceTransformer, log_history: list[dict[str, Any]], stage: str, steps: int) -> None:
    """Refuse a stage whose weights became NaN or infinite, before its model is saved anywhere."""
    diverged = divergence(model, log_history)
    if diverged:
        raise ValueError(f"stage {stage} diverged: {diverged}, after {steps} steps; lower --learning-rate (or "
                         "--scale) and run again (nothing was written)")


@dataclass
class CheckedNegatives:
    """What `_read_negatives_before_training` read, for the stages to use: the corpus to mine from, or the groups
    with their negatives (cleaned; `dropped` counts what cleaning dropped) and each stage's dataset and report."""

    pool: dict[str, str] | None = None
    groups: list[TrainingGroup] | None = None
    dropped: dict[str, int] = field(default_factory=dict)
    datasets: dict[str, tuple[Dataset, dict[str, Any]]] = field(default_factory=dict)


def _read_negatives_before_training(stages: list[str], groups: list[TrainingGroup], beir: RetrievalData | None,
                                    teacher_scores: dict[str, dict[str, float]] | None,
                                    data_args: FinetuneDataArguments, seed: int) -> CheckedNegatives:
    """Read what the stages after in-batch read, before anything trains: negatives from `--negatives-file` or the
    training data must fill those stages' rows (with teacher scores for distill); for mining, the corpus is read.
    Negatives mined later are checked once mined."""
    if stages == ["in-batch"]:
        return CheckedNegatives()
    if not data_args.negatives_file and not any(g.negatives for g in groups):
        pool = _corpus_pool(data_args, beir, groups)
        check_pool_holds_negatives(len(pool), data_args)
        if "distill" in stages:
            check_positives_scored(groups, teacher_scores or {}, data_args)
        return CheckedNegatives(pool=pool)
    if data_args.negatives_file:
        groups = _negatives_from_file(data_args.negatives_file, groups, beir.corpus if beir is not None else None)
    checked = CheckedNegatives()
    checked.groups, checked.dropped = clean_groups(groups)
    if "hard-negatives" in stages:
        checked.datasets["hard-negatives"] = groups_to_dataset(checked.groups, data_args.num_negatives, seed=seed)
    if "distill" in stages:
        checked.datasets["distill"] = groups_to_distillation_dataset(
            checked.groups, teacher_scores, data_args.num_negatives, on_missing=data_args.on_missing, seed=seed)
    return checked


def _attach_negatives(model: SentenceTransformer, groups: list[TrainingGroup], state: dict[str, Any],
                      data_args: FinetuneDataArguments, training_args: FinetuneTrainingArguments,
                      beir: RetrievalData | None, work_dir: Path,
                      checked: CheckedNegatives) -> tuple[list[TrainingGroup], dict[str, int], str]:
    """`groups` with hard negatives, cleaned, what cleaning dropped, and where the negatives came from:
    `--negatives-file` or the training data (as `checked` read them), the run this one resumes, or mined now with
    `model` (saved to `NEGATIVES_FILE`, recorded in `state`)."""
    if checked.groups is not None:
        source = (f"file {Path(data_args.negatives_file).name}" if data_args.negatives_file
                  else "supplied with the training data")
        return checked.groups, checked.dropped, source
    if state["negatives"]:
        return (*clean_groups(_negatives_from_file(work_dir / NEGATIVES_FILE, groups)), state["negatives"])
    mined = mine_negatives(
        model, groups, checked.pool if checked.pool is not None else _corpus_pool(data_args, beir, groups),
        num_negatives=data_args.num_negatives,
        range_min=data_args.mine_range_min, range_max=data_args.mine_range_max,
        sampling=data_args.mine_sampling, batch_size=training_args.per_device_train_batch_size * 4,
        seed=training_args.seed, output_file=work_dir / NEGATIVES_FILE,
    )
    # the ranks mining used: a pool smaller than --mine-range-max lowers it
    state["negatives"] = f"mined with the {'previous-stage' if state['stages'] else 'starting'} model ({mined.ranks})"
    if training_args.process_index == 0:  # a resumed run reads them from NEGATIVES_FILE
        write_json_atomic(work_dir / STATE_FILE, state)
    return (*clean_groups(mined.groups), state["negatives"])


def _stage_data_and_loss(stage: str, model: SentenceTransformer, groups: list[TrainingGroup],
                         teacher_scores: dict[str, dict[str, float]] | None, data_args: FinetuneDataArguments,
                         loss_args: FinetuneLossArguments, seed: int, gather: bool,
                         built: tuple[Dataset, dict[str, Any]] | None) -> tuple[Dataset, dict[str, Any], nn.Module, str]:
    """A stage's dataset, its build report (`built`, when read before training), its loss and the loss's
    description for the run record."""
    if stage == "distill":
        dataset, report = built or groups_to_distillation_dataset(
            groups, teacher_scores, data_args.num_negatives, on_missing=data_args.on_missing, seed=seed
        )
        loss = DistillationLoss(model, loss_args.distill_loss_weight, loss_args.contrastive_loss_weight,
                                loss_args.distill_temperature, loss_args.scale, gather)
        description = f"KL(batchmean) to cross-encoder scores x {loss_args.distill_loss_weight:g}"
        if loss_args.contrastive_loss_weight:
            description += f" + in-batch contrastive x {loss_args.contrastive_loss_weight:g}"
        return dataset, report, loss, description
    negatives = 0 if stage == "in-batch" else data_args.num_negatives
    dataset, report = built or groups_to_dataset(groups, negatives, seed=seed)
    description = "in-batch negatives" if stage == "in-batch" else f"{negatives} hard negatives + in-batch negatives"
    loss = contrastive_loss(model, loss_args.scale, gather, loss_args.mini_batch_size)
    name = "MultipleNegativesRankingLoss" if loss_args.mini_batch_size is None else (
        f"CachedMultipleNegativesRankingLoss, mini-batches of {loss_args.mini_batch_size}")
    return dataset, report, loss, f"{description} ({name})"


def _check_run_inputs(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                      training_args: FinetuneTrainingArguments, stages: list[str]) -> Path:
    """The work folder, after refusing, before anything is loaded or trained, what would fail in a later stage or
    lose files: an output folder that is, holds or lies in an input, or is the working directory, a work folder
    inside the output folder or an input, a missing file, a rank range that cannot hold the negatives, a resume
    value other than `last`, teacher scores without the distill stage, an in-batch stage without in-batch
    negatives."""
    output_dir = Path(training_args.output_dir)
    files = {"--corpus": data_args.corpus, "--negatives-file": data_args.negatives_file,
             "--teacher-scores": data_args.teacher_scores}
    inputs = {"--model": model_args.model, "--train-data": data_args.train_data, "--eval-data": data_args.eval_data,
              **files}
    claim_output(output_dir, "--output-dir", training_args.overwrite, owner=model_holding, inputs=inputs)
    # and not inside an input folder either: `publish` would upload the run's folders with the model
    claim_output(output_dir, "--output-dir", training_args.overwrite, kind="into", owner=model_holding, inputs=inputs)
    work_dir = work_dir_of(training_args)
    if output_dir.resolve() in (work_dir.resolve(), *work_dir.resolve().parents):
        raise ValueError(f"--work-dir {work_dir} is inside --output-dir {output_dir}, which the finished model "
                         f"replaces; choose a folder beside it (default: {output_dir.name}.work)")
    claim_output(work_dir, "--work-dir", False, kind="into", owner=work_dir_holding, inputs=inputs)
    resume = training_args.resume_from_checkpoint
    if resume is not None and resume not in RESUME_LAST:
        raise ValueError(f"--resume-from-checkpoint {resume}: `retromae finetune` continues its own run, each "
                         "stage from its newest checkpoint in the work folder; pass `last`")
    check_earlier_progress_kept(work_dir, resume in RESUME_LAST, training_args.overwrite)
    for flag, path in files.items():
        if path and Path(path).is_dir():
            hint = f" (a BEIR folder's corpus is {Path(path) / 'corpus.jsonl'})" if flag == "--corpus" else ""
            raise ValueError(f"{flag} {path} is a folder, not a file{hint}")
        if path and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
    if data_args.eval_data:  # read whole now, as the evaluation will: a bad line would be found after training
        drop_blank_queries(read_beir(data_args.eval_data, split=data_args.eval_split, on_missing=data_args.on_missing))
    if data_args.teacher_scores and "distill" not in stages:
        raise ValueError("--teacher-scores is read by the distill stage only: add distill to --stages, or drop "
                         "the flag")
    if stages != ["in-batch"] and data_args.num_negatives < 1:  # mined, read from a file or carried by the data
        raise ValueError(f"--num-negatives {data_args.num_negatives}: the {stages[-1]} stage needs at least one "
                         "negative per query; give 1 or more")
    if stages != ["in-batch"] and not data_args.negatives_file:
        check_mining_range(data_args.num_negatives, data_args.mine_range_min, data_args.mine_range_max)
    if "in-batch" in stages and training_args.per_device_train_batch_size < 2 and training_args.world_size == 1:
        raise ValueError("the in-batch stage with --per-device-train-batch-size 1 has no negative (its loss is "
                         "always 0): give a batch of 2 or more queries")
    return work_dir


def run_finetune(
    model_args: FinetuneModelArguments,
    data_args: FinetuneDataArguments,
    loss_args: FinetuneLossArguments,
    training_args: FinetuneTrainingArguments,
) -> FinetuneResult:
    """Run the stages and write the fine-tuned sentence-transformers folder (see the module docstring)."""
    check_trainer_options(training_args)
    stages = parse_stages(data_args.stages, data_args.teacher_scores)
    if loss_args.mini_batch_size is not None and "distill" in stages:
        raise ValueError("--mini-batch-size applies to the in-batch and hard-negatives stages, not distill: run "
                         "the distill stage in a fine-tuning of its own without it")
    if model_args.model_name is not None:
        check_model_name(model_args.model_name)
    if model_args.base_model_name is not None and not is_hub_id(model_args.base_model_name):
        raise ValueError(f"--base-model-name {model_args.base_model_name!r} is not a Hub id (owner/name); the card "
                         "names no local paths: omit the flag to record the starting model as local")
    check_dataset_ids("--eval-dataset-id", None if data_args.eval_dataset_id is None else [data_args.eval_dataset_id])
    model_prompts(training_args.prompts)  # refused before anything is read
    finished = finished_work_dir_run(model_args, data_args, loss_args, training_args, stages)
    if finished is not None:  # as `pretrain` resumed after its end: nothing to train, nothing to replace
        work_dir = work_dir_of(training_args)
        if training_args.process_index == 0 and evaluation_missing(work_dir, data_args, finished.info):
            with folder_lock(work_dir):  # stopped during its --eval-data evaluation: that is what is left
                finished.info = evaluate_written_model(finished.output_dir, data_args, work_dir)
            finished.evaluated_now = True
        return finished
    work_dir = _check_run_inputs(model_args, data_args, training_args, stages)
    new_work_dir = not work_dir.exists()
    # one run per work folder: a second would train into the first one's checkpoints
    with folder_lock(work_dir, enabled=training_args.process_index == 0):
        try:
            return _run_stages(model_args, data_args, loss_args, training_args, stages, work_dir)
        except ValueError:
            main = training_args.process_index == 0  # the process holding the lock: another would remove it
            if main and new_work_dir and not (work_dir / STATE_FILE).is_file():  # refused before training
                shutil.rmtree(work_dir, ignore_errors=True)
            raise


def _run_stages(model_args: FinetuneModelArguments, data_args: FinetuneDataArguments,
                loss_args: FinetuneLossArguments, training_args: FinetuneTrainingArguments, stages: list[str],
                work_dir: Path) -> FinetuneResult:
    """`run_finetune` once its inputs are checked and its work folder is locked."""
    output_dir = Path(training_args.output_dir)
    teacher_scores = read_teacher_scores(data_args.teacher_scores) if "distill" in stages else None
    set_seed(training_args.seed)

    groups, beir = load_training_groups(data_args.train_data, split=data_args.split, on_missing=data_args.on_missing)
    groups, dropped = clean_groups(negatives_unread_dropped(groups, stages, data_args.train_data))
    checked = _read_negatives_before_training(stages, groups, beir, teacher_scores, data_args, training_args.seed)
    if "in-batch" in stages:  # built once, here: its size is checked before anything trains
        checked.datasets["in-batch"] = groups_to_dataset(groups, 0, seed=training_args.seed)
    for stage, (dataset, _) in checked.datasets.items():
        _check_batches(stage, len(dataset), training_args)
    settings = finetune_run_settings(model_args, data_args, loss_args, training_args)
    check_processes_agree({"settings": settings}, training_args.world_size)
    # a pre-training checkpoint is exported into the work folder first
    model, model_info = load_as_sentence_transformer(
        model_args.model, pooling=model_args.pooling, max_seq_length=model_args.max_seq_length, work_dir=work_dir
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    state, resume = read_state(work_dir, settings, training_args.resume_from_checkpoint in RESUME_LAST,
                                training_args.process_index == 0)
    model = model_after_finished_stages(model, stages, state, work_dir)
    model.prompts.update(model_prompts(training_args.prompts) or {})  # mining and --eval-data encode with them
    # all_gather only where there is more than one process (else sentence-transformers warns on every step)
    gather = loss_args.gather_across_devices and training_args.world_size > 1
    negatives_source = None
    for stage in stages[len(state["stages"]):]:
        if stage != "in-batch" and negatives_source is None:  # the first stage that needs negatives gets them
            groups, more_dropped, negatives_source = _attach_negatives(model, groups, state, data_args,
                                                                       training_args, beir, work_dir, checked)
            for key, value in more_dropped.items():
                dropped[key] = dropped.get(key, 0) + value
        dataset, report, loss, description = _stage_data_and_loss(stage, model, groups, teacher_scores, data_args,
                                                                  loss_args, training_args.seed, gather,
                                                                  checked.datasets.get(stage))
        logger.info("stage %s: %d examples, columns %s", stage, len(dataset), dataset.column_names)
        _check_batches(stage, len(dataset), training_args)  # mined negatives: known only now
        args = _stage_args(training_args, work_dir, stage, dataset.column_names, hybrid_method_of(model) is not None)
        record = {"stage": stage, "loss": description, "examples": len(dataset),
                  "negatives_per_query": 0 if stage == "in-batch" else data_args.num_negatives,
                  "negatives": negatives_source if stage != "in-batch" else None,
                  "loss_config": loss_config_of(loss), **report}
        record.update(_train_stage(model, args, dataset, loss, stage, resume))
        finish_stage(state, work_dir, model, record, training_args.process_index == 0)

    info = finetune_run_info(model, model_info, model_args, data_args, loss_args, training_args, beir, groups, dropped,
                     state["stages"], output_dir)
    if training_args.process_index == 0:
        save_finetuned_model(model, output_dir, info, overwrite=training_args.overwrite)
        if data_args.eval_data:
            info = evaluate_written_model(output_dir, data_args, work_dir)
    return FinetuneResult(output_dir, info)


def _check_batches(stage: str, examples: int, training_args: FinetuneTrainingArguments) -> None:
    """`check_full_batches` for a stage of this run: DDP drops incomplete batches (`_stage_args`)."""
    check_full_batches(stage, examples, training_args.per_device_train_batch_size, training_args.world_size,
                       training_args.dataloader_drop_last or training_args.world_size > 1)


def finetune(
    model: str | os.PathLike,
    train_data: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    stages: str | Sequence[str] = ("in-batch", "hard-negatives"),
    overwrite: bool = False,
    **options: Any,
) -> FinetuneResult:
    """Fine-tune a bi-encoder for retrieval and write it as a sentence-transformers folder (`retromae finetune`).

    Args:
        model: the starting point: a `retromae pretrain` checkpoint, a `retromae export` folder, any
            sentence-transformers folder, a plain BERT folder or a Hub id.
        train_data: a BEIR folder, a .jsonl file of {query, positive, negatives}, a datasets folder or a Hub dataset.
        output_dir: the folder to write (built in a temporary sibling, renamed into place when complete).
        stages: the stages in order, from `STAGES` ("distill" needs `teacher_scores=`).
        overwrite: replace an existing `output_dir`.
        **options: any other setting of `retromae finetune` by its field name, e.g. `max_steps=100`,
            `per_device_train_batch_size=32`, `learning_rate=2e-5`, `eval_data="beir/scifact"`, `teacher_scores=...`,
            `num_negatives=7`, `pooling="cls"`, `model_name="my-org/model"` (see `retromae finetune --help`).

    Returns:
        The output folder and the run record (`FinetuneResult`).

    Raises:
        TypeError: a path that is no str or `os.PathLike`, a bool option that is not True or False, a number option
            that is no number.
        ValueError: an unknown option; any `ValueError` of the data or the model.
    """
    for name, path in (("model", model), ("train_data", train_data), ("output_dir", output_dir)):
        check_path("retromae.finetune", name, path)
    options.update(rename_legacy_keys("retromae.finetune", options, FinetuneLossArguments.legacy_keys))
    given = set(options)
    values: dict[str, Any] = {
        **check_option_types("retromae.finetune", options), "model": os.fspath(model),
        "train_data": os.fspath(train_data), "output_dir": os.fspath(output_dir), "overwrite": overwrite,
        "stages": ",".join(list_parameter("retromae.finetune", "stages", stages)),
    }
    arguments = []
    for argument_class in ARGUMENT_CLASSES:
        check_bool_options("retromae.finetune", argument_class, values)  # before TrainingArguments reads its own
        names = {f.name for f in dataclasses.fields(argument_class) if f.init}
        arguments.append(argument_class(**{name: values.pop(name) for name in list(values) if name in names}))
    if values:
        raise ValueError(f"unknown fine-tuning option(s) {', '.join(sorted(values))}; see `retromae finetune --help`")
    check_training_arguments(arguments[-1])  # the command line's are checked as they are parsed
    check_options_read(given, arguments[1])  # as the command line: an option no stage reads is refused
    return run_finetune(*arguments)


__all__ = ["finetune", "run_finetune"]
