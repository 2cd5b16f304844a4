"""One writer per output folder: `folder_lock(folder)` holds `folder/.retromae.lock` while a run writes there.

The lock file is created exclusively (`O_EXCL`) and holds JSON: the holder's `pid`, `host` and `started` (UTC). A second
run finds it and refuses in one line naming the holder. A lock whose holder died without releasing it (SIGKILL, power
loss) is stale when its host is this machine and its pid no longer runs: it is taken over with a warning. A lock
written on another machine cannot be checked and is never taken over. The lock is released on exit, exceptions
included. A run that may write nothing (`required=False`) reads a folder it cannot lock (read-only, or not its
user's) without the lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..inputs.errors import NOT_WRITABLE
from ..inputs.outputs import process_alive

logger = logging.getLogger(__name__)

LOCK_NAME = ".retromae.lock"


@contextmanager
def folder_lock(folder: str | os.PathLike, *, enabled: bool = True, required: bool = True) -> Iterator[Path | None]:
    """Hold `folder`'s lock (creating `folder` if needed) while the block runs.

    Args:
        folder: the folder one run at a time may write.
        enabled: False on processes that do not write it (DDP ranks other than the main one): nothing is locked.
        required: False for a run that may write nothing (a finished run resumed): where the lock cannot be
            created because the folder cannot be written, the block runs without it.

    Yields:
        The lock file, or None when not `enabled` (or not `required` and not writable).

    Raises:
        ValueError: another run holds the lock; the message names the lock file, the holder and what to do.
    """
    if not enabled:
        yield None
        return
    folder = Path(folder)
    created = not folder.exists()
    lock = folder / LOCK_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        mine = _acquire(lock)
    except OSError as error:
        if required or error.errno not in NOT_WRITABLE:
            raise
        logger.info("%s cannot be written (%s): read without its lock", folder, error.strerror)
        mine = None
    if mine is None:
        yield None
        return
    try:
        yield lock
    finally:
        if _read(lock) == mine:  # never remove a lock that is not ours
            lock.unlink(missing_ok=True)
        if created:
            _remove_if_empty(folder)  # a run refused before writing anything leaves no folder behind


def _acquire(lock: Path) -> dict[str, Any]:
    """Create `lock` with our record, taking over a stale one; returns our record."""
    mine = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(lock)
            if not _is_stale(holder):
                raise ValueError(_refusal(lock, holder)) from None
            logger.warning("Taking over %s: the run that held it (pid %s on %s, started %s) is no longer running",
                           lock, holder["pid"], holder["host"], holder.get("started", "?"))
            _break(lock, holder)
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(mine, file)
        return mine


def _read(lock: Path) -> dict[str, Any]:
    """The lock's record; empty when it is gone or unreadable (e.g. its holder is between creating and writing it)."""
    try:
        record = json.loads(lock.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_stale(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    return holder.get("host") == socket.gethostname() and isinstance(pid, int) and not process_alive(pid)


def _break(lock: Path, holder: dict[str, Any]) -> None:
    """Remove the stale `lock` of `holder`. Moved aside first: of several runs breaking it at once only one moves it,
    and one that moved a fresh lock instead (another run took over in between) puts it back."""
    aside = lock.with_name(f"{lock.name}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return  # another run broke it first
    if _read(aside) != holder:  # a live run took the lock in between: give it back
        with suppress(FileExistsError):  # unless yet another run holds it by now
            os.link(aside, lock)
    aside.unlink()


def _refusal(lock: Path, holder: dict[str, Any]) -> str:
    if not holder:
        who = "another run (its lock file is unreadable)"
    else:
        who = f"another run (pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started', '?')})"
    return (f"{lock.parent} is being written by {who}; wait for that run to end or write to another folder. If no "
            f"such run is alive (e.g. it ran on another machine and was killed), delete {lock}")


def _remove_if_empty(folder: Path) -> None:
    with suppress(OSError):  # not empty: the run wrote something, or another run holds it now
        folder.rmdir()


__all__ = ["LOCK_NAME", "folder_lock"]
