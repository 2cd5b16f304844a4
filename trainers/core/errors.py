"""`UserError`: a problem with the user's input (a file, a flag, a folder) that the user can fix.

Every input error of the package subclasses it; the command line prints its message as one line and exits with
status 2. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

from huggingface_hub.errors import StrictDataclassError


class UserError(ValueError):
    """A problem with the user's input; the message names the file, line, field or flag and the fix."""


def one_line_message(error: BaseException) -> str:
    """The line that names the problem; for a config field's validator wrapped in huggingface_hub's
    `StrictDataclassError`, the validator's own message."""
    while isinstance(error, StrictDataclassError) and error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    return text.splitlines()[-1].strip() if text else type(error).__name__


__all__ = ["UserError", "one_line_message"]
