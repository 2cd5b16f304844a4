"""The GPU-efficiency measurements (benchmarks/device/efficiency.sh): row labels with fast paths, the phase clock's
marks covering a whole step, the targets' summary, and --tiny runs of the breakdown and the exactness check
(experiment: `make smoke`), which prove only that they run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from ..builders import benchmark_script, load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pt() -> ModuleType:
    return benchmark_script("pretrain_throughput")


@pytest.fixture(scope="module")
def phases(pt) -> ModuleType:
    return pt.phases


def test_row_labels_name_a_variant_and_its_fast_paths(pt):
    assert pt.split_label("enhanced") == ("enhanced", ())
    assert pt.split_label("enhanced@eager") == ("enhanced", ())
    assert pt.split_label("seed@compile_layers+fused_adamw") == ("seed", ("compile_layers", "fused_adamw"))
    args = pt.parse_args(["--tiny", "--device", "cpu", "--variants", "enhanced,bow", "--paths", "eager,compile_loss",
                          "--compiled-baseline"])
    assert args.row_list == ["hf_mlm", pt.COMPILED_BASELINE, "enhanced", "enhanced@compile_loss", "bow",
                             "bow@compile_loss"]
    with pytest.raises(SystemExit):
        pt.parse_args(["--tiny", "--device", "cpu", "--paths", "eager,turbo"])
    assert pt.split_label(pt.parse_args(["--tiny", "--paths", "cce_filtered+compile_layers"]).row_list[-1])[1] == (
        "cce_filtered", "compile_layers")
    for paths in ("cce+cce_filtered", "cce+pad_vocab", "compile_loss+cce_filtered"):  # one loss kernel per set
        with pytest.raises(SystemExit):
            pt.parse_args(["--tiny", "--device", "cpu", "--paths", paths])


@pytest.mark.parametrize("variant", ["enhanced", "hf_mlm"])
def test_the_phases_of_a_step_add_up_to_the_step(pt, phases, variant):
    """The marks partition the step: every phase named, their sum the time from the first mark to the last."""
    model, optimizer = pt.build_trainable(variant, "tiny", 103, torch.device("cpu"), 0)
    clock = phases.PhaseClock(torch.device("cpu"))
    phases.instrument(model, clock)
    tokenizer = pt.load_tokenizer()
    batch = pt.make_collator(variant, tokenizer, 0)(pt.BatchSource(tokenizer, 32).features(variant, 0, 2))
    clock.mark("start")
    model(**batch).loss.backward()
    clock.mark("rest of backward")
    optimizer.step()
    clock.mark("optimizer")
    times = clock.phase_times()
    expected = {"other forward", "encoder forward", "vocabulary losses", *phases.BACKWARD_PHASES, "optimizer"}
    assert expected | ({"decoder forward"} if variant == "enhanced" else set()) == set(times)
    total = 1e3 * (clock.marks[-1][1] - clock.marks[0][1])
    assert sum(times.values()) == pytest.approx(total) and all(ms >= 0 for ms in times.values())


def test_summary_reports_each_target_with_the_best_path(tmp_path):
    summary = load_script("efficiency_summary")
    rows = [
        {"size": "base", "length": 512, "variant": "enhanced", "path": ["eager"], "samples_per_s": 100.0,
         "mfu": 0.2, "throughput_vs_hf_mlm": 0.7, "throughput_vs_hf_mlm_compiled": 0.5},
        {"size": "base", "length": 512, "variant": "enhanced", "path": ["compile_layers"], "samples_per_s": 300.0,
         "mfu": 0.45, "throughput_vs_hf_mlm": 1.6, "throughput_vs_hf_mlm_compiled": 0.9},
        {"size": "base", "length": 128, "variant": "bow", "path": ["eager"], "samples_per_s": 900.0, "mfu": 0.9,
         "throughput_vs_hf_mlm": 2.0, "throughput_vs_hf_mlm_compiled": 2.0},
    ]
    env = {"device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11", "transformers": "5.24", "batch_size": 64}
    (tmp_path / "pretrain_throughput_h100_bf16.json").write_text(json.dumps({"environment": env, "rows": rows}))
    lines = "\n".join(summary.summary_lines(tmp_path))
    assert "enhanced  mfu                             45.0% (target 40.0%): met; path compile_layers" in lines
    assert "throughput_vs_hf_mlm_compiled   0.90x (target 1.00x): MISSED" in lines
    assert "bow       mfu                           not measured" in lines  # L=128 rows are not the targets'


def test_summary_names_rows_whose_device_masks_differ_with_or_without_a_table(tmp_path):
    """A call of only the breakdown stage writes no throughput table: its checks are still reported."""
    summary = load_script("efficiency_summary")
    rows = [{"size": "minilm", "variant": variant, "label": variant, "path": ["eager"], "ms_per_step": 1.0,
             "collation_masking_share": 0.01, "masks_equal_cpu": equal}
            for variant, equal in (("hf_mlm", None), ("enhanced", True), ("seed", False))]
    (tmp_path / "step_breakdown_h200.json").write_text(json.dumps({"rows": rows}))
    lines = "\n".join(summary.summary_lines(tmp_path))
    assert "no pretrain_throughput_*.json" in lines and "masks on the device vs the CPU's (2 rows): DIFFER: seed" in lines


def run_script(args: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.experiment
def test_breakdown_and_check_tiny(tmp_path):
    breakdown, check = tmp_path / "breakdown.json", tmp_path / "check.json"
    common = ["benchmarks/pretrain_throughput.py", "--tiny", "--threads", "1", "--variants", "enhanced",
              "--paths", "eager,compile_loss"]
    run_script([*common, "--breakdown", "--output", str(breakdown)])
    rows = json.loads(breakdown.read_text())["rows"]
    assert [row["label"] for row in rows] == ["hf_mlm", "enhanced", "enhanced@compile_loss"]
    assert [row.get("masks_equal_cpu") for row in rows] == [None, True, True]  # on the CPU, a check of the check
    assert all(sum(row["phases_share"].values()) == pytest.approx(1.0, abs=0.3) for row in rows)
    run_script([*common, "--check-paths", "--output", str(check)])
    report = json.loads(check.read_text())
    assert [row["label"] for row in report["rows"]] == ["enhanced@compile_loss"] and report["passed"] is True
