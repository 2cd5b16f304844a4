"""What `inputs.outputs.atomic_folder` installs: files with the modes the umask gives."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch
from retromae.trainers.inputs.outputs import atomic_folder
from safetensors.torch import save_file


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_a_folder_built_by_atomic_folder_has_the_umask_modes(umask, mode, tmp_path):
    """HEAD left model.safetensors and collator_rng_*.safetensors 0600 (safetensors' save_file ignores the umask)
    while the folder's other files were 0644, and a copied file kept its source's mode (0644 under umask 077)."""
    source = tmp_path / "tokenizer.json"
    source.write_text("{}")
    source.chmod(0o644)
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    previous = os.umask(umask)
    try:
        with atomic_folder(tmp_path / "model") as build:
            save_file({"weight": torch.zeros(2)}, str(build / "model.safetensors"))
            (build / "checkpoint").mkdir()
            save_file({"state": torch.zeros(2)}, str(build / "checkpoint" / "collator_rng_0.safetensors"))
            (build / "config.json").write_text("{}")
            shutil.copy(source, build)
            shutil.copy(script, build)
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in (tmp_path / "model").rglob("*")
             if path.is_file()}
    executable = mode | (0o111 & ~umask)
    assert modes == {"model.safetensors": mode, "collator_rng_0.safetensors": mode, "config.json": mode,
                     "tokenizer.json": mode, "run.sh": executable}
