"""`retromae pretrain --from-scratch`: every weight random (seeded by --seed) with --model's architecture, changed by
--config-overrides; a config-only folder is enough; another --tokenizer sizes the vocabulary; the run record and card
name no base model; resuming continues exactly; wrong combinations are refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.cli import main
from safetensors.torch import load_file

from ..builders import pretrain_args

SMALLER = "num_hidden_layers=1,intermediate_size=24"


def config_only(model: Path, folder: Path) -> Path:
    """`model`'s config.json and tokenizer files, without its weights."""
    folder.mkdir()
    for file in model.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, folder / file.name)
    return folder


def scratch_run(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return pretrain_args(model, corpus, out, "--from-scratch", "true", *extra)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_a_random_model_of_the_given_architecture_seeded_by_seed(tiny_bert, corpus, tmp_path):
    arch = config_only(tiny_bert, tmp_path / "arch")
    runs = {name: tmp_path / name for name in ("a", "b", "other_seed")}
    for name, out in runs.items():
        seed = ["--seed", "8"] if name == "other_seed" else []
        assert main(scratch_run(arch, corpus, out, "--config-overrides", SMALLER, "--no-export", "true", *seed)) == 0
    config = json.loads((runs["a"] / "config.json").read_text())
    assert (config["num_hidden_layers"], config["intermediate_size"], config["hidden_size"]) == (1, 24, 32)
    a, b, other = (weights(out) for out in runs.values())
    assert all(torch.equal(a[k], b[k]) for k in a), "the same --seed gives the same run"
    assert not torch.equal(a["bert.embeddings.word_embeddings.weight"], other["bert.embeddings.word_embeddings.weight"])
    info = json.loads((runs["a"] / "retromae_run.json").read_text())
    assert info["base_model"] is None
    assert info["initialisation"] == {"from_scratch": True, "architecture_of": "arch", "config_overrides": SMALLER}


def test_the_checkpoints_weights_are_not_read(tiny_bert):
    torch.manual_seed(1)  # tiny_bert was made with seed 0, in the same order: its weights again
    model = RetroMAEForPretraining.from_encoder_config(tiny_bert)
    base = weights(tiny_bert)
    embeddings = model.bert.embeddings.word_embeddings.weight
    assert embeddings.shape == base["bert.embeddings.word_embeddings.weight"].shape
    assert not torch.allclose(embeddings, base["bert.embeddings.word_embeddings.weight"])
    assert embeddings.data_ptr() == model.get_output_embeddings().weight.data_ptr(), "the MLM output stays tied"
    assert abs(embeddings.std().item() - model.config.initializer_range) < 0.002


def test_the_card_and_the_summary_name_no_base_model(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(scratch_run(tiny_bert, corpus, out, "--max-steps", "2", "--config-overrides", SMALLER)) == 0
    assert (f"  started from: random weights (--seed), with the architecture of {tiny_bert.name}, changed by "
            f"{SMALLER}\n") in capsys.readouterr().out
    card = (out / "encoder" / "README.md").read_text()
    metadata = card.split("---")[1]
    assert "base_model" not in metadata
    assert f"| Base model | none: initialised randomly, with the architecture of `{tiny_bert.name}` changed by " \
           f"`{SMALLER}` |" in card
    assert str(tmp_path) not in card


def test_a_config_file_may_give_the_overrides_as_a_mapping(tiny_bert, corpus, tmp_path):
    preset = tmp_path / "scratch.yaml"
    preset.write_text("from_scratch: true\nconfig_overrides:\n  num_hidden_layers: 1\n  intermediate_size: 24\n"
                      "  tie_word_embeddings: true\n")
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--config", str(preset), "--no-export", "true")) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["num_hidden_layers"], config["intermediate_size"]) == (1, 24)
    overrides = json.loads((out / "retromae_run.json").read_text())["initialisation"]["config_overrides"]
    assert overrides == "num_hidden_layers=1,intermediate_size=24,tie_word_embeddings=true", "as the card shows it"


def test_another_tokenizer_sizes_the_vocabulary(tiny_bert, tiny_roberta, corpus, tmp_path):
    out = tmp_path / "run"
    assert main(scratch_run(tiny_bert, corpus, out, "--tokenizer", str(tiny_roberta), "--no-export", "true")) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["vocab_size"], config["pad_token_id"]) == (300, 1), "the RoBERTa tokenizer's size and <pad>"
    assert weights(out)["bert.embeddings.word_embeddings.weight"].shape == (300, 32)


@pytest.mark.parametrize(("family", "layers"), [("roberta", 1), ("modernbert", 4)])
def test_other_families_from_their_config(request, family, layers, corpus, tmp_path):
    model = request.getfixturevalue(f"tiny_{family}")
    out = tmp_path / "run"
    assert main(scratch_run(model, corpus, out, "--config-overrides", f"num_hidden_layers={layers}", "--max-steps",
                            "2", "--no-export", "true")) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["encoder_type"], config["num_hidden_layers"]) == (family, layers)
    if family == "modernbert":  # the tiny base's pattern (one global, two local layers), repeated
        assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]


def test_resuming_continues_the_run_exactly(tiny_bert, corpus, tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    flags = ("--config-overrides", SMALLER, "--no-export", "true")
    assert main(scratch_run(tiny_bert, corpus, whole, *flags)) == 0
    # the checkpoint's recorded settings (--from-scratch included) apply; its weights are loaded, not re-drawn
    assert main(pretrain_args(tiny_bert, corpus, resumed, "--no-export", "true",
                              "--resume-from-checkpoint", str(whole / "checkpoint-2"))) == 0
    expected, got = weights(whole), weights(resumed)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize(("flags", "expected"), [
    (["--config-overrides", SMALLER], "--config-overrides changes the architecture, which a checkpoint's weights"),
    (["--from-scratch", "true", "--config-overrides", "num_layers=1"],
     "--from-scratch with --model {model}: num_layers=1: key num_layers isn't in the original config dict"),
    (["--from-scratch", "true", "--config-overrides", "hidden_size"], "'hidden_size' is not key=value"),
    (["--from-scratch", "true", "--config-overrides", "hidden_size=30"], "is not a multiple of the number of"),
    (["--from-scratch", "true", "--config-overrides", "num_attention_heads=0"], "num_attention_heads=0: a size or"),
    (["--from-scratch", "true", "--config-overrides", "hidden_size=-4"], "hidden_size=-4: a size or count, at least 1"),
    (["--from-scratch", "true", "--extend-position-embeddings", "256"], "from scratch, size it with"),
    (["--from-scratch", "true", "--config-overrides", "hidden_act=nonesuch"],
     "the architecture cannot be built with --config-overrides 'hidden_act=nonesuch' (KeyError"),
    (["--from-scratch", "true", "--config-overrides", "max_position_embeddings=16"],
     "(or raise it: --config-overrides max_position_embeddings=N)"),
    (["--from-scratch", "true", "--config-overrides", "vocab_size=10"], "raise vocab_size in --config-overrides"),
])
def test_wrong_combinations_are_refused_in_one_line(tiny_bert, corpus, tmp_path, capsys, flags, expected):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, *flags)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and expected.format(model=tiny_bert) in error, error
    assert not any(out.glob("checkpoint-*")) and not (out / "model.safetensors").exists()


def test_an_unsupported_architecture_is_refused(corpus, tmp_path, capsys, minilm_dir):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    assert main(scratch_run(gpt2, corpus, tmp_path / "run", "--tokenizer", str(minilm_dir))) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "--from-scratch takes the architecture of a BERT" in error, error
