"""Repeated command-line flags: list flags collect every value, a repeated single-value flag is refused.

argparse keeps only the last value of a repeated flag, so `coverage --model A --model B` silently measured B alone.

* A list field of a command's dataclass takes `metadata=LIST_FLAG`: `--model A --model B` and `--model A B` both give
  `["A", "B"]`; the first use on the command line replaces the default (or the `--config` file's list).
* `reject_repeated_flags(parser, argv)` refuses any other flag given twice, naming it (`cli._parse` calls it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Sequence
from typing import Any


class RepeatedFlagError(ValueError):
    """A single-value flag was given more than once."""


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


def _takes_many(action: argparse.Action) -> bool:
    return action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction | argparse._ExtendAction)


def reject_repeated_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Raise `RepeatedFlagError` naming the first single-value flag that `argv` gives more than once.

    Flags are counted per option (`--output-dir` and `--output_dir` are one), in `--flag value` and `--flag=value`
    form and as unambiguous abbreviations, up to a bare `--`.
    """
    owner = {option: action for action in parser._actions for option in action.option_strings}
    counts: Counter[argparse.Action] = Counter()
    for token in argv:
        if token == "--":
            break
        if not token.startswith("-") or token == "-":
            continue
        name = token.split("=", 1)[0]
        matches = [owner[name]] if name in owner else list(
            {id(a): a for option, a in owner.items() if name.startswith("--") and option.startswith(name)}.values()
        )
        if len(matches) == 1:
            counts[matches[0]] += 1
    for action, count in counts.items():
        if count > 1 and not _takes_many(action) and not isinstance(action, argparse._HelpAction):
            flag = max(action.option_strings, key=lambda o: ("-" in o[2:], len(o)))
            raise RepeatedFlagError(f"{flag} is given {count} times; give it once (only the last value would count)")


__all__ = ["LIST_FLAG", "CollectValues", "RepeatedFlagError", "reject_repeated_flags"]
