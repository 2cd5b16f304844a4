"""`retromae pretrain` (and `retromae.pretrain`): parse, resolve, train, print."""

from __future__ import annotations

import functools
import logging
import os
import shlex
from pathlib import Path
from typing import Any

from sentence_transformers import SentenceTransformer
from transformers import (
    IntervalStrategy,
    set_seed,
)

from ..export.sentence_transformer import export_from_model
from ..inputs.arguments import configure_logging
from ..inputs.errors import UserError
from ..inputs.folders import INTERRUPTED_HINT
from ..inputs.outputs import check_folder_option, claim_output, holds_one_of
from ..inputs.pretrain_options import (
    check_export_target,
    export_target,
    pretrain_arguments,
    run_inputs,
)
from ..training.lock import folder_lock
from ..training.positions import check_model_and_tokenizer
from ..training.pretraining import (
    best_summary,
    checkpoint_extras,
    final_save_done,
    save_tokenized_corpus,
    train_model,
    validation_callback,
)
from ..training.processes import check_processes_agree
from ..training.resume import (
    check_same_processes,
    check_text_unchanged,
    launch_command,
    read_settings,
)
from ..training.retrieval_validation import plot_validation, validation_summary
from ..training.run_folder import (
    check_no_checkpoint_collision,
    finished_step,
    last_complete_checkpoint,
    prepare_output_dir,
)
from ..training.sharding import full_state_dict, without_zero3_init
from ..training.trainer import RetroMAETrainer

logger = logging.getLogger("retromae")


def resume_hint(output_dir: str) -> str:
    """The line for a run stopped by Ctrl-C: the command that resumes it from its newest checkpoint (a checkpoint is
    installed only when complete), or that there is none yet."""
    newest = last_complete_checkpoint(output_dir)
    if newest is None:
        return f"interrupted before the first checkpoint of {output_dir}; nothing to resume: run the command again"
    launch = launch_command("pretrain", int(os.environ.get("WORLD_SIZE", 1)),
                            int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None)  # torchrun's
    return (f"interrupted after {newest.name}; resume with: {launch} --output-dir "
            f"{shlex.quote(os.fspath(output_dir))} --resume-from-checkpoint last")


def pretrain(argv: list[str]) -> int:
    """`retromae pretrain ARGS`: train, save the pre-training model (decoder included), export the encoder. The main
    process holds the output folder's lock (`training.lock`) from preparing the folder to the end. A finished run
    resumed trains nothing: it writes only what is missing of its final save and export."""
    run = pretrain_arguments(argv)
    args = run.training
    INTERRUPTED_HINT.set(functools.partial(resume_hint, args.output_dir))  # what `cli.main` says after a Ctrl-C
    configure_logging(args.get_process_log_level())
    check_processes_agree(run.settings, args.world_size)
    set_seed(args.seed)
    if args.dataloader_pin_memory and args.device.type == "cpu":
        args.dataloader_pin_memory = False  # pinning needs an accelerator; torch warns on every DataLoader
    if run.data.save_tokenized:
        INTERRUPTED_HINT.set(lambda: f"interrupted while tokenizing into {run.data.save_tokenized}, which is left as "
                                     "it was: run the command again")
        return save_tokenized(run)
    if run.data.streaming and args.max_steps <= 0:
        raise UserError("--streaming needs --max-steps (a streamed corpus has no length)")
    finished = finished_step(run.resume, args.max_steps) if run.resume else None
    if run.resume and finished is None:
        check_no_checkpoint_collision(args.output_dir, run.resume, args.max_steps)
    check_folder_option("--output-dir", args.output_dir, writable=finished is None)  # a finished run may write nothing
    export_dir, overwrite_export = export_target(run)
    # Decided on every process before any process writes (reading the data is a barrier), so all take the same path.
    write_export = export_dir is not None and not (finished is not None and (export_dir / "modules.json").is_file())
    if write_export:
        check_export_target(export_dir, overwrite_export, run)
    recorded = read_settings(run.resume) if run.resume and finished is None else None
    if recorded:  # a finished run reads no text and trains nothing: it only writes what is missing
        check_text_unchanged(recorded, run.resume)
        check_same_processes(recorded, args.world_size, run.resume)
    save_final = finished is None or not final_save_done(args.output_dir, finished)
    validation = validation_callback(run) if finished is None else None  # a bad folder is refused before training
    if finished is not None:  # nothing to train or evaluate: the Trainer would want an evaluation set
        args.eval_strategy = IntervalStrategy.NO

    # a finished run with nothing missing writes nothing: it may read a read-only folder, without the lock
    writes = finished is None or save_final or write_export
    with folder_lock(args.output_dir, enabled=args.should_save, required=writes) as lock:
        replace = prepare_output_dir(args.output_dir, run.resume, overwrite=run.run.overwrite_output_dir,
                                     should_save=lock is not None, inputs=run_inputs(run))
        trainer, tokenizer, seconds = train_model(run, validation, replace_earlier_run=replace)
        if save_final:
            trainer.save_pretraining_model(args.output_dir)
        if write_export:
            model = trainer.accelerator.unwrap_model(trainer.model)
            weights = full_state_dict(model)  # a collective under FSDP: every process calls it
            if args.should_save:
                with without_zero3_init():  # a DupMAE export loads the encoder back, on this process alone
                    export_from_model(model, tokenizer, export_dir, run_info=trainer.current_run_info(),
                                      overwrite=overwrite_export, state_dict=weights)
        if trainer.is_world_process_zero():
            if validation is not None:
                plot_validation(trainer.state.log_history, Path(args.output_dir) / "validation.png")
            print_summary(trainer, args.output_dir, str(export_dir) if export_dir else None, seconds,
                          finished_checkpoint=run.resume if finished is not None else None)
    return 0


