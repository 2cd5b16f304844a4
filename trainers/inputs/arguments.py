"""Command-line parsing shared by every command: dataclass options, list and repeated flags, training checks.

* `parse(parser, argv)`: argv into the parser's dataclasses, over the defaults of a `--config` file (read by
  `config_files`); a flag given twice is refused (`reject_repeated_flags`: argparse would keep only the last value).
* A list field takes `metadata=LIST_FLAG`: `--model A --model B` and `--model A B` both give `["A", "B"]`.
* `start_command(argv, arguments, ...)`: a command's options parsed and its logging set up (`configure_logging`).
* `check_training_arguments(args)`: refuse training options that would train nothing, train forever or fail deep in
  the Trainer (`parse` calls it for every parser with a `TrainingArguments`).
* `expand_home(values)`: `~` in every path value expanded, as a shell would (`CommandParser` applies it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import re
import types
import typing
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import torch
import transformers
from transformers import HfArgumentParser, TrainingArguments
from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

from .config_files import (
    add_config_option,
    config_argument,
    merge_file_mappings,
    refuse_placeholders,
    split_config,
    with_json_presets,
)
from .errors import UserError
from .folders import COMMAND_INPUTS
from .parameters import SEVERAL_FILES, check_bool_options, is_number

logger = logging.getLogger(__name__)


# options whose values are text, never paths: a leading `~` there is the user's text
TEXT_OPTIONS = frozenset({"query", "commit_message", "model_name", "base_model_name", "corpus_name", "run_name",
                          "project", "prompts"})
HOME_PREFIX = re.compile(r"^~[\w.-]*(?=[/\\]|$)")  # `~`, `~/x`, `~user/x`: what a shell expands
OPTIONAL_PACKAGES = ("deepspeed",)  # TrainingArguments options that import a package of that name
EXPECTED_ONE = re.compile(r"^argument (?P<flags>\S+): expected (at least )?one argument$")


class DashValueError(UserError):
    """A flag's value starts with '-', so argparse read it as an option and the flag as given without a value."""

    def __init__(self, message: str, dest: str, value: str) -> None:
        super().__init__(message)
        self.dest, self.value = dest, value


