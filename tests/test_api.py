"""`import retromae`: every public name resolves, and importing the package alone stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
import retromae


@pytest.mark.parametrize("name", [name for name in retromae.__all__ if name != "__version__"])
def test_every_public_name_resolves(name):
    value = getattr(retromae, name)
    assert getattr(value, "__name__", name) == name or name == "METHODS"


def test_version_and_unknown_names():
    assert retromae.__version__ not in {"", "unknown"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        retromae.nope  # noqa: B018


def test_import_alone_loads_neither_torch_nor_transformers():
    code = "import sys, retromae; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"
