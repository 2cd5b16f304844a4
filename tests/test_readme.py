"""The README's Python section runs as written: pre-train, save, export, encode, fine-tune, evaluate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .builders import hub_cache_layout

README = Path(__file__).resolve().parents[1] / "README.md"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def python_section_code() -> str:
    section = README.read_text(encoding="utf-8").split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the Python section holds one code block"
    return blocks[0]


def write_small_beir(folder: Path) -> None:
    """30 documents, 18 queries, one relevant document each: 12 train queries, 6 test queries."""
    words = ["apple", "banana", "cherry", "dog", "elephant", "fish", "grape", "horse", "igloo", "jacket", "kite", "lemon"]
    (folder / "qrels").mkdir(parents=True)
    docs = [{"_id": f"d{i}", "title": words[i % 12], "text": " ".join(words[(i + j) % 12] for j in range(5))}
            for i in range(30)]
    queries = [{"_id": f"q{i}", "text": f"about {words[i % 12]} and {words[(i * 7) % 12]}"} for i in range(18)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    for split, ids in (("train", range(12)), ("test", range(12, 18))):
        lines = ["query-id\tcorpus-id\tscore", *(f"q{i}\td{i}\t1" for i in ids)]
        (folder / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_python_section_runs_as_written(minilm_dir, tmp_path):
    code = python_section_code()
    assert HUB_ID in code and "my-beir" in code
    write_small_beir(tmp_path / "my-beir")
    env = os.environ | {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache_layout(minilm_dir, HUB_ID, tmp_path / "hub"))}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.strip().splitlines()  # the Trainers' log lines come between the two prints
    assert "(1, 384)" in printed
    assert 0.0 <= float(printed[-1]) <= 1.0
    assert (tmp_path / "out/retromae-python/model.safetensors").is_file()
    assert (tmp_path / "out/retromae-python-ft/README.md").is_file()
