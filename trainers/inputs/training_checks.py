"""The checks of training options that transformers passes on unchecked: `check_training_arguments` refuses
options that would train nothing, train forever or fail deep in the Trainer, on a `TrainingArguments` or on the
namespace its flags parse into."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import types
import typing
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

from .errors import UserError
from .parameters import check_bool_options, is_number


@functools.cache
def _number_fields() -> dict[str, tuple[bool, bool]]:
    """TrainingArguments' fields typed int or float: name -> (integer, None allowed)."""
    fields = {}
    for name, hint in typing.get_type_hints(TrainingArguments).items():
        kinds = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) else {hint}
        if kinds & {int, float} and kinds <= {int, float, type(None)}:
            fields[name] = (float not in kinds, type(None) in kinds)
    return fields


def _check_number_fields(args: Any) -> None:
    """Refuse a number field of `args` holding something else: TrainingArguments keeps e.g. learning_rate="fast",
    and the Trainer or torch fails on it later with "'<=' not supported between 'float' and 'str'".

    Raises:
        TypeError: one line naming the field, its value and the type to pass.
    """
    defaults = {field.name: field.default for field in dataclasses.fields(TrainingArguments)}
    for name, (integer, optional) in _number_fields().items():
        value = getattr(args, name, None)
        if is_number(value, integer=integer, optional=optional):
            continue
        kind, example = ("a whole number", "an int") if integer else ("a number", "a float")
        raise TypeError(f"TrainingArguments {name}={value!r} is not {kind}; pass {example}, e.g. "
                        f"{name}={defaults[name]!r}")


