"""The processes of one run (torchrun, one or several machines): they must share the run's settings and data, and
must not share their random streams."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

FILES = " files"  # the key of an option's file sizes beside its value


def seed_processes_apart(seed: int, process_index: int) -> None:
    """Seed torch's global generator (the decoder's visibility draws, dropout) with `seed + process_index` on every
    process but the first, which keeps `seed`. Every process was seeded alike so that it builds the same initial
    weights; left so, all would draw the same visibility matrices and dropout masks. A resume restores each
    process's own generator from its checkpoint."""
    if process_index > 0:
        torch.manual_seed(seed + process_index)


def check_processes_agree(settings: dict[str, Any], world_size: int) -> None:
    """Refuse a run whose processes were started with different settings (each machine of a torchrun run parses its
    own command line): a different `--seed` or corpus would train rows twice or other text without a word, a
    different `--max-steps` would hang in a collective. Compared: every option of `settings["settings"]` (a run
    record, `record_settings`) but local paths, recorded absolute, which may differ between machines (a Hub id is
    compared), and the sizes of the files of `settings["text_files"]`, if any. A collective: every process calls
    it, after the process group exists.

    Raises:
        ValueError: naming the first differing option, its value on this process and on the other.
    """
    if world_size <= 1 or not dist.is_available() or not dist.is_initialized():
        return
    mine = _what_processes_share(settings)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine)
    rank = dist.get_rank()
    for other_rank, theirs in enumerate(gathered):
        differing = sorted(name for name in mine.keys() | theirs.keys() if mine.get(name) != theirs.get(name))
        if differing:
            name = differing[0]
            how = ("the sizes of its files differ" if name.endswith(FILES) else
                   f"{mine.get(name)!r} on process {rank}, {theirs.get(name)!r} on process {other_rank}")
            raise ValueError(f"the processes of this run were started with different settings (--"
                             f"{name.removesuffix(FILES).replace('_', '-')}: {how}); start every machine with the "
                             "same command and the same data")


def _what_processes_share(settings: dict[str, Any]) -> dict[str, Any]:
    """Option -> value of a run record without its local paths, plus '<option> files' -> the sizes of that option's
    files."""
    shared = {name: value for name, value in settings["settings"].items()
              if not (isinstance(value, str) and os.path.isabs(value))}
    for name, files in settings.get("text_files", {}).items():
        shared[name + FILES] = {path: size for path, (size, _) in files.items()}
    return shared
