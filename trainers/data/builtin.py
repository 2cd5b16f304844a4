"""The built-in demo corpus: prose from the Python standard library's docstrings."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
import re
import warnings
from collections.abc import Iterator
from typing import Any

import datasets

BUILTIN_MODULES = (  # noqa: SIM905 (one readable string)
    "abc argparse ast base64 bdb binascii bisect builtins calendar cmd code codecs codeop colorsys compileall "
    "configparser contextlib contextvars copy copyreg csv dataclasses datetime decimal difflib dis doctest enum "
    "filecmp fileinput fnmatch fractions ftplib functools getopt getpass gettext glob graphlib gzip hashlib heapq "
    "hmac imaplib inspect io ipaddress itertools keyword linecache locale lzma mailbox math mimetypes modulefinder "
    "netrc numbers operator optparse os pathlib pdb pickle pickletools pkgutil platform plistlib poplib pprint "
    "profile pstats py_compile pyclbr pydoc queue quopri random re reprlib runpy sched secrets "
    "selectors shelve shlex shutil signal smtplib socket socketserver ssl stat statistics string struct subprocess "
    "symtable sys sysconfig tabnanny tarfile tempfile textwrap threading time timeit token tokenize tomllib trace "
    "traceback tracemalloc types typing unicodedata uuid warnings weakref zipapp zipfile zipimport zlib"
).split()
BUILTIN_PACKAGES = (  # noqa: SIM905 (one readable string)
    "asyncio collections concurrent email html http importlib json logging multiprocessing sqlite3 unittest urllib "
    "wsgiref xml xmlrpc"
).split()
MIN_BUILTIN_CHARS = 150
CODE_CHARS = "()=[]{}<>_*`|\\:"
MAX_CODE_CHAR_SHARE = 0.03  # paragraphs with more of CODE_CHARS than this share of characters look like code


def builtin_corpus() -> datasets.Dataset:
    """A small corpus of real English prose that exists offline on every machine (the default of ``retromae pretrain``).

    Source: the docstrings of Python standard-library modules (``collections``, ``itertools``, ``functools``,
    ``json``, ``re``, ``pathlib``, ``datetime``, ``argparse``, ``logging``, ``unittest``, ``email``, ``http``,
    ``asyncio``, ``typing``, ``decimal``, ``csv``, ``sqlite3``, ``zipfile``, ``subprocess``, ``threading``, ...;
    packages with their submodules), of their public classes and functions and of those classes' public methods,
    followed by the help texts of ``pydoc_data.topics`` (the language reference that ``help()`` shows).

    Each text is split into paragraphs on blank lines, whitespace is collapsed, and a paragraph is kept when it has at
    least 150 characters, is mostly prose (no ``>>>`` prompt, no ``::=`` grammar, and at most 3% of its characters
    among ``()=[]{}<>_*`|\\:``) and was not seen before. The order is deterministic for a given Python version
    (about 2,000 passages on CPython 3.11). Docstrings stripped by ``python -OO`` leave it empty (``ValueError``).

    Returns:
        A ``datasets.Dataset`` with one column ``"text"``.

    Raises:
        ValueError: No passage could be collected (e.g. under ``python -OO``).
    """
    passages = _builtin_passages()
    if not passages:
        raise ValueError(
            "the built-in corpus is empty: standard-library docstrings are unavailable (python -OO?); "
            "pass a corpus file or directory instead"
        )
    return datasets.Dataset.from_dict({"text": list(passages)})


@functools.lru_cache(maxsize=1)
def _builtin_passages() -> tuple[str, ...]:
    """The deduplicated prose paragraphs of the standard library's docstrings and help topics."""
    seen: set[str] = set()
    passages: list[str] = []
    for doc in _stdlib_texts():
        for paragraph in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
            text = " ".join(paragraph.split())
            if len(text) >= MIN_BUILTIN_CHARS and _is_prose(text) and text not in seen:
                seen.add(text)
                passages.append(text)
    return tuple(passages)


def _is_prose(text: str) -> bool:
    """A simple heuristic: no interpreter prompt or grammar rule, and few code characters."""
    if ">>>" in text or "::=" in text or text.count("...") > 1:
        return False
    return sum(text.count(char) for char in CODE_CHARS) <= MAX_CODE_CHAR_SHARE * len(text)


def _stdlib_texts() -> Iterator[str]:
    """Docstrings of the standard-library modules (see ``builtin_corpus``), then ``pydoc_data`` help topics."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated modules and aliases warn on import / attribute access
        for module in _stdlib_modules():
            yield from _module_docstrings(module)
        try:
            from pydoc_data.topics import topics
        except ImportError:
            return
        for key in sorted(topics):
            yield topics[key]


def _stdlib_modules() -> Iterator[Any]:
    """Imports the modules of ``BUILTIN_MODULES`` and ``BUILTIN_PACKAGES`` (with submodules) in sorted order."""
    names = set(BUILTIN_MODULES)
    for package_name in BUILTIN_PACKAGES:
        package = _import_or_none(package_name)
        if package is None:
            continue
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if not _skip_submodule(info.name):
                names.add(info.name)
    for name in sorted(names):
        module = _import_or_none(name)
        if module is not None:
            yield module


def _skip_submodule(name: str) -> bool:
    """Test suites, ``__main__`` scripts and Windows-only modules are not part of the corpus."""
    return any(
        part in ("test", "tests", "__main__") or part.startswith(("test_", "windows_")) or part.endswith("_win32")
        for part in name.split(".")
    )


def _import_or_none(name: str) -> Any:
    """The imported module, or ``None`` when this Python build lacks it."""
    try:
        return importlib.import_module(name)
    except Exception:  # platform-specific or optional modules (ImportError, OSError, ...)
        return None


def _module_docstrings(module: Any) -> Iterator[str]:
    """The module docstring, its own public classes and functions, and their public methods."""
    if isinstance(module.__doc__, str):
        yield module.__doc__
    members = vars(module)
    for name in sorted(members):
        obj = members[name]
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if isinstance(obj.__doc__, str):
            yield obj.__doc__
        if inspect.isclass(obj):
            for attr_name, attr in sorted(vars(obj).items()):
                doc = getattr(attr, "__doc__", None)
                if not attr_name.startswith("_") and _is_method(attr) and isinstance(doc, str):
                    yield doc


def _is_method(attr: Any) -> bool:
    return inspect.isroutine(attr) or isinstance(attr, (classmethod, staticmethod, property))


__all__ = ["builtin_corpus"]
