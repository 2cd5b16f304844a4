"""Versions recorded in run records and model cards."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import sentence_transformers
import torch
import transformers


def package_version() -> str:
    """The installed version of retromae ("unknown" when run from a source tree that is not installed)."""
    try:
        return version("retromae")
    except PackageNotFoundError:
        return "unknown"


def library_versions() -> dict[str, str]:
    """The versions a sentence-transformers folder records (`config_sentence_transformers.json`'s `__version__`)."""
    return {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "pytorch": torch.__version__,
    }


__all__ = ["library_versions", "package_version"]