def expand_home(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (option name -> value) with a leading `~` expanded in each string and list item, except in
    `TEXT_OPTIONS`: a quoted `"~/x"` on the command line or `~/x` in a config file reaches us unexpanded."""

    def expanded(value: Any) -> Any:
        if isinstance(value, str) and HOME_PREFIX.match(value):
            return os.path.expanduser(value)
        if isinstance(value, list):
            return [expanded(item) for item in value]
        return value

    return {name: value if name in TEXT_OPTIONS else expanded(value) for name, value in values.items()}


class CollectValues(argparse.Action):
    """Collect the values of every use of a list flag (`--x a --x b c` -> [a, b, c])."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        values = list(values) if isinstance(values, list | tuple) else [values]
        if getattr(self, "_filling", None) is not namespace:  # first use in this parse: replace the default
            self._filling = namespace
            setattr(namespace, self.dest, values)
        else:
            setattr(namespace, self.dest, [*getattr(namespace, self.dest), *values])


# metadata for a `list[str]` dataclass field parsed by HfArgumentParser (which adds nargs="+")
LIST_FLAG: dict[str, Any] = {"action": CollectValues}


class CommandParser(HfArgumentParser):
    """`HfArgumentParser` for our commands: a usage error is a `UserError` (one line, exit status 2, as every other
    bad input), and an abbreviation that only `--name_with_underscores` and `--name-with-dashes` of one option
    match is that option (transformers registers both spellings; argparse called `--output` ambiguous)."""

    _argv: Sequence[str] = ()  # the arguments of the last parse, for `error`

    def __init__(self, *args, presets: bool = False, **kwargs) -> None:
        """`presets`: `--config` takes a bundled preset by name, and its --help lists them (`add_config_option`)."""
        super().__init__(*args, **kwargs)
        self.presets = presets
        for action in self._actions:
            if action.dest == "fsdp":
                action.type = fsdp_value

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(args) if args is not None else []
        parsed, remaining = super().parse_known_args(args, namespace)
        for name, value in expand_home(vars(parsed)).items():  # the one place paths are expanded
            setattr(parsed, name, value)
        return parsed, remaining

    def error(self, message: str):
        dash_value = self._dash_value(message)
        if dash_value is not None:
            raise dash_value
        raise UserError(f"{message} (see {self.prog} --help)")

    def _dash_value(self, message: str) -> DashValueError | None:
        """The error for `--flag -value`, which argparse reports as `expected one argument` without the value."""
        match = EXPECTED_ONE.match(message)
        action = next((a for a in self._actions if match and "/".join(a.option_strings) == match["flags"]), None)
        if action is None:
            return None
        at = next((i for i, arg in enumerate(self._argv) if arg in action.option_strings), None)
        if at is None or at + 1 >= len(self._argv) or not self._argv[at + 1].startswith("-"):
            return None
        flag, value = flag_name(action), self._argv[at + 1]
        return DashValueError(f"{flag} {value}: a value that starts with '-' reads as an option; if {value} is the "
                              f"value, write {flag}={value}", action.dest, value)

    def _get_option_tuples(self, option_string: str):
        matches = super()._get_option_tuples(option_string)
        return list({id(match[0]): match for match in matches}.values())  # one per action, its dashed spelling


def fsdp_value(text: str) -> str | bool | None:
    """`--fsdp`'s value: true / false (also yes / no, 1 / 0, any case) turn FSDP on (its defaults: FSDP2, full
    shard) or off, as transformers' bare `--fsdp` and `fsdp=True`; other text is transformers' option list
    (`full_shard auto_wrap`), which it parses itself."""
    switch = text.strip().lower()
    if switch in {"true", "yes", "1"}:
        return True
    return None if switch in {"false", "no", "0"} else text


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Adds an option's default to its help where that says something: not None, not where the help names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


def _takes_many(action: argparse.Action) -> bool:
    return action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction | argparse._ExtendAction)


def reject_repeated_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Raise `UserError` naming the first single-value flag that `argv` gives more than once.

    Flags are counted per option (`--output-dir` and `--output_dir` are one), in `--flag value` and `--flag=value`
    form and as unambiguous abbreviations, up to a bare `--`.
    """
    owner = _option_owners(parser)
    counts: Counter[argparse.Action] = Counter()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            continue
        action = _option_action(owner, token.split("=", 1)[0])
        if action is not None:
            counts[action] += 1
    for action, count in counts.items():
        if count > 1 and not _takes_many(action) and not isinstance(action, argparse._HelpAction):
            flag = flag_name(action)
            raise UserError(f"{flag} is given {count} times; give it once (only the last value would count)")


def _option_owners(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Option string -> its action (`--max-steps` and `--max_steps` -> one action)."""
    return {option: action for action in parser._actions for option in action.option_strings}


def _option_action(owner: Mapping[str, argparse.Action], name: str) -> argparse.Action | None:
    """The action `name` names (`owner`: `_option_owners`), also as an unambiguous abbreviation of a long
    option, which argparse accepts; None for no action or several."""
    matches = [owner[name]] if name in owner else list(
        {id(a): a for option, a in owner.items() if name.startswith("--") and option.startswith(name)}.values())
    return matches[0] if len(matches) == 1 else None


# a one-value flag given several values: what the value is, and how to give several
STRAY_VALUE_HINTS = {"corpus": ("path", SEVERAL_FILES),
                     "config": ("file", "merge the files into one")}


