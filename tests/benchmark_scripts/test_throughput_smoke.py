"""benchmarks/pretrain_throughput.py and benchmarks/official_side_by_side.py (issue 32's GPU table): MFU arithmetic,
peaks by device name, result merging, the timing window, and --tiny runs of both (experiment: `make smoke`), which
prove only that the scripts run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from ..builders import benchmark_script

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_SITE = Path(os.environ.get("RETROMAE_OFFICIAL_SITE", "/tmp/tp_smoke/official_site"))


@pytest.fixture(scope="module")
def pt() -> ModuleType:
    return benchmark_script("pretrain_throughput")


@pytest.fixture(scope="module")
def sbs() -> ModuleType:
    return benchmark_script("official_side_by_side")


@pytest.mark.parametrize(("name", "peak", "slug"), [
    ("NVIDIA H100 80GB HBM3", 989.0, "h100_80gb_hbm3"),
    ("NVIDIA H200", 989.0, "h200"),
    ("NVIDIA H100 PCIe", 756.0, "h100_pcie"),
    ("NVIDIA H200 NVL", 835.0, "h200_nvl"),
    ("NVIDIA A100-SXM4-80GB", None, "a100_sxm4_80gb"),
])
def test_peaks_and_slugs_by_device_name(pt, name, peak, slug):
    assert pt.peak_bf16_tflops(name) == peak
    assert pt.device_slug(name) == slug


def test_mfu_is_three_forward_passes_over_time_and_peak(pt):
    # 100 MFLOP/token forward x 1000 tokens x 3 = 0.3 TFLOP per step; in 0.01 s that is 30 TFLOP/s, 3% of 1000
    result = pt.utilisation(100.0, 1000, 0.01, 1000.0)
    assert result["model_tflop_per_step"] == pytest.approx(0.3)
    assert result["model_tflops_per_s"] == pytest.approx(30.0)
    assert result["mfu"] == pytest.approx(0.03)
    assert pt.utilisation(100.0, 1000, 0.01, None)["mfu"] is None


def test_merge_keeps_other_entries_and_replaces_redone_ones(pt):
    env = {"device_name": "NVIDIA H200", "dtype": "bf16", "batch_size": 32, "date": "d1"}
    previous = {"environment": env, "collation": {"512": {"x": 1}},
                "steps": [{"size": "base", "length": 512, "v": "old"}, {"size": "minilm", "length": 512, "v": "old"}]}
    report = {"environment": {**env, "date": "d2"}, "collation": {},
              "steps": [{"size": "minilm", "length": 512, "v": "new"}]}
    whole = pt.merged(report, previous)
    assert [(s["size"], s["v"]) for s in whole["steps"]] == [("base", "old"), ("minilm", "new")]
    assert whole["collation"] == {"512": {"x": 1}} and whole["environment"]["merged_runs"][0]["date"] == "d1"
    with pytest.raises(SystemExit):
        pt.merged({**report, "environment": {**env, "dtype": "fp32"}}, previous)


def test_timed_window_is_whole_waves_of_workers(sbs):
    assert sbs.window(workers=14, burn_in=5, steps=28) == (14, 28)  # one wave untimed, two timed
    assert sbs.window(workers=14, burn_in=5, steps=20) == (14, 28)  # rounded up to whole waves
    assert sbs.window(workers=0, burn_in=3, steps=5) == (3, 5)  # no workers: batches are made in the loop


def run_script(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.experiment
def test_pretrain_throughput_tiny(tmp_path):
    output = tmp_path / "pt.json"
    done = run_script(["benchmarks/pretrain_throughput.py", "--tiny", "--threads", "1", "--output", str(output)])
    assert "proves only that the script runs" in done.stdout
    report = json.loads(output.read_text())
    assert report["partial"] is False and report["environment"]["tiny"] is True
    assert [row["variant"] for row in report["rows"]] == ["hf_mlm", "enhanced", "dupmae", "bow", "seed"]
    assert all(row["samples_per_s"] > 0 and row["mfu"] is None for row in report["rows"])  # CPU: no peak, no MFU
    assert report["rows"][0]["ratio"] == 1.0 and report["rows"][1]["attn_implementation"] == "sdpa"


@pytest.mark.experiment
def test_official_side_by_side_tiny(tmp_path):
    if not (OFFICIAL_SITE / "transformers").is_dir() or not (ROOT / ".dev" / "official" / "pretrain").is_dir():
        pytest.skip(f"the official code and its environment are not set up ({OFFICIAL_SITE}); run "
                    "benchmarks/device/throughput_prep.sh, then DEVICE_SMOKE=1 benchmarks/device/throughput.sh")
    output = tmp_path / "sbs.json"
    done = run_script(["benchmarks/official_side_by_side.py", "--tiny", "--official-site", str(OFFICIAL_SITE),
                       "--output", str(output)])
    assert "proves only that both sides run" in done.stdout
    report = json.loads(output.read_text())
    assert report["partial"] is False and set(report["environment"]) >= {"device_name", "dtype", "date"}
    (row,) = report["rows"]
    assert row["size"] == "tiny" and row["length"] == 64
    assert row["official_samples_per_s"] > 0 and row["ours_samples_per_s"] > 0
    assert report["details"]["tiny"]["official"]["transformers"] == "4.44.2"