def check_training_arguments(args: Any) -> None:
    """Refuse training options that would train nothing, train forever or fail deep in the Trainer.

    Args:
        args: a `TrainingArguments`, or the namespace its flags parse into (read before the dataclass is built).

    Raises:
        TypeError: a number or bool field of a `TrainingArguments` that holds something else (`_check_number_fields`,
            `parameters.check_bool_options`; the command line's namespace holds what argparse converted).
        UserError: one line naming the flag, its value and the fix. `--max-steps` takes a positive number or -1
            (transformers' "not set": train for --num-train-epochs); 0 would train one step and other negative
            values every epoch.
    """
    if isinstance(args, TrainingArguments):
        _check_number_fields(args)
        check_bool_options("TrainingArguments", type(args), vars(args))
    max_steps = getattr(args, "max_steps", -1)
    if max_steps == 0 or max_steps < -1:
        raise UserError(f"{_given(args, 'max_steps', max_steps)}: give a positive number of optimizer steps, or leave "
                        "it unset (-1, the default) to train for --num-train-epochs")
    epochs = getattr(args, "num_train_epochs", 1.0)
    if max_steps == -1 and not 0 < epochs < math.inf:  # also NaN
        raise UserError(f"{_given(args, 'num_train_epochs', epochs)}: give a positive number of epochs (or "
                        "--max-steps N)")
    check_positive(args, "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    for kind in ("save", "logging"):  # 0 with the "steps" strategy: never saves (a killed run loses everything)
        steps = getattr(args, f"{kind}_steps", 1)
        if getattr(args, f"{kind}_strategy", "steps") == "steps" and not steps > 0:
            shown = steps if isinstance(args, TrainingArguments) else f"{steps:g}"  # the flag as typed: 0, not 0.0
            raise UserError(f"{_given(args, f'{kind}_steps', shown)}: give a positive number of optimizer steps (or a "
                            "fraction of the run below 1)")
    limit = getattr(args, "save_total_limit", None)
    if limit is not None and limit < 1:  # transformers keeps every checkpoint then, which nobody asking for 0 means
        raise UserError(f"{_given(args, 'save_total_limit', limit)}: give the number of newest checkpoints to keep, at "
                        "least 1, or leave it unset to keep all (--save-strategy no saves none)")
    for name, bound, fix in _RANGES:  # 0 <= value < bound; a NaN fails every comparison
        value = getattr(args, name, None)
        if value is not None and not 0 <= value < bound:
            raise UserError(f"{_given(args, name, value)}: give {fix}")
    _check_bf16(args)
    _check_fp16(args)
    _check_cpu_launch(args)
    _check_unused_trainer_options(args)


def _check_unused_trainer_options(args: Any) -> None:
    """Refuse the Trainer options that our runs would ignore (label smoothing: every method and fine-tuning loss is
    our own) or that bypass our own step (an upload from inside the Trainer skips `publish`'s checks)."""
    smoothing = getattr(args, "label_smoothing_factor", 0.0)
    if smoothing:
        raise UserError(f"{_given(args, 'label_smoothing_factor', smoothing)}: retromae's losses (the methods' and "
                        "fine-tuning's) do not smooth labels, so the option would be ignored; drop it")
    if getattr(args, "push_to_hub", False):
        raise UserError(f"{_given(args, 'push_to_hub', True)}: retromae does not upload from inside training; when the "
                        "run has finished, upload its result with `retromae publish --folder FOLDER --repo-id "
                        "OWNER/NAME`, which checks it first")


# (field, exclusive upper bound, what to give): options that transformers passes on unchecked, to fail or misbehave
# later; the bound math.inf refuses infinity too
_RANGES = (
    ("learning_rate", math.inf, "a finite learning rate >= 0 (e.g. 1e-4)"),
    ("warmup_steps", math.inf, "a finite number of steps >= 0 (or a fraction of the run below 1)"),
    ("max_grad_norm", math.inf, "a finite number >= 0 (0 turns gradient clipping off)"),
    ("weight_decay", math.inf, "a finite number >= 0 (e.g. 0.01)"),
    ("seed", 2**32, "an integer from 0 to 4294967295"),
    ("dataloader_num_workers", math.inf, "0 (batches built in the training process) or more worker processes"),
)


def _given(args: Any, name: str, value: Any) -> str:
    """Option `name` as the caller set it: `max_steps=0` on a `TrainingArguments` (Python), else its flag
    (`--max-steps 0`)."""
    if isinstance(args, TrainingArguments):
        return f"{name}={value!r}"
    return f"--{name.replace('_', '-')} {str(value).lower() if isinstance(value, bool) else value}"


def check_positive(args: Any, *names: str) -> None:
    """Refuse a value below 1 of each named integer option (unset ones pass), naming the flag."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"{_given(args, name, value)}: give a positive integer")


def _check_bf16(args: Any) -> None:
    """Refuse --bf16 with --fp16, and --bf16 / --bf16-full-eval where TrainingArguments would (the same test: no GPU
    with bf16 support, and not --use-cpu)."""
    if getattr(args, "bf16", False) and getattr(args, "fp16", False):
        raise UserError("--fp16 and --bf16 are both true; keep one")
    flags = [name for name in ("bf16", "bf16_full_eval") if getattr(args, name, False)]
    # the device is asked only when bf16 is: the question may initialise CUDA
    if not flags or getattr(args, "use_cpu", False) or is_torch_bf16_gpu_available() or is_torch_xla_available():
        return
    flag = "--" + flags[0].replace("_", "-")
    raise UserError(f"{flag} true needs a GPU with bf16 support and this machine has none; drop {flag} (Python: "
                    f"{flags[0]}=False), add --use-cpu true (Python: use_cpu=True) to train in bf16 on the CPU, where "
                    "torch supports it, or use --fp16 true (Python: fp16=True) on a GPU without bf16")


def _check_cpu_launch(args: Any) -> None:
    """Refuse a torchrun launch of several processes on a machine without a GPU unless --use-cpu: the Trainer would
    not join the process group, and each process would train alone into the same folder."""
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if processes > 1 and not getattr(args, "use_cpu", True) and not torch.accelerator.is_available():
        raise UserError(f"this run was started with {processes} processes (torchrun) on a machine without a GPU; add "
                        "--use-cpu true (Python: use_cpu=True) to train them as one DDP run on the CPU (gloo)")


def _check_fp16(args: Any) -> None:
    """Refuse --fp16 / --fp16-full-eval on the CPU (no accelerator, or --use-cpu): the Trainer would run fp32 there
    without a word."""
    flags = [name for name in ("fp16", "fp16_full_eval") if getattr(args, name, False)]
    if not flags or (not getattr(args, "use_cpu", False) and (torch.accelerator.is_available()
                                                                or is_torch_xla_available())):
        return
    flag = "--" + flags[0].replace("_", "-")
    raise UserError(f"{flag} true needs a GPU: on the CPU the Trainer would train in fp32 without saying so; pass "
                    f"{flag} false (Python: {flags[0]}=False; a preset may set it), or --bf16 true --use-cpu true "
                    "(Python: bf16=True, use_cpu=True) for mixed precision on the CPU")


__all__ = ["check_positive", "check_training_arguments"]
