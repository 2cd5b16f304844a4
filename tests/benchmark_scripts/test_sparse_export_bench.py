"""benchmarks/sparse_export_scifact.py on a tiny random DupMAE checkpoint (ot_activation log1p_relu, saved directly:
no pre-training) and a tiny BEIR folder, in this process: the three exports, the encodings, rows (a)-(e) for both
activations, the checks and the table hold together. The measured figures are the benchmark's (real data)."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.trainers.cli import main

from ..builders import benchmark_script, tiny_bert_kwargs, write_beir
from ..commands.test_export import RUN_INFO, _save_checkpoint

pytestmark = pytest.mark.usefixtures("datasets_cache")


@pytest.fixture(scope="module")
def bench():
    return benchmark_script("sparse_export_scifact")


def test_rows_checks_and_table_on_a_tiny_dupmae(bench, tmp_path, tokenizer, monkeypatch):
    torch.manual_seed(0)
    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=64, ot_activation="log1p_relu")
    run = tmp_path / "quick-log1p_relu-2"
    output = _save_checkpoint(DupMAEForPretraining(config).eval(), tokenizer, run / "pretrained",
                              {**RUN_INFO, "method": "dupmae"})
    (output / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    (output / bench.PRETRAIN_DONE).write_text("ok\n")
    monkeypatch.setattr(bench, "OUT", tmp_path)
    monkeypatch.setattr(bench, "ENCODE_CHUNK", 8)  # 30 documents: 4 chunks

    def cli(command: str, args: list[str], log_file) -> None:
        assert main([command, *args]) == 0

    monkeypatch.setattr(bench.common, "retromae_cli", cli)

    parts = bench.score(argparse.Namespace(quick=True, steps=2, docs=None), write_beir(tmp_path / "beir"), ["log1p_relu", "none"])

    assert [p["ot_activation"] for p in parts] == ["log1p_relu", "none"]
    for part in parts:
        assert [r["row"] for r in part["rows"]] == list("abcde")
        assert all(0 <= r[m] <= 1 for r in part["rows"] for m in ("ndcg_at_10", "mrr_at_10", "recall_at_100"))
        assert all(r["queries"] == 6 for r in part["rows"])
        checks = part["checks"]
        assert checks["hybrid_index_top10_overlap_with_a"] == 1.0
        assert checks["dense_export_max_abs_diff_from_hybrid_dense"] < 1e-4
        assert checks["sparse_encoder_max_active_dims"] == checks["doc_top_k"] == 64
        assert 0 < checks["top64_overlap_mean"] <= 1
    # the exports do not depend on ot_activation: (b), (d) and (e) are the same under both
    same = [{k: v for k, v in r.items() if k != "ot_activation"} for p in parts for r in p["rows"] if r["row"] in "bde"]
    assert same[:3] == same[3:]
    # log1p_relu: on the ids both keep, the SparseEncoder's weights are mu's (special tokens aside)
    assert parts[0]["checks"]["shared_weight_abs_diff_mean"] < 0.05
    report = {"environment": {"steps": 2}, "rows": [r for p in parts for r in p["rows"]], "activations": parts}
    table = bench.render(report)
    assert "| log1p_relu | (d) SparseEncoder export |" in table and "| none | d − c |" in table
    assert "exact search over 30 documents" in table
    assert [p["documents"] for p in bench.score(argparse.Namespace(quick=True, steps=2, docs=20), tmp_path / "beir",
                                                ["log1p_relu"])] == [24]  # judged documents first, whole chunks
    assert bench.score(argparse.Namespace(quick=True, steps=2, docs=None), tmp_path / "beir", ["log1p_relu"])[0]["rows"] == \
        parts[0]["rows"]  # a rerun reads the cached encodings
