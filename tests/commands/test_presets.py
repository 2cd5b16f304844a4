"""Every preset in configs/ loads through `retromae pretrain --config` and runs two steps on a tiny model.

The paper presets name full-size models, placeholder corpora, GPUs and mixed precision; the test overrides exactly
those (tiny BERT, tiny corpus or pair file, 2 steps, L 32, batch 2, CPU, fp32, no workers, no accumulation) and keeps
everything else, so a misspelled key, a value of the wrong type or a method option the method lacks fails here.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from retromae.trainers.cli import main
from retromae.trainers.inputs.errors import UserError
from retromae.trainers.inputs.pretrain_options import pretrain_arguments
from retromae.trainers.methods import METHODS, method_of_config

from ..builders import tiny_bert_kwargs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(CONFIGS.glob("*.yaml"))


def test_every_method_has_a_demo_preset_and_a_paper_preset():
    names = {p.stem for p in PRESETS}
    for method in METHODS:
        assert f"demo-{method}" in names, method
        assert any(n.startswith(f"{method}-") for n in names), method
    assert {"sentmae-stage1-wiki-book", "retromae-wiki-book", "retromae-msmarco"} <= names


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_preset_runs_two_steps(preset, tiny_bert, corpus, pairs_file, stage1_checkpoint, tmp_path):
    text = preset.read_text(encoding="utf-8")
    assert text.startswith("#"), "a preset opens with a comment saying where its numbers come from"
    values = yaml.safe_load(text)
    method = values["method"]
    demo = preset.stem.startswith("demo-")
    if demo:
        assert "model" not in values and "corpus" not in values, "demo presets use the bundled model and corpus"
    else:
        assert ("corpus" in values) != ("pairs" in values), "a paper preset names its data (a placeholder)"
    # stage 2 continues a stage-1 retromae checkpoint; every other preset starts from a plain BERT
    model = stage1_checkpoint if method == "sentmae" else tiny_bert
    data = ["--pairs", str(pairs_file)] if "pairs" in values else ["--corpus", str(corpus)]
    args = ["pretrain", "--config", str(preset), "--model", str(model), *data,
            "--max-steps", "2", "--max-seq-length", "32", "--per-device-train-batch-size", "2",
            "--gradient-accumulation-steps", "1", "--output-dir", str(tmp_path / "run"), "--no-export", "true",
            "--use-cpu", "true", "--bf16", "false", "--fp16", "false", "--dataloader-num-workers", "0",
            "--save-steps", "100", "--disable-tqdm", "true"]
    if method == "dupmae":  # the tiny model's hidden size (32) bounds the [CLS] projection; other options stay
        options = {**(values.get("method_options") or {}), "dense_dim": tiny_bert_kwargs()["hidden_size"]}
        args += ["--method-options", json.dumps(options)]
    assert main(args) == 0
    out = tmp_path / "run"
    assert json.loads((out / "retromae_run.json").read_text())["method"] == method
    config = json.loads((out / "config.json").read_text())
    assert method_of_config(config["model_type"]).name == method
    for key, value in (values.get("method_options") or {}).items():  # the file's method options reached the model
        assert config[key] == value or (method == "dupmae" and key == "dense_dim"), key


def test_presets_load_by_name_and_by_readme_path_outside_the_source_tree(tiny_bert, corpus, tmp_path, monkeypatch):
    """A pip user has no configs/ folder: `--config NAME` and the README's `configs/NAME.yaml` find the bundled one."""
    monkeypatch.chdir(tmp_path)
    common = ["--model", str(tiny_bert), "--corpus", str(corpus), "--max-steps", "1", "--max-seq-length", "32",
              "--per-device-train-batch-size", "2", "--no-export", "true", "--use-cpu", "true", "--disable-tqdm", "true"]
    assert main(["pretrain", "--config", "demo-bow", *common, "--output-dir", "by-name"]) == 0
    assert main(["pretrain", "--config", "configs/demo-seed.yaml", *common, "--output-dir", "by-path"]) == 0
    assert json.loads((tmp_path / "by-name" / "retromae_run.json").read_text())["method"] == "bow"
    assert json.loads((tmp_path / "by-path" / "retromae_run.json").read_text())["method"] == "seed"


def test_unknown_preset_lists_the_bundled_ones(capsys):
    assert main(["pretrain", "--config", "no-such-preset"]) == 2
    assert "bundled presets: bow-msmarco" in capsys.readouterr().err