# what `Dataset.save_to_disk` writes: --overwrite-output-dir replaces a saved dataset, never a folder of other files
SAVED_DATASET = holds_one_of("state.json", "dataset_info.json", kind="saved dataset")


def save_tokenized(run: Any) -> int:
    """`retromae pretrain --save-tokenized FOLDER`: tokenize the corpus into FOLDER, print where, train nothing."""
    folder = Path(run.data.save_tokenized).expanduser()
    overwrite = run.run.overwrite_output_dir
    claim_output(folder, "--save-tokenized", overwrite, overwrite_flag="--overwrite-output-dir",
                 inputs={"--corpus": run.data.corpus} if run.data.corpus else None, owner=SAVED_DATASET)
    sequences = save_tokenized_corpus(run, folder, overwrite)
    print(f"retromae: {sequences} tokenized sequences of up to {run.data.max_seq_length} tokens in {folder}; train "
          f"any method from them with --corpus {folder}", flush=True)
    return 0


def start_description(info: dict[str, Any]) -> str:
    """The starting weights of a run record: its base model, or random ones with a base's architecture."""
    start = info.get("initialisation") or {}
    if not start.get("from_scratch"):
        return str(info.get("base_model") or "not recorded")
    overrides = f", changed by {start['config_overrides']}" if start.get("config_overrides") else ""
    return f"random weights (--seed), with the architecture of {start.get('architecture_of')}{overrides}"


def print_summary(trainer: RetroMAETrainer, output_dir: str, export_dir: str | None, seconds: float,
                  finished_checkpoint: str | None = None) -> None:
    """Where everything is, the first and last losses and accuracies, and an example encoding;
    `finished_checkpoint`: the run had already finished there (nothing trained now)."""
    info = trainer.current_run_info()
    first, final = info.get("first_losses", {}), info.get("final_losses", {})
    losses = ", ".join(f"{k} {first.get(k, float('nan')):.3f} -> {v:.3f}" for k, v in sorted(final.items()))
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    window = f"step {logged[0]['step']} -> step {logged[-1]['step']}" if logged else "none logged"
    accuracies = ", ".join(f"{k} {logged[0].get(k, float('nan')):.3f} -> {v:.3f}"
                           for k, v in sorted(logged[-1].items()) if k.endswith("_accuracy")) if logged else ""
    lines = [
        "",
        f"retromae: {info['method']} pre-training had already finished at step {info['global_step']} "
        f"({finished_checkpoint}); nothing was trained" if finished_checkpoint else
        f"retromae: {info['method']} pre-training finished: {info['global_step']} steps in {seconds / 60:.1f} min",
        f"  started from: {start_description(info)}",
        f"  losses ({window}): {losses}",
        *([f"  top-1 accuracies ({window}): {accuracies}"] if accuracies else []),
        f"  pre-training checkpoint ({checkpoint_extras(info['method'])} included): {output_dir}",
    ]
    validated = [line for line in (validation_summary(trainer.state.log_history), best_summary(trainer, bool(export_dir))) if line]
    lines[-1:-1] = validated
    if export_dir:
        # our own export, just written; DupMAE's carries its hybrid module as remote code
        with without_zero3_init():  # on the main process alone, also after a ZeRO-3 run
            encoder = SentenceTransformer(export_dir, trust_remote_code=True)
        example = "Dense retrievers encode text into vectors."
        vector = encoder.encode_document([example])[0]
        lines += [
            f"  sentence-transformers encoder: {export_dir}",
            f"  example: encode_document([{example!r}]) -> shape {tuple(vector.shape)}, "
            f"first values {[round(float(x), 4) for x in vector[:4]]}",
        ]
    print("\n".join(lines), flush=True)


__all__ = ["check_model_and_tokenizer", "pretrain", "print_summary"]
