"""The continued-pre-training recipe (trainers/training/recipe.py): head warm-up, encoder learning-rate scale, layer
decay."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.cli import main
from retromae.trainers.methods import METHODS
from retromae.trainers.training.recipe import SUGGESTED_RECIPE, RecipeArguments, parameter_groups
from safetensors.torch import load_file

from ..builders import pretrain_args, save_headless_bert, tiny_bert_kwargs

RECIPE_LOGGER = "retromae.trainers.training.recipe"


@pytest.fixture(scope="module")
def headless_bert(tmp_path_factory, tokenizer) -> Path:
    """A tiny BertModel checkpoint without `cls.*` weights, as all-MiniLM-L6-v2 ships."""
    return save_headless_bert(tmp_path_factory.mktemp("headless-bert"), tokenizer)


def recipe_run(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """4 steps, a checkpoint after every step (all kept), no export."""
    return pretrain_args(model, corpus, out, "--save-steps", "1", "--save-total-limit", "10", "--no-export", "true",
                         *extra)


def encoder_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in weights.items() if k.startswith("bert.")}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_head_warmup_keeps_the_encoder_bit_identical_while_the_new_parts_train(method, tiny_bert, corpus, tmp_path,
                                                                               caplog):
    out = tmp_path / method
    with caplog.at_level(logging.WARNING, logger=RECIPE_LOGGER):
        assert main(recipe_run(tiny_bert, corpus, out, "--method", method,
                               "--max-steps", "3", "--head-warmup-steps", "2", "--encoder-lr-scale", "0.1")) == 0
    base = encoder_weights(load_file(str(tiny_bert / "model.safetensors")))
    steps = [load_file(str(out / f"checkpoint-{n}" / "model.safetensors")) for n in (1, 2, 3)]
    for step in steps[:2]:  # weight decay 0.01 is on: a zero learning rate alone would not be enough with AdamW
        assert encoder_weights(step).keys() == base.keys()
        assert all(torch.equal(step[k], v) for k, v in base.items()), "encoder frozen during the warm-up"
    new_parts = [k for k in steps[0] if not k.startswith("bert.")]
    assert "cls.predictions.transform.dense.weight" in new_parts
    changed = [k for k in new_parts if not torch.equal(steps[0][k], steps[1][k])]
    assert "cls.predictions.transform.dense.weight" in changed and "cls.predictions.bias" in changed
    assert all(k in changed for k in new_parts if k.startswith("decoder.") and k.endswith("dense.weight"))
    assert not all(torch.equal(steps[2][k], v) for k, v in base.items()), "the encoder trains after the warm-up"

    logged = [e for e in json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    assert [e["encoder_learning_rate"] for e in logged][:2] == [0.0, 0.0]
    assert logged[2]["encoder_learning_rate"] == pytest.approx(0.1 * logged[2]["learning_rate"], rel=1e-9)
    assert sum("Head warm-up finished after 2 steps" in r.getMessage() for r in caplog.records) == 1
    training = json.loads((out / "retromae_run.json").read_text())["training"]
    assert (training["head_warmup_steps"], training["encoder_lr_scale"], training["layer_lr_decay"]) == (2, 0.1, 1.0)


def test_learning_rate_groups_follow_the_scale_and_the_layer_decay():
    torch.manual_seed(0)
    model = RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs(vocab_size=99)))  # L = 2 encoder layers
    recipe = RecipeArguments(encoder_lr_scale=0.1, layer_lr_decay=0.5)
    decay = {n for n, _ in model.named_parameters() if "bias" not in n and "LayerNorm" not in n}
    groups = parameter_groups(model, recipe, 2, 1e-4, 0.01, decay)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert len(lr_of) == len(names) == sum(len(g["params"]) for g in groups), "every parameter once"
    expected = {  # S * D**(L - l) for layer l, S * D**(L + 1) for the embeddings, the full rate elsewhere
        "bert.encoder.layer.1.attention.self.query.weight": 1e-4 * 0.1 * 0.5,
        "bert.encoder.layer.0.output.dense.bias": 1e-4 * 0.1 * 0.25,
        "bert.embeddings.word_embeddings.weight": 1e-4 * 0.1 * 0.125,  # also the tied MLM output matrix
        "bert.embeddings.LayerNorm.weight": 1e-4 * 0.1 * 0.125,
        "cls.predictions.transform.dense.weight": 1e-4,
        "cls.predictions.bias": 1e-4,
        "decoder.layers.0.attention.self.query.weight": 1e-4,
    }
    for name, lr in expected.items():
        assert lr_of[id(names[name])][0] == pytest.approx(lr, rel=1e-12), name
    assert lr_of[id(names["bert.embeddings.LayerNorm.weight"])][1] == 0.0
    assert lr_of[id(names["bert.encoder.layer.1.attention.self.query.weight"])][1] == 0.01
    assert groups[0]["lr"] == 1e-4, "the Trainer logs the first group's rate as learning_rate"


def test_the_trainer_builds_those_groups(tiny_bert, corpus, tmp_path):
    out = tmp_path / "run"
    assert main(recipe_run(tiny_bert, corpus, out, "--max-steps", "1", "--learning-rate", "1e-4",
                           "--encoder-lr-scale", "0.1", "--layer-lr-decay", "0.5")) == 0
    saved = torch.load(out / "checkpoint-1" / "optimizer.pt", weights_only=True)
    rates = sorted({round(g["initial_lr"], 15) for g in saved["param_groups"]}, reverse=True)
    assert rates == [1e-4, 5e-6, 2.5e-6, 1.25e-6]


@pytest.mark.parametrize("stopped_at", [1, 2])  # inside the warm-up, and exactly at its end
def test_resume_across_the_phase_boundary_equals_an_uninterrupted_run(stopped_at, tiny_bert, corpus, tmp_path,
                                                                       caplog):
    recipe = ("--head-warmup-steps", "2", "--encoder-lr-scale", "0.1", "--layer-lr-decay", "0.8")
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    assert main(recipe_run(tiny_bert, corpus, full, *recipe)) == 0
    checkpoint = full / f"checkpoint-{stopped_at}"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=RECIPE_LOGGER):
        assert main(recipe_run(tiny_bert, corpus, resumed, *recipe, "--resume-from-checkpoint", str(checkpoint))) == 0
    assert sum("Head warm-up finished after 2 steps" in r.getMessage() for r in caplog.records) == 1
    a, b = load_file(str(full / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:3]
    assert not torch.equal(a["bert.embeddings.word_embeddings.weight"],
                           load_file(str(checkpoint / "model.safetensors"))["bert.embeddings.word_embeddings.weight"])


def test_a_headless_base_gets_one_suggestion_line(headless_bert, tiny_bert, corpus, tmp_path, caplog):
    def suggestions(model: Path, *extra: str) -> int:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=RECIPE_LOGGER):
            assert main(recipe_run(model, corpus, tmp_path / f"run{len(list(tmp_path.iterdir()))}",
                                   "--max-steps", "1", *extra)) == 0
        return sum(f"e.g. {SUGGESTED_RECIPE}, and compare" in r.getMessage() for r in caplog.records)

    assert suggestions(headless_bert) == 1
    assert suggestions(headless_bert, "--head-warmup-steps", "1") == 0, "the user chose a recipe"
    assert suggestions(tiny_bert) == 0, "a base with an MLM head keeps the paper's defaults silently"


def test_a_resume_with_another_recipe_is_refused(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(recipe_run(tiny_bert, corpus, out, "--max-steps", "2", "--head-warmup-steps", "2")) == 0
    capsys.readouterr()
    resume = ["pretrain", "--output-dir", str(out), "--resume-from-checkpoint", str(out / "checkpoint-1")]
    for flag, value, saved in (("--head-warmup-steps", "1", "2"), ("--encoder-lr-scale", "0.1", "1.0"),
                               ("--layer-lr-decay", "0.9", "1.0")):
        assert main([*resume, flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert f"{flag} {value} contradicts the run being resumed" in err and f"which used {flag} {saved}" in err
    assert main([*resume, "--head-warmup-steps", "2"]) == 0, "the recorded value again is fine"


@pytest.mark.parametrize("flag, value, expected", [
    ("--head-warmup-steps", "-1", "--head-warmup-steps must be >= 0"),
    ("--encoder-lr-scale", "0", "--encoder-lr-scale must be > 0"),
    ("--layer-lr-decay", "1.5", "--layer-lr-decay must lie in (0, 1]"),
])
def test_bad_recipe_values_get_one_line(flag, value, expected, tiny_bert, corpus, tmp_path, capsys):
    assert main(recipe_run(tiny_bert, corpus, tmp_path / "run", flag, value)) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1


@pytest.mark.long
def test_head_warmup_under_two_process_ddp(run_cli_in_two_processes, tiny_bert, corpus, tmp_path):
    """Under DDP the frozen set must not change after wrapping: the encoder's gradients are dropped instead."""

    out = tmp_path / "ddp"
    args = recipe_run(tiny_bert, corpus, out, "--max-steps", "3", "--head-warmup-steps", "2")
    result = run_cli_in_two_processes(args, 29533, {"TRANSFORMERS_VERBOSITY": "warning"})  # the CLI's default level
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr.count("Head warm-up finished after 2 steps") == 1, "logged by the main process only"
    base = encoder_weights(load_file(str(tiny_bert / "model.safetensors")))
    steps = [load_file(str(out / f"checkpoint-{n}" / "model.safetensors")) for n in (1, 2, 3)]
    assert all(torch.equal(step[k], v) for step in steps[:2] for k, v in base.items())
    assert not all(torch.equal(steps[2][k], v) for k, v in base.items())