def test_wheel_ships_the_presets(tmp_path):
    """`pip install retromae` users get configs/ as package data beside retromae/trainers/ (where
    inputs/config_files.py looks)."""
    pytest.importorskip("setuptools")
    root = CONFIGS.parent
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, source / name)
    for package in ("api", "modeling", "trainers", "model_cards", "configs"):  # pyproject.toml's package-dir
        shutil.copytree(root / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "dist"), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("retromae-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"retromae/configs/{p.name}" for p in PRESETS} <= names and "retromae/trainers/cli.py" in names
    assert "retromae/trainers/commands/pretrain.py" in names and "retromae/trainers/inputs/arguments.py" in names


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="--deepspeed needs the deepspeed package")
def test_sharding_presets_load_by_name_and_by_readme_path_outside_the_source_tree(tmp_path, monkeypatch):
    """The JSON presets as `--config`'s: by name or by the README's `configs/` path, from any folder, on the command
    line and in a `--config` file; a name that is no file and no preset is one line listing them (before: the name
    reached transformers, which read it as JSON text and failed)."""
    monkeypatch.chdir(tmp_path)
    common = ["--model", "m", "--corpus", "c.txt", "--use-cpu", "true"]
    run = pretrain_arguments([*common, "--output-dir", "a", "--deepspeed", "deepspeed-zero3"])
    assert Path(run.training.deepspeed) == CONFIGS / "deepspeed-zero3.json"
    assert run.training.hf_deepspeed_config.config["zero_optimization"]["stage"] == 3
    run = pretrain_arguments([*common, "--output-dir", "b", "--deepspeed=configs/deepspeed-zero2.json"])
    assert Path(run.training.deepspeed) == CONFIGS / "deepspeed-zero2.json"
    run = pretrain_arguments([*common, "--output-dir", "fsdp", "--fsdp", "full_shard auto_wrap", "--fsdp-config",
                              "fsdp-bert"])  # read by transformers; refused at training time on the CPU
    assert run.training.fsdp_config["transformer_layer_cls_to_wrap"] == ["BertLayer", "TwoStreamBertLayer"]
    (tmp_path / "run.yaml").write_text("deepspeed: deepspeed-zero2\n")
    run = pretrain_arguments([*common, "--output-dir", "c", "--config", "run.yaml"])
    assert Path(run.training.deepspeed) == CONFIGS / "deepspeed-zero2.json"
    with pytest.raises(UserError, match=r"--deepspeed zero5: no such file and no deepspeed preset of that name; give "
                                        r"a JSON file, or one of deepspeed-zero2, deepspeed-zero3$"):
        pretrain_arguments([*common, "--output-dir", "d", "--deepspeed", "zero5"])
    # another flag's preset, and a file that is not a JSON object (HEAD: DeepSpeed's or json's message, no file)
    with pytest.raises(UserError, match=r"--deepspeed fsdp-bert: .*\(fsdp-bert is a preset of the other flag\)"):
        pretrain_arguments([*common, "--output-dir", "e", "--deepspeed", "fsdp-bert"])
    (tmp_path / "lines.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(UserError, match=r"--deepspeed .*lines.jsonl: not a JSON file \(Extra data"):
        pretrain_arguments([*common, "--output-dir", "f", "--deepspeed", str(tmp_path / "lines.jsonl")])


@pytest.mark.parametrize("zero, expected", [
    (None, 'no "zero_optimization" section; add "zero_optimization": {"stage": 2}'),  # HEAD: accelerate's, no file
    ('"stage2"', '"zero_optimization" is "stage2", not an object'),  # HEAD: a traceback on every process
    ('{"stage": "two"}', '"zero_optimization": {"stage": "two"}; the ZeRO stage is 0, 1, 2 or 3'),  # HEAD: int()'s
    ('{"stage": 4}', '"zero_optimization": {"stage": 4}; the ZeRO stage is 0, 1, 2 or 3'),
])
def test_a_deepspeed_config_without_a_well_formed_zero_section_is_refused_naming_it(zero, expected, tmp_path):
    common = ["--model", "m", "--corpus", "c.txt", "--use-cpu", "true", "--output-dir", str(tmp_path / "run")]
    text = '{"train_micro_batch_size_per_gpu": "auto"' + (f', "zero_optimization": {zero}' if zero else "") + "}"
    config = tmp_path / "ds.json"
    config.write_text(text)
    for given in (str(config), text):  # a file, and JSON text on the command line
        with pytest.raises(UserError) as refused:
            pretrain_arguments([*common, "--deepspeed", given])
        message = str(refused.value)
        assert message.startswith(f"--deepspeed {given}: ") and expected in message, message
