"""Files written atomically and JSONL read with the file and line of every bad record.

A reader never sees half a file: `atomic_file` writes a hidden sibling and renames it into place only when
complete, so a kill leaves the previous file (or none), never a truncated one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import UserError

JSON_TYPE_NAMES = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object",
                   type(None): "null"}


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a hidden sibling of `path` for writing; on success it replaces `path`, on an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, payload: Any) -> None:
    with atomic_file(path) as handle:
        handle.write(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_file(path) as handle:
        handle.write(text)


def read_json_or_empty(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object file's content, or {} when the file is missing or unreadable (optional run records)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (`123` -> `"number"`)."""
    return JSON_TYPE_NAMES.get(type(value), type(value).__name__)


def iter_jsonl(path: str | os.PathLike, *, error: type[UserError] = UserError,
               example: str = '{"text": "..."}') -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a JSONL file, each with its place `file:line`; blank lines are skipped.

    Raises `error` (a `UserError`) naming the file and 1-based line for a line that is not UTF-8, not JSON or not a
    JSON object; `example` shows the expected shape of a line in the message.
    """
    with open(path, "rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8")  # a BOM (Windows editors) is no text
            except UnicodeDecodeError:
                raise error(f"{where}: not UTF-8 text; save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))  # with the newline, a truncated line fails at "column 1"
            except json.JSONDecodeError as exc:
                raise error(
                    f"{where}: not valid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno}); write one JSON "
                    f"object per line, e.g. {example}"
                ) from None
            except RecursionError:  # the parser recurses per nesting level
                raise error(f"{where}: JSON nested too deeply to read; write one flat JSON object per line, "
                            f"e.g. {example}") from None
            if not isinstance(record, dict):
                raise error(f"{where}: expected a JSON object, found a JSON {json_type(record)}; write one object per "
                            f"line, e.g. {example}")
            yield where, record


def file_sha256(path: Path) -> str:
    """The sha256 hex digest of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


__all__ = ["atomic_file", "file_sha256", "iter_jsonl", "json_type", "read_json_or_empty", "write_json_atomic",
           "write_text_atomic"]