def _unknown_options_message(parser: argparse.ArgumentParser, argv: Sequence[str], unknown: Sequence[str]) -> str:
    """The refusal of what argparse left over; a value that follows a one-value flag's value (`--corpus a.jsonl
    b.txt`, `--corpus=a.jsonl b.txt`) is named as one the flag does not take."""
    owner = _option_owners(parser)
    stray = next((token for token in unknown if not token.startswith("-")), None)
    for at in (i for i, token in enumerate(argv) if token == stray and i):
        name, equals, value = argv[at - 1].partition("=")
        if not (equals and name.startswith("--")):
            name, value = (argv[at - 2], argv[at - 1]) if at >= 2 else ("", "")
        action = _option_action(owner, name) if name.startswith("-") and not value.startswith("-") else None
        if action is not None and action.nargs in (None, "?"):
            noun, hint = STRAY_VALUE_HINTS.get(action.dest, ("value", "quote a value that holds spaces, or drop the "
                                                                      "others"))
            return f"{flag_name(action)} takes one {noun}, and {stray} follows its {noun} {value}; {hint}"
    return f"unknown option(s): {' '.join(unknown)} (see {parser.prog} --help for the options)"


def flag_name(action: argparse.Action) -> str:
    """The flag as users write it: the dashed long form (`--max-steps`, not `--max_steps`)."""
    return max(action.option_strings, key=lambda o: ("-" in o[2:], len(o)))


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=level)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # load/save bars; the training bar stays
    datasets.utils.logging.set_verbosity_error()


def parse(parser, argv: list[str], defaults: dict[str, Any] | None = None):
    """Parse argv into the parser's dataclasses; `--config FILE` (YAML/JSON) sets defaults that flags override."""
    add_config_option(parser)
    argv_given = argv
    argv, file_values = split_config(argv)
    reject_repeated_flags(parser, argv)  # argparse would keep only the last value (list flags collect them all)
    argv = merge_file_mappings(parser, argv, file_values)
    known = {action.dest for action in parser._actions} - {"config"}
    unknown = sorted(set(file_values) - known)
    if unknown:
        raise UserError(f"unknown setting(s) in the config file: {', '.join(unknown)} (see --help for the names)")
    found = config_argument(argv_given)
    COMMAND_INPUTS.set({"the --config file": found[2]} if found else {})
    if file_values:
        file_values = typed_file_values(parser, file_values, found[2])
    argv, file_values = with_json_presets(parser, argv, file_values)
    parser.set_defaults(**{**(defaults or {}), **file_values})
    for action in parser._actions:  # a required option the file sets (e.g. `model:`) is no longer required
        if action.required and action.dest in file_values:
            action.required = False
    namespace = parser.parse_known_args(argv)[0]
    if found:  # first: a preset's other settings (--fp16 true) must not hide that it needs the user's corpus
        refuse_placeholders(found[2], file_values, vars(namespace))
    if any(issubclass(kind, TrainingArguments) for kind in getattr(parser, "dataclass_types", ())):
        # on the raw values: TrainingArguments.__post_init__ itself refuses some (--bf16) with a long traceback
        check_training_arguments(namespace)
    try:
        *parsed, unknown_flags = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except UserError:
        raise
    except ValueError as error:  # an options dataclass's own check (TrainingArguments.__post_init__): the input's
        raise UserError(f"{' '.join(str(error).split())} (see {parser.prog} --help)") from error
    except ImportError as error:  # an option whose package is missing (transformers checks --deepspeed's)
        needed = next((name for name in OPTIONAL_PACKAGES if name in str(error)), None)
        if needed is None:
            raise
        raise UserError(f"--{needed} needs the {needed} package, which is not installed: pip install {needed} "
                        "(or drop the option)") from None
    if unknown_flags:
        raise UserError(_unknown_options_message(parser, argv_given, unknown_flags))  # `--config` in it too
    return tuple(parsed)


