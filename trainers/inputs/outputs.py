"""Output targets: whether a command may write a file or folder (the owned-output policy), and atomic folder swaps.

* `claim_output`: the one owned-output policy, applied before anything is written; `check_folder_option` for
  a folder option's shape alone.
* `atomic_folder(target, overwrite=...)`: build a folder in a hidden temporary sibling and rename it into place only
  when complete, so a reader never sees half a folder. A previous `target` is swapped out and removed only after the
  new one is in place. Its files get the modes the umask gives (safetensors' `save_file` ignores it).
* `clean_stale_siblings(target)`: remove (or restore) what a killed `atomic_folder` left beside `target`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

from .errors import UserError
from .folders import COMMAND_INPUTS, is_trainer_checkpoint

logger = logging.getLogger(__name__)

# `.<name>.tmp-<pid>-<hex>` (a build in progress) and `.<name>.old-<pid>-<hex>` (the previous folder during a swap)
_SIBLING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)-[0-9a-f]{8}$")


def check_folder_option(flag: str, path: str | os.PathLike, *, writable: bool = True) -> None:
    """Refuse a folder option that names a file or a path under one, passes through a symbolic link loop, or (with
    `writable`) lies in a folder that cannot be written: writing there would fail mid-run, or after hours of work."""
    _check_folder(flag, path, Path(path), writable)


def _check_folder(flag: str, path: str | os.PathLike, folder: Path, writable: bool) -> None:
    """`check_folder_option` for `folder`, where the option's value is `path` (`folder` itself, a file written in
    it, or a folder built in it and renamed to `path`): the message names the option as the user wrote it."""
    absolute = folder.absolute()
    for part in (absolute, *absolute.parents):
        if part.exists():
            break
        _refuse_symlink_loop(flag, path, part)
    existing = part
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder; choose a folder")
    # os.access, not a test write: it refuses a read-only file system even to root, and leaves nothing behind
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        read_only = hasattr(os, "statvfs") and os.statvfs(existing).f_flag & os.ST_RDONLY
        why = "a read-only file system" if read_only else "no write permission"
        raise UserError(f"{flag} {path}: {existing} cannot be written ({why}); make it writable, or choose "
                        "another folder")


def _refuse_symlink_loop(flag: str, path: str | os.PathLike, part: Path) -> None:
    """Refuse `part` of the option's `path` when it is a symbolic link that leads back to itself: every later
    step (`resolve`, `mkdir`) would fail on it with a traceback."""
    if not part.is_symlink():
        return
    try:
        os.stat(part)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UserError(f"{flag} {path}: {part} is a symbolic link that leads back to itself (a loop); remove "
                            "it, or choose another folder") from None


def would_delete(target: Path, protected: Mapping[str, str | os.PathLike | None], *, existing_only: bool = True
                 ) -> tuple[str, Path] | None:
    """The first `(description, path)` of `protected` (existing paths only, unless not `existing_only`; None values
    skipped) that replacing `target` would delete, because `target` is it or a folder above it; None when none is."""
    resolved = target.resolve()
    for what, path in protected.items():
        if not path or (existing_only and not Path(path).exists()):  # "" would be the working directory
            continue
        held = Path(path).resolve()
        if resolved == held or resolved in held.parents:
            return what, Path(path)
    return None


# What an existing, non-empty output target holds, as an `owner` function judges it: None when this command wrote
# it for the same subject (written again freely); else (whose it is, kept), where `kept` means no flag replaces it.
Holding = tuple[str, bool] | None
Inputs = Mapping[str, str | os.PathLike | None]


def holds_one_of(*names: str, kind: str) -> Callable[[Path], Holding]:
    """`claim_output`'s owner of a folder a command replaces whole: the overwrite flag replaces a folder holding one
    of the files `names` (what such a folder of `kind` holds), never a folder of other files."""
    def holding(folder: Path) -> Holding:
        if any((folder / name).is_file() for name in names):
            return "", False  # refused without the overwrite flag, as any non-empty folder
        return f"no {kind} (no {' or '.join(names)})", True
    return holding


model_holding = holds_one_of("modules.json", "config.json", kind="model")


def claim_output(target: Path, flag: str, overwrite: bool, *, kind: Literal["folder", "into", "file"] = "folder",
                 inputs: Inputs | None = None, planned: Inputs | None = None,
                 owner: Callable[[Path], Holding] | None = None,
                 overwrite_flag: str = "--overwrite", fix: str = "choose another folder") -> None:
    """The one owned-output policy: may the command write `target`, named by the option `flag`? `kind`: a folder it
    replaces whole ("folder"), a folder it writes files into ("into"), or a file. Refused in one line:

    - whatever `overwrite` says: a target of the other kind, one under a file or through a symbolic-link loop, or in
      a folder that cannot be written; one that replacing would delete or change: the working directory, a file or
      folder the command reads (`inputs` and the `--config` file), a training checkpoint, a path the command is
      about to create (`planned`, which need not exist yet); the line ends with `fix`;
    - an existing, non-empty target that `owner` does not call this command's own (without `owner`: any): without
      `overwrite`, or always when `owner` says no flag replaces it.
    """
    if kind == "file":
        _check_file_target(target, flag, {**COMMAND_INPUTS.get(), **(inputs or {})})
    else:
        hit = _check_folder_target(target, flag, kind, {**COMMAND_INPUTS.get(), **(inputs or {})}, planned or {})
        if hit is not None:
            raise UserError(f"{flag} {target}: replacing it would delete {hit[0]} ({hit[1]}), even with "
                            f"{overwrite_flag}; {fix}")
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        return
    holding = owner(target) if owner is not None else ("", False)
    if holding is None:
        return
    whose, kept = holding
    held = f"holds {whose}" if whose else ("already exists" if kind == "file" else "already exists and is not empty")
    if kept:
        raise UserError(f"{flag} {target} {held}, which {overwrite_flag} does not replace; choose a new or empty "
                        "folder")
    if not overwrite:
        python = " (Python: overwrite=True)" if overwrite_flag == "--overwrite" else ""
        raise UserError(f"{flag} {target} {held}; choose another {flag}, or pass {overwrite_flag}{python} to "
                        "replace it")


def _check_folder_target(target: Path, flag: str, kind: str, protected: Inputs, planned: Inputs
                         ) -> tuple[str, Path] | None:
    """Refuse a folder target of the wrong shape; return what replacing it would delete, if anything."""
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {target} is a file; choose a folder")
    check_folder_option(flag, target)  # a file above it, a loop, a folder that cannot be written
    if kind == "into":  # nothing is deleted, but what lands inside an input folder changes it (e.g. a model's)
        hit = _inside_input(target, protected)
        if hit is not None:
            raise UserError(f"{flag} {target}: writing into it would change {hit[0]} ({hit[1]}); choose a folder "
                            "outside it")
        return None
    if target.exists():  # the new folder is built beside it and renamed into place
        _check_folder(flag, target, target.parent, writable=True)
    held = next((p for p in sorted(target.glob("checkpoint-*")) if is_trainer_checkpoint(p)), None)
    return (would_delete(target, {"the working directory": Path.cwd()})
            or would_delete(target, planned, existing_only=False) or would_delete(target, protected)
            or ((f"the training checkpoint {held.name}", held) if held is not None else None))


def _check_file_target(target: Path, flag: str, protected: Inputs) -> None:
    if target.is_dir():
        raise UserError(f"{flag} {target} is a folder; give a file path")
    _refuse_symlink_loop(flag, target, target.absolute())
    _check_folder(flag, target, target.parent, writable=True)  # written beside it first (`inputs.io.atomic_file`)
    hit = would_delete(target, protected) or _inside_input(target, protected)
    if hit is not None:
        raise UserError(f"{flag} {target}: writing it would change {hit[0]} ({hit[1]}); choose a file outside it")


def _inside_input(target: Path, protected: Inputs) -> tuple[str, Path] | None:
    """The first `(description, path)` of the existing folders of `protected` that `target` is or lies in."""
    resolved = target.resolve()
    return next(((what, Path(path)) for what, path in protected.items()
                 if path and Path(path).is_dir() and (Path(path).resolve() == resolved
                                                      or Path(path).resolve() in resolved.parents)), None)


@contextmanager
def atomic_folder(target: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary sibling of `target` to fill; on success it is renamed to `target`.

    On an exception (or a kill, see `clean_stale_siblings`) `target` is untouched. With `overwrite`, a previous
    non-empty `target` is renamed aside, replaced, and deleted only after the new folder is in place.
    """
    target = Path(target)
    clean_stale_siblings(target)  # first: it may restore a previous `target` that a killed swap left aside
    claim_output(target, "output folder", overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    build_dir = _sibling(target, "tmp")
    build_dir.mkdir()  # honours the umask (tempfile.mkdtemp would make it 0700)
    try:
        yield build_dir
        _give_umask_modes(build_dir)
        _move_into_place(build_dir, target, overwrite)
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise


def _give_umask_modes(folder: Path) -> None:
    """Give each regular file under `folder` the mode a plain `open` gives under the umask (0o666 without it;
    executables keep their x bits): safetensors' `save_file` makes 0600 files whatever the umask (model.safetensors,
    collator_rng_*.safetensors), and a copied file keeps its source's mode."""
    umask = _current_umask()
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            wanted = (0o777 if mode & 0o111 else 0o666) & ~umask
            if stat.S_ISREG(mode) and stat.S_IMODE(mode) != wanted:
                with suppress(OSError):  # a file system without Unix modes (a mounted bucket, SMB): a nicety lost
                    os.chmod(path, wanted)


def _current_umask() -> int:
    """The process's umask. Reading it means setting it: 0o077 meanwhile, so a file another thread creates in that
    moment is private rather than world-writable (as with 0)."""
    umask = os.umask(0o077)
    os.umask(umask)
    return umask


def _move_into_place(build_dir: Path, target: Path, overwrite: bool) -> None:
    claim_output(target, "output folder", overwrite)  # again: something may have appeared while we were building
    if not target.exists() or not any(target.iterdir()):
        os.replace(build_dir, target)  # replaces an empty folder too
        return
    old = _sibling(target, "old")
    os.replace(target, old)
    try:
        os.replace(build_dir, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _sibling(target: Path, kind: str) -> Path:
    """A fresh hidden name beside `target` that records our pid, e.g. `.export.tmp-4242-1a2b3c4d`."""
    while True:
        candidate = target.parent / f".{target.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if not candidate.exists():
            return candidate


def clean_stale_siblings(target: str | os.PathLike) -> list[Path]:
    """Remove the temporary siblings of `target` that a killed `atomic_folder` left; returns what was handled.

    A `.tmp-` build of a dead process is deleted. An `.old-` folder (the previous `target`, moved aside during a swap)
    is deleted when `target` exists and renamed back to `target` when the kill came between the two renames.
    Siblings of a live process (another export writing the same folder right now) are left alone.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return []
    handled = []
    for entry in sorted(target.parent.iterdir()):
        match = _SIBLING.match(entry.name)
        if not match or match["name"] != target.name or not entry.is_dir() or process_alive(int(match["pid"])):
            continue
        if match["kind"] == "old" and not target.exists():
            os.replace(entry, target)
            logger.warning("restored %s from %s, left by a killed save", target, entry.name)
        else:
            shutil.rmtree(entry, ignore_errors=True)
            logger.info("removed %s, left by a killed save", entry)
        handled.append(entry)
    return handled


def sibling_target_name(name: str) -> str | None:
    """The folder an `atomic_folder` sibling stands for (`.checkpoint-6.tmp-4242-1a2b3c4d` -> `checkpoint-6`)."""
    match = _SIBLING.match(name)
    return match["name"] if match else None


def process_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (ours counts; another user's too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


__all__ = [
    "atomic_folder", "claim_output", "check_folder_option", "clean_stale_siblings", "sibling_target_name",
    "process_alive", "would_delete"
]
