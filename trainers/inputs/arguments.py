"""Command-line parsing shared by every command: dataclass options, positional values, list and repeated flags.

* `parse(parser, argv)`: argv into the parser's dataclasses, over the defaults of a `--config` file (read by
  `config_files`); a flag given twice is refused (`reject_repeated_flags`: argparse would keep only the last value).
* A list field takes `metadata=LIST_FLAG`: `--model A --model B` and `--model A B` both give `["A", "B"]`.
* `start_command(argv, arguments, ...)`: a command's options parsed and its logging set up (`configure_logging`).
* `parse` checks the options of every parser with a `TrainingArguments` (`training_checks.check_training_arguments`).
* `expand_home(values)`: `~` in every path value expanded, as a shell would (`CommandParser` applies it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import transformers
from transformers import HfArgumentParser, TrainingArguments
from transformers.hf_argparser import string_to_bool

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
from .parameters import SEVERAL_FILES
from .training_checks import check_positive, check_training_arguments

logger = logging.getLogger(__name__)


# options whose values are text, never paths: a leading `~` there is the user's text
TEXT_OPTIONS = frozenset({"query", "commit_message", "model_name", "base_model_name", "corpus_name", "run_name",
                          "project", "prompts"})
HOME_PREFIX = re.compile(r"^~[\w.-]*(?=[/\\]|$)")  # `~`, `~/x`, `~user/x`: what a shell expands
OPTIONAL_PACKAGES = ("deepspeed",)  # TrainingArguments options that import a package of that name
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # what argparse reads as a value, not an option
# `_argv_parts`' stand-ins: an option the parser does not know (it takes no value), and `--config FILE`, which
# `parse` adds to the parser later
UNKNOWN_OPTION = argparse.Action([], "unknown", nargs=0)
CONFIG_OPTION = argparse.Action(["--config"], "config")
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
    """The refusal of what argparse left over: the unknown options, else a value that follows a one-value flag's value
    (`--corpus a.jsonl b.txt`, `--corpus=a.jsonl b.txt`), named as one the flag does not take."""
    owner = _option_owners(parser)
    options = [token for token in unknown if not _is_value(token)]
    stray = None if options else next((token for token in unknown if not token.startswith("-")), None)
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


def start_command(argv: list[str], arguments, *, prog: str, description: str | None, positional: Sequence[str] = (),
                  positive: Sequence[str] = ()):
    """A command's options, with logging set up: `arguments` (a dataclass or a tuple of them) parsed from argv with
    `parse`; the values no option takes fill the fields named in `positional` (`positional_to_flags`); the flags of
    options renamed since (a class's `legacy_keys`, old field name -> new) are read under their new names with a
    deprecation warning; the options named in `positive` must be integers >= 1. The log level is the
    TrainingArguments' process level where the command has them, else INFO."""
    parser = CommandParser(arguments, prog=prog, description=description, formatter_class=DefaultsHelpFormatter)
    classes = arguments if isinstance(arguments, tuple) else (arguments,)
    legacy_keys = {old: new for cls in classes for old, new in getattr(cls, "legacy_keys", {}).items()}
    argv = rename_legacy_flags(positional_to_flags(argv, list(positional), parser), legacy_keys, prog)
    parsed = parse(parser, argv)
    for options in parsed:
        check_positive(options, *(name for name in positive if hasattr(options, name)))
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


def positional_to_flags(argv: list[str], names: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """`cmd A --x 1 B` -> `cmd --name1=A --x 1 --name2=B`: the values no option of `parser` takes fill the fields
    `names` in order, before or after options, and every value after `--`. A list option (`--beir-folder a b MODEL`)
    leaves its last values to the names no flag sets that the values after it do not fill. Values past the last
    name stay as they are, for argparse to refuse."""
    parts = _argv_parts(argv, _option_owners(parser))
    given = {option.dest: option for option, _ in parts if option is not None}  # the options argv sets by flag
    free, converted = list(names), []
    for index, (option, tokens) in enumerate(parts):
        if option is not None and _takes_many(option) and len(tokens) > 1:
            later = sum(1 for other, _ in parts[index + 1 :] if other is None)
            wanted = sum(1 for name in free if name not in given) - later
            keep = max(len(tokens) - 1 - max(wanted, 0), 1 if option.nargs == "+" else 0)
            converted += tokens[: 1 + keep]
            tokens = tokens[1 + keep :]
        elif option is not None:
            converted += tokens
            continue
        for value in tokens:
            if free and free[0] in given:
                raise UserError(f"{flag_name(given[free[0]])} is given twice: by its flag and as the value {value}; "
                                "give it once")
            converted.append(f"--{free.pop(0)}={value}" if free else value)
    return converted


def _argv_parts(argv: list[str], owner: Mapping[str, argparse.Action]) -> list[tuple[argparse.Action | None, list[str]]]:
    """argv cut into options with the values argparse gives them (`(action, [flag, *values])`; `UNKNOWN_OPTION`, which
    takes none, for an option the parser does not know) and free values (`(None, [value])`); every token after `--`
    is a free value."""
    parts, at = [], 0
    while at < len(argv):
        arg = argv[at]
        at += 1
        if arg == "--":
            return parts + [(None, [value]) for value in argv[at:]]
        if _is_value(arg):
            parts.append((None, [arg]))
            continue
        flag, equals, _ = arg.partition("=")
        action = _option_action(owner, flag) or (CONFIG_OPTION if flag == "--config" else UNKNOWN_OPTION)
        taken = 0 if equals else _values_taken(action, argv[at:])
        parts.append((action, argv[at - 1 : at + taken]))
        at += taken
    return parts


def _values_taken(action: argparse.Action, following: list[str]) -> int:
    """How many of `following` argparse gives `action` as its values: a yes/no option (`--overwrite`) takes the next
    value only when it is one (`--overwrite true`); a negative number is a value."""
    values = list(itertools.takewhile(_is_value, following))
    if action.nargs in ("+", "*"):
        return len(values)
    if action.nargs == "?":
        return int(bool(values) and (action.type is not string_to_bool or _is_bool_word(values[0])))
    return len(values[: 1 if action.nargs is None else action.nargs])


def _is_value(arg: str) -> bool:
    """Whether argparse reads `arg` as a value rather than an option: no leading dash, or a negative number."""
    return not arg.startswith("-") or bool(NEGATIVE_NUMBER.match(arg))


def _is_bool_word(value: str) -> bool:
    try:
        string_to_bool(value)
    except argparse.ArgumentTypeError:
        return False
    return True


__all__ = [
    "LIST_FLAG", "TEXT_OPTIONS", "CollectValues", "DashValueError", "configure_logging",
    "expand_home", "parse", "rename_legacy_flags", "start_command", "positional_to_flags", "reject_repeated_flags"
]
