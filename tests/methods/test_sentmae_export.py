"""SentMAE exports: the card `pretrain` writes with its final export equals `retromae export`'s, and the similarity
follows the contrastive loss (cosine only when it was trained, weight > 0)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from retromae.trainers.cli import main
from retromae.trainers.export.cls import ExportRequest, cls_sentence_vectors
from retromae.trainers.methods import METHODS

from ..builders import pretrain_args


def _stage2(stage1: Path, corpus: Path, out: Path, *extra: str) -> Path:
    """A 2-step SentMAE stage-2 run from `stage1` that writes its final export to OUT/encoder."""
    assert main(pretrain_args(stage1, corpus, out, "--method", "sentmae", "--max-steps", "2", "--save-steps", "100",
                              *extra)) == 0
    return out


def _card_lines(folder: Path) -> list[str]:
    """The model card without its `hf upload <repo> ./<folder> .` line, which names the folder (by design)."""
    return [line for line in (folder / "README.md").read_text().splitlines() if not line.startswith("hf upload ")]


def test_pretrain_card_of_stage2_equals_export_card(stage1_checkpoint, corpus, tmp_path):
    out = _stage2(stage1_checkpoint, corpus, tmp_path / "stage2")
    assert json.loads((out / "retromae_run.json").read_text())["method"] == "sentmae"
    assert main(["export", str(out), str(tmp_path / "exported")]) == 0
    written = _card_lines(out / "encoder")
    assert written == _card_lines(tmp_path / "exported")
    card = "\n".join(written)
    assert "SentMAE" in card and "contrastive_loss_weight" in card and "(retromae)" not in card


def _similarity(folder: Path) -> tuple[str, bool]:
    """The export's `similarity_fn_name` and whether it holds a Normalize module."""
    modules = json.loads((folder / "modules.json").read_text())
    config = json.loads((folder / "config_sentence_transformers.json").read_text())
    return config["similarity_fn_name"], any(m["type"].endswith("Normalize") for m in modules)


def test_stage2_with_the_contrastive_loss_exports_cosine(stage1_checkpoint, corpus, tmp_path):
    out = _stage2(stage1_checkpoint, corpus, tmp_path / "stage2")
    assert _similarity(out / "encoder") == ("cosine", True)


def test_stage2_without_the_contrastive_loss_exports_dot(stage1_checkpoint, corpus, tmp_path):
    # contrastive_loss_weight 0: RetroMAE alone (preset sentmae-stage2-msmarco), scored by the dot product
    out = _stage2(stage1_checkpoint, corpus, tmp_path / "stage2", "--method-options",
                  '{"contrastive_loss_weight": 0.0}')
    assert json.loads((out / "config.json").read_text())["similarity"] == "cos"
    assert main(["export", str(out), str(tmp_path / "encoder")]) == 0
    assert _similarity(out / "encoder") == _similarity(tmp_path / "encoder") == ("dot", False)


@pytest.mark.parametrize(("similarity", "weight", "normalised"),
                         [("cos", 1.0, True), ("cos", 0.0, False), ("dot", 1.0, False), (None, None, False)])
def test_validation_vectors_are_normalised_only_for_the_cosine_loss(similarity, weight, normalised):
    config = SimpleNamespace(similarity=similarity, contrastive_loss_weight=weight)
    hidden = torch.full((2, 3, 4), 3.0)  # (batch_size, seq_len, hidden_size): [CLS] norm 6
    vectors = cls_sentence_vectors(SimpleNamespace(config=config), hidden, {}, "query")[""]
    assert torch.allclose(vectors.norm(dim=-1), torch.full((2,), 1.0 if normalised else 6.0))


@pytest.mark.parametrize(("config", "expected"), [
    ({"similarity": "cos", "contrastive_loss_weight": 0.5}, "cosine"),
    ({"similarity": "cos", "contrastive_loss_weight": 0.0}, "dot"),
    ({"similarity": "cos", "contrastive_weight": 0.0}, "dot"),  # a config.json written before the rename
    ({"similarity": "cos", "contrastive_weight": 1.0}, "cosine"),
    ({}, "dot"),
])
def test_export_similarity_follows_the_contrastive_loss(config, expected):
    request = ExportRequest(method=METHODS["sentmae"], config=config, state_dict={}, tokenizer=None, run_info=None,
                            model_name="m", folder_name="m")
    assert request.similarity_name() == expected
