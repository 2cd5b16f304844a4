"""`retromae finetune`: parse, run the stages, print."""

from __future__ import annotations

from ..inputs.arguments import CommandParser, positional_to_flags, start_command
from ..inputs.config_files import split_config
from ..inputs.errors import UserError
from ..inputs.finetune_options import ARGUMENT_CLASSES, check_options_read
from ..retrieval.beir import ON_MISSING, RetrievalDataError
from ..training.finetune_state import FinetuneResult
from ..training.finetuning import run_finetune
from ..training.resume import given_options

POSITIONAL = ["model", "train_data"]


def given_option_names(argv: list[str]) -> set[str]:
    """The options `argv` sets itself, by flag or in its --config file; defaults excluded (call after parsing)."""
    parser = CommandParser(ARGUMENT_CLASSES, prog="retromae finetune")
    flags, file_values = split_config(positional_to_flags(argv, POSITIONAL, parser))
    for action in parser._actions:  # the --config file may hold the required --model and --train-data
        action.required = False
    return set(file_values) | set(given_options(parser, flags))


def finetune_command(argv: list[str]) -> int:
    """`retromae finetune MODEL TRAIN_DATA [options]`."""
    model_args, data_args, loss_args, training_args = start_command(
        argv, ARGUMENT_CLASSES, prog="retromae finetune", positional=POSITIONAL,
        description="Fine-tune an encoder for retrieval (in-batch negatives -> mined hard negatives -> distillation) "
        "with sentence-transformers. Usage: retromae finetune MODEL TRAIN_DATA --output-dir OUT",
    )
    check_options_read(given_option_names(argv), data_args)
    if data_args.on_missing not in ON_MISSING:  # Literal choices are enforced by argparse; config files too
        raise UserError(f"--on-missing must be one of {ON_MISSING}")
    try:
        result = run_finetune(model_args, data_args, loss_args, training_args)
    except RetrievalDataError as error:
        raise UserError(str(error)) from None
    if training_args.process_index == 0:
        print("\n".join(summary_lines(result)), flush=True)
    return 0


def summary_lines(result: FinetuneResult) -> list[str]:
    """What the command prints when it ends: the stages trained and the --eval-data results, or that the run had
    already finished (and whether the evaluation it had left, stopped before, was run now)."""
    eval_lines = [f"  {row['dataset_name']} ({row['split']}): NDCG@10 {row['ndcg_at_10']:.4f}"
                  for row in result.info.get("eval_results") or []]
    if result.already_finished:
        stages = ", ".join(stage["stage"] for stage in result.info["stages"])
        line = (f"retromae: this fine-tuning had already finished (stages: {stages}); its model is "
                f"{result.output_dir}; nothing was trained")
        if not result.evaluated_now:
            return [line]
        return [f"{line}; the --eval-data evaluation it had left was run, and its card updated:", *eval_lines]
    lines = [f"retromae: fine-tuned model written to {result.output_dir}"]
    for stage in result.info["stages"]:
        resumed = stage.get("train_loss_from_step")
        lines.append(f"  {stage['stage']}: {stage['examples']} examples, {stage['steps']} steps, "
                     f"training loss {stage['train_loss']:.4f}"
                     + (f" (steps {resumed}-{stage['steps']}, after resuming)" if resumed else ""))
    return lines + eval_lines


__all__ = ["finetune_command", "given_option_names", "summary_lines"]