def typed_file_values(parser: argparse.ArgumentParser, file_values: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The `--config` file's values converted by their flags' types, as argparse converts a flag's text (it leaves
    a default that is not a string as it is): a value the type or choices refuse, or a list for a one-value flag,
    is one line naming the file and the setting."""
    actions = {action.dest: action for action in parser._actions}
    typed = {}
    for name, value in file_values.items():
        action = actions[name]
        flag = flag_name(action)
        many = action.nargs not in (None, "?")
        if isinstance(value, list) and not many:
            raise UserError(f"{path}: {name}: a list, but {flag} takes one value")
        converted = [_typed(action, item, f"{path}: {name}: {item!r}", flag) for item in
                     (value if isinstance(value, list) else [value])]
        typed[name] = converted if many and isinstance(value, list) else converted[0]
    return typed


def _typed(action: argparse.Action, value: Any, where: str, flag: str) -> Any:
    if value is None or action.type is None:
        return value
    text = value if isinstance(value, str) else json.dumps(value) if isinstance(value, bool) else str(value)
    try:
        typed = action.type(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        kind = {"int": "a whole number", "float": "a number"}.get(getattr(action.type, "__name__", ""),
                                                                  f"a value {flag} takes")
        raise UserError(f"{where} is not {kind}; fix the file") from None
    if action.choices is not None and typed not in action.choices:
        raise UserError(f"{where} is not one of {', '.join(map(str, action.choices))}")
    return typed


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
        raise UserError(f"--max-steps {max_steps}: give a positive number of optimizer steps, or leave it unset "
                        "(-1, the default) to train for --num-train-epochs")
    epochs = getattr(args, "num_train_epochs", 1.0)
    if max_steps == -1 and not 0 < epochs < math.inf:  # also NaN
        raise UserError(f"--num-train-epochs {epochs}: give a positive number of epochs (or --max-steps N)")
    _check_positive(args, "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    for kind in ("save", "logging"):  # 0 with the "steps" strategy: never saves (a killed run loses everything)
        steps = getattr(args, f"{kind}_steps", 1)
        if getattr(args, f"{kind}_strategy", "steps") == "steps" and not steps > 0:
            raise UserError(f"--{kind}-steps {steps:g}: give a positive number of optimizer steps (or a fraction of "
                            "the run below 1)")
    limit = getattr(args, "save_total_limit", None)
    if limit is not None and limit < 1:  # transformers keeps every checkpoint then, which nobody asking for 0 means
        raise UserError(f"--save-total-limit {limit}: give the number of newest checkpoints to keep, at least 1, or "
                        "leave it unset to keep all (--save-strategy no saves none)")
    for name, bound, fix in _RANGES:  # 0 <= value < bound; a NaN fails every comparison
        value = getattr(args, name, None)
        if value is not None and not 0 <= value < bound:
            raise UserError(f"--{name.replace('_', '-')} {value}: give {fix}")
    _check_bf16(args)
    _check_fp16(args)
    _check_cpu_launch(args)
    _check_unused_trainer_options(args)


def _check_unused_trainer_options(args: Any) -> None:
    """Refuse the Trainer options that our runs would ignore (label smoothing: every method and fine-tuning loss is
    our own) or that bypass our own step (an upload from inside the Trainer skips `publish`'s checks)."""
    smoothing = getattr(args, "label_smoothing_factor", 0.0)
    if smoothing:
        raise UserError(f"--label-smoothing-factor {smoothing}: retromae's losses (the methods' and fine-tuning's) "
                        "do not smooth labels, so the flag would be ignored; drop it")
    if getattr(args, "push_to_hub", False):
        raise UserError("--push-to-hub: retromae does not upload from inside training; when the run has finished, "
                        "upload its result with `retromae publish --folder FOLDER --repo-id OWNER/NAME`, which checks "
                        "it first")


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


def _check_positive(args: Any, *names: str) -> None:
    """Refuse a value below 1 of each named integer option (unset ones pass), naming the flag."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} {value}: give a positive integer")


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
    raise UserError(f"{flag} true needs a GPU with bf16 support and this machine has none; drop {flag} (or add "
                    "--use-cpu true to train in bf16 on the CPU, where torch supports it), or use --fp16 true on a GPU "
                    "without bf16")


def _check_cpu_launch(args: Any) -> None:
    """Refuse a torchrun launch of several processes on a machine without a GPU unless --use-cpu: the Trainer would
    not join the process group, and each process would train alone into the same folder."""
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if processes > 1 and not getattr(args, "use_cpu", True) and not torch.accelerator.is_available():
        raise UserError(f"this run was started with {processes} processes (torchrun) on a machine without a GPU; add "
                        "--use-cpu true to train them as one DDP run on the CPU (gloo)")


def _check_fp16(args: Any) -> None:
    """Refuse --fp16 / --fp16-full-eval on the CPU (no accelerator, or --use-cpu): the Trainer would run fp32 there
    without a word."""
    flags = [name for name in ("fp16", "fp16_full_eval") if getattr(args, name, False)]
    if not flags or (not getattr(args, "use_cpu", False) and (torch.accelerator.is_available()
                                                                or is_torch_xla_available())):
        return
    flag = "--" + flags[0].replace("_", "-")
    raise UserError(f"{flag} true needs a GPU: on the CPU the Trainer would train in fp32 without saying so; pass "
                    f"{flag} false (a preset may set it), or --bf16 true --use-cpu true for mixed precision on the CPU")


def start_command(argv: list[str], arguments, *, prog: str, description: str | None, positional: Sequence[str] = (),
                  positive: Sequence[str] = ()):
    """A command's options, with logging set up: `arguments` (a dataclass or a tuple of them) parsed from argv with
    `parse`; the leading positional values fill the fields named in `positional` (`retromae export CHECKPOINT
    OUTPUT_DIR`); the flags of options renamed since (a class's `legacy_keys`, old field name -> new, as a config's)
    are read under their new names with a deprecation warning; the options named in `positive` must be integers >= 1. The log level is the
    TrainingArguments' process level where the command has them, else INFO."""
    parser = CommandParser(arguments, prog=prog, description=description, formatter_class=DefaultsHelpFormatter)
    classes = arguments if isinstance(arguments, tuple) else (arguments,)
    legacy_keys = {old: new for cls in classes for old, new in getattr(cls, "legacy_keys", {}).items()}
    argv = rename_legacy_flags(positional_to_flags(argv, list(positional)), legacy_keys, prog)
    parsed = parse(parser, argv)
    for options in parsed:
        _check_positive(options, *(name for name in positive if hasattr(options, name)))
    levels = [a.get_process_log_level() for a in parsed if isinstance(a, transformers.TrainingArguments)]
    configure_logging(levels[0] if levels else logging.INFO)
    return parsed


def rename_legacy_flags(argv: list[str], renamed: Mapping[str, str], prog: str) -> list[str]:
    """argv with every flag of a renamed option (`--old-name`, `--old_name`, `--old-name=value`) under its new name,
    each with a deprecation warning."""
    converted = []
    for arg in argv:
        flag, equals, value = arg.partition("=")
        old = flag[2:].replace("-", "_") if flag.startswith("--") else None
        if old in renamed:
            new = "--" + renamed[old].replace("_", "-")
            logger.warning("%s: %s is deprecated; read as %s. Use %s.", prog, flag, new, new)
            arg = new + equals + value
        converted.append(arg)
    return converted


def positional_to_flags(argv: list[str], names: list[str]) -> list[str]:
    """`cmd A B --x` -> `cmd --name1 A --name2 B --x` for the leading positional values."""
    converted, rest = [], list(argv)
    for name in names:
        if rest and not rest[0].startswith("-"):
            converted += [f"--{name}", rest.pop(0)]
    return converted + rest


__all__ = [
    "LIST_FLAG", "TEXT_OPTIONS", "CollectValues", "DashValueError", "check_training_arguments", "configure_logging",
    "expand_home", "parse", "rename_legacy_flags", "start_command", "positional_to_flags", "reject_repeated_flags"
]
