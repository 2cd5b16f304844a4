"""`UserError`: a problem with the user's input (a file, a flag, a folder) that the user can fix.

Every input error of the package subclasses it; the command line prints its message as one line and exits with
status 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import os

import yaml
from huggingface_hub.errors import StrictDataclassError

# what writing in a folder that may not be written raises (read-only file system, no permission), as a line names it
NOT_WRITABLE = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}


class UserError(ValueError):
    """A problem with the user's input; the message names the file, line, field or flag and the fix."""


def one_line_message(error: BaseException) -> str:
    """The line that names the problem; for a config field's validator wrapped in huggingface_hub's
    `StrictDataclassError`, the validator's own message."""
    while isinstance(error, StrictDataclassError) and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    return text.splitlines()[-1].strip() if text else type(error).__name__


def yaml_error_message(path: str | os.PathLike, error: yaml.YAMLError, *, first_line: int = 1) -> str:
    """One line naming the file, the line and column, and the parser's reason, e.g.
    `README.md:4:5: not valid YAML: expected ',' or ']', but got ':' (in a flow sequence started on line 3)`.

    Args:
        path: the file, as the user should read it.
        error: what `yaml.safe_load` raised.
        first_line: the file's line where the parsed text starts (2 for a model card's front matter after `---`).
    """
    problem, context = getattr(error, "problem", None), getattr(error, "context", None)
    mark, context_mark = getattr(error, "problem_mark", None), getattr(error, "context_mark", None)
    mark = mark or context_mark
    where = f"{os.fspath(path)}:{first_line + mark.line}:{mark.column + 1}" if mark else os.fspath(path)
    if not problem:  # the first line of the error's own text (its str() ends in a "^" pointer line)
        return f"{where}: not valid YAML: {(str(error).strip() or type(error).__name__).splitlines()[0]}"
    if context and context_mark is not None and context_mark.line != mark.line:  # e.g. an unclosed bracket
        construct = context.split(" ", 2)[-1] if context.startswith("while ") else context  # "while parsing a ..."
        problem += f" (in {construct} started on line {first_line + context_mark.line})"
    return f"{where}: not valid YAML: {problem}"


__all__ = ["NOT_WRITABLE", "UserError", "one_line_message", "yaml_error_message"]