@pytest.mark.parametrize("method", ["bow", "dupmae", "retromae"])  # SEED's losses are wired as RetroMAE's
def test_contrastive_anchor_adds_the_in_batch_loss_to_every_method(method, tiny_bert, corpus, tmp_path):
    out = tmp_path / method
    assert main(recipe_run(tiny_bert, corpus, out, "--method", method,
                           "--max-steps", "2", "--contrastive-anchor-weight", "0.5")) == 0
    logged = [e for e in json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    assert len(logged) == 2 and all(e["contrastive_loss"] > 0 for e in logged)
    if method == "retromae":  # weights 1 (encoder), 1 (decoder), 0.5 (anchor); logs are rounded to 4 digits
        for e in logged:
            assert e["loss"] == pytest.approx(e["encoder_mlm_loss"] + e["decoder_loss"] + 0.5 * e["contrastive_loss"],
                                              abs=2e-3)
    training = json.loads((out / "retromae_run.json").read_text())["training"]
    assert training["contrastive_anchor_weight"] == 0.5


@pytest.mark.parametrize("extra, expected", [
    (["--method", "sentmae"], "already has its contrastive loss"),
    (["--packing", "true"], "drop --packing"),
    (["--per-device-train-batch-size", "1"], "at least 2 passages per batch"),
    (["--contrastive-anchor-weight", "-1"], "--contrastive-anchor-weight must be >= 0"),
    (["--method-options", '{"decoder_visibility": "reference", "decoder_targets": "reference"}'],
     'does not support decoder_visibility="reference"'),
])
def test_contrastive_anchor_refuses_what_cannot_work(extra, expected, tiny_bert, corpus, tmp_path, capsys):
    given = ["--contrastive-anchor-weight", "0.5"] if "--contrastive-anchor-weight" not in extra else []
    assert main(recipe_run(tiny_bert, corpus, tmp_path / "run", *given, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1, err
