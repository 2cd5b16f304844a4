"""The files of a corpus folder: the walk below it (through links to folders), the notes beside the data that are
skipped (README, LICENSE), and identical copies, which would be read twice."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

from ..inputs.io import file_sha256

# What a dataset download or a repository keeps beside its data (a Hub dataset always has a README.md): never passages.
NOTE_FILE = re.compile(r"(readme|licen[cs]e|copying|citation)(\..*)?|.*\.md|dataset_infos\.json",
                       re.IGNORECASE)


def files_below(folder: Path) -> list[Path]:
    """The files below ``folder`` (hidden ones and those in hidden folders left out), in sorted path order, through
    symbolic links to folders too: ``Path.rglob`` does not enter those, and their passages were left out silently.

    Raises:
        ValueError: a link to a folder that holds it (walking on would never end), or to a folder reached already
            (its files would be read twice); the message names the link.
    """
    found: list[Path] = []
    reached: dict[str, Path] = {}  # real path -> the path it was first reached by
    for root, subfolders, names in os.walk(folder, followlinks=True):
        here = Path(root)
        real = os.path.realpath(here)
        if real in reached:
            raise ValueError(f"directory {str(folder)!r}: {relative(here, folder)} and "
                             f"{relative(reached[real], folder)} are the same folder through a symbolic link, so "
                             "its files would be read twice; remove the link")
        reached[real] = here
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        for link in (here / name for name in subfolders if (here / name).is_symlink()):
            target = Path(os.path.realpath(link))
            if Path(real).is_relative_to(target):
                raise ValueError(f"directory {str(folder)!r}: {relative(link, folder)} is a symbolic link to "
                                 f"{target}, a folder that holds it (a loop); remove the link")
        found += [here / name for name in names if not name.startswith(".") and (here / name).is_file()]
    return sorted(found)


def relative(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def some_names(paths: list[Path], folder: Path, shown: int = 5) -> str:
    """The first ``shown`` paths relative to ``folder``, and how many more."""
    names = ", ".join(relative(p, folder) for p in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def is_note_file(path: Path) -> bool:
    """A README, LICENSE, ``.md`` or the like (``NOTE_FILE``): skipped in a corpus folder, also as ``README.txt``."""
    return NOTE_FILE.fullmatch(path.name) is not None


def identical_files(files: list[Path]) -> list[list[Path]]:
    """Groups of files with the same bytes (a copy such as ``part-1 (1).jsonl``): only files of equal size are hashed,
    so a folder of files of different sizes is not read here. Empty files add no passage and are left out."""
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in files:
        by_size[path.stat().st_size].append(path)
    by_hash: dict[str, list[Path]] = defaultdict(list)
    for size, same_size in by_size.items():
        for path in same_size if size and len(same_size) > 1 else ():
            by_hash[file_sha256(path)].append(path)
    return [group for group in by_hash.values() if len(group) > 1]


__all__ = ["files_below", "identical_files", "is_note_file", "relative", "some_names"]
