"""What the command line prints as one line: a `UserError` (the input layer's and the drivers' refusals), and a
`ValueError` or `TypeError` that the package's own code raised (the libraries' refusals, which state the problem
and the fix). The same exceptions raised inside another library, and any other exception, are bugs and keep their
traceback.
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


_TRAINERS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWN_CODE = (_TRAINERS + os.sep, os.path.join(os.path.dirname(_TRAINERS), "modeling") + os.sep)  # trainers/, modeling/


class UserError(ValueError):
    """A problem with the user's input; the message names the file, line, field or flag and the fix."""


def is_refusal(error: BaseException) -> bool:
    """True for a `UserError`, a config field's validator (wrapped in `StrictDataclassError`), or a `ValueError` /
    `TypeError` whose innermost frame is the package's own code (a library of ours refusing its input)."""
    if isinstance(error, (UserError, StrictDataclassError)):
        return True
    if not isinstance(error, (ValueError, TypeError)) or error.__traceback__ is None:
        return False
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return os.path.abspath(frame.tb_frame.f_code.co_filename).startswith(OWN_CODE)


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


__all__ = ["NOT_WRITABLE", "UserError", "is_refusal", "one_line_message", "yaml_error_message"]
