"""`retromae import-official`: a checkpoint of the official RetroMAE code (staoxiao/RetroMAE, src/pretrain) becomes
our pre-training checkpoint with the same losses, and `retromae pretrain --model OUT` continues it, decoder included.

tests/fixtures/official_tiny (written by its make_fixture.py, which runs the official code under transformers 4.44.2)
holds the official save (`checkpoint/`: the `lm` only), the decoder layer it drops (`c_head.safetensors`), one batch
of the official collator with its (B, L, L) visibility matrix, and the official model's losses on it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from retromae.modeling.modeling_retromae import RetroMAEDecoder, RetroMAEForPretraining
from retromae.trainers.cli import main
from retromae.trainers.inputs.checkpoints import load_tokenizer
from retromae.trainers.inputs.official_checkpoints import official_model
from safetensors.torch import load_file, save_file

from ..builders import SENTENCES

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "official_tiny"
CHECKPOINT, DECODER = FIXTURE / "checkpoint", FIXTURE / "c_head.safetensors"
FIXTURE_RECORD = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
EXPECTED = FIXTURE_RECORD["losses"]
ATOL = 1e-5


def losses_on_the_official_batch(model: RetroMAEForPretraining, monkeypatch) -> dict[str, float]:
    """Our losses on the fixture's batch, the decoder seeing the official visibility matrix (1 = visible)."""
    batch = load_file(FIXTURE / "batch.safetensors")
    visible = batch["decoder_attention_mask"].bool()[:, None]  # (B, 1, L, L)
    monkeypatch.setattr(RetroMAEDecoder, "_visibility", lambda self, attention_mask, word_starts: visible)
    with torch.no_grad():
        out = model.eval()(input_ids=batch["encoder_input_ids"], attention_mask=batch["encoder_attention_mask"],
                           encoder_labels=batch["encoder_labels"], decoder_labels=batch["decoder_labels"])
    # our unmasked input is the official decoder's input
    original = torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["encoder_input_ids"])
    assert torch.equal(original, batch["decoder_input_ids"])
    return {name: getattr(out, name).item() for name in EXPECTED}


def assert_official_losses(got: dict[str, float]) -> None:
    differences = {name: abs(got[name] - EXPECTED[name]) for name in EXPECTED}
    print("ours", got, "official", EXPECTED, "|difference|", differences)
    assert max(differences.values()) <= ATOL, differences


def test_the_fixture_is_the_official_save():
    """What the official code saves: a BertForMaskedLM under transformers 4.44.2, without the decoder layer; under
    1 MiB."""
    config = json.loads((CHECKPOINT / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["transformers_version"]) == (
        "bert", ["BertForMaskedLM"], "4.44.2")
    keys = load_file(CHECKPOINT / "model.safetensors").keys()
    assert all(k.startswith(("bert.", "cls.")) for k in keys)
    assert all(k.startswith("c_head.") for k in load_file(DECODER))
    assert sum(f.stat().st_size for f in FIXTURE.rglob("*") if f.is_file()) < 1 << 20


def test_imported_checkpoint_gives_the_official_losses(tmp_path, monkeypatch, capsys):
    out = tmp_path / "imported"
    assert main(["import-official", str(CHECKPOINT), str(out), "--decoder", str(DECODER)]) == 0
    assert f"retromae pretrain --model {out}" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "retromae" and config["auto_map"]["AutoModelForPreTraining"]
    assert (config["decoder_visibility"], config["decoder_targets"], config["query_stream"]) == (
        "reference", "reference", "position")
    model, info = RetroMAEForPretraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert_official_losses(losses_on_the_official_batch(model, monkeypatch))
    tokenized = FIXTURE_RECORD["tokenized"]  # the official tokenizer's ids: the tokenizer came along unchanged
    assert load_tokenizer(out)(tokenized["text"])["input_ids"] == tokenized["input_ids"]


def test_a_fresh_decoder_would_not_give_them(monkeypatch):
    """The decoder loss depends on the imported decoder layer: a fresh one is off by far more than the tolerance."""
    model, _ = official_model(CHECKPOINT, DECODER)
    model.decoder.layers[0].apply(model._init_weights)
    got = losses_on_the_official_batch(model, monkeypatch)
    assert got["encoder_mlm_loss"] == pytest.approx(EXPECTED["encoder_mlm_loss"], abs=ATOL)
    assert abs(got["decoder_loss"] - EXPECTED["decoder_loss"]) > 100 * ATOL


def test_a_whole_model_state_dict_imports_alike(tmp_path, monkeypatch):
    """The official model's whole `state_dict()` (`lm.*`, `c_head.*`, `decoder_embeddings.*`) as the checkpoint's
    weights: the decoder comes from them, no --decoder needed."""
    folder = tmp_path / "official"
    shutil.copytree(CHECKPOINT, folder)
    lm = load_file(CHECKPOINT / "model.safetensors")
    whole = {**{f"lm.{k}": v for k, v in lm.items()}, **load_file(DECODER),
             **{k.replace("bert.embeddings.", "decoder_embeddings."): v.clone() for k, v in lm.items()
                if k.startswith("bert.embeddings.")}}
    save_file(whole, folder / "model.safetensors")
    model, _ = official_model(folder)
    assert_official_losses(losses_on_the_official_batch(model, monkeypatch))


def test_refuses_a_folder_that_is_not_an_official_checkpoint(tmp_path, capsys):
    """One line naming what is missing: the files of a model folder, or the decoder the official save drops."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["import-official", str(empty), str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "it has no config.json" in err, err
    assert main(["import-official", str(CHECKPOINT), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds no decoder weights (c_head.*)" in err and "--decoder" in err, err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_checkpoint_that_is_no_folder_is_named_as_such(kind, tmp_path, capsys):
    """HEAD took a missing folder for a Hub id and reported that it could not reach the Hub."""
    checkpoint = tmp_path / "no-such-folder"
    if kind == "file":
        checkpoint.write_text("x")
    assert main(["import-official", str(checkpoint), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    state = "is a file, not a folder" if kind == "file" else "does not exist"
    assert err.count("\n") == 0 and f"CHECKPOINT {checkpoint} {state}; give the folder the official code" in err, err


@pytest.mark.parametrize("damage", ["other keys", "a key short"])
def test_a_decoder_file_that_is_not_c_head_is_named(damage, tmp_path, capsys):
    """HEAD blamed the checkpoint: "CHECKPOINT is not an official RetroMAE checkpoint: it lacks the weights
    ['c_head.attention...']", for weights that --decoder FILE was to give."""
    layer = load_file(DECODER)
    wrong = {"foo.weight": torch.zeros(3)} if damage == "other keys" else dict(list(layer.items())[1:])
    save_file(wrong, tmp_path / "decoder.safetensors")
    assert main(["import-official", str(CHECKPOINT), str(tmp_path / "out"), "--decoder",
                 str(tmp_path / "decoder.safetensors")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"error: --decoder {tmp_path / 'decoder.safetensors'} is not the official decoder layer (c_head): it " in err
    assert str(CHECKPOINT) not in err and err.count("\n") == 0, err


def test_refuses_our_own_checkpoint(tmp_path, capsys):
    ours = tmp_path / "ours"
    assert main(["import-official", str(CHECKPOINT), str(ours), "--decoder", str(DECODER)]) == 0
    assert main(["import-official", str(ours), str(tmp_path / "again"), "--decoder", str(DECODER)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already a retromae pre-training checkpoint" in err, err


def test_an_existing_output_needs_overwrite_and_only_a_model_folder_is_replaced(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["import-official", str(CHECKPOINT), str(out), "--decoder", str(DECODER)]
    for flags in ([], ["--overwrite"]):  # a folder of other files (evaluation results, notes) is never deleted
        assert main([*args, *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "holds no model (no modules.json or config.json)" in err, err
        assert (out / "notes.txt").read_text() == "mine"
    (out / "config.json").write_text("{}")  # a model folder: replaced with --overwrite only
    assert main(args) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()


def test_pretrain_continues_with_the_imported_decoder(tmp_path):
    """`retromae pretrain --model OUT --max-steps 2` starts from the imported weights, decoder included: after two
    small steps the decoder is still the official one (its trained LayerNorm far from a fresh 1.0)."""
    out, run, corpus = tmp_path / "imported", tmp_path / "run", tmp_path / "corpus.txt"
    assert main(["import-official", str(CHECKPOINT), str(out), "--decoder", str(DECODER)]) == 0
    corpus.write_text("\n".join(SENTENCES * 4) + "\n", encoding="utf-8")
    assert main(["pretrain", "--model", str(out), "--corpus", str(corpus), "--output-dir", str(run),
                 "--max-seq-length", "32", "--per-device-train-batch-size", "4", "--max-steps", "2",
                 "--save-steps", "2", "--seed", "7", "--disable-tqdm", "true", "--use-cpu", "true"]) == 0
    official, continued = load_file(DECODER), load_file(run / "model.safetensors")
    for key, value in official.items():
        ours = continued["decoder.layers.0." + key.removeprefix("c_head.")]
        torch.testing.assert_close(ours, value, atol=2e-3, rtol=0)  # 2 steps at lr 1e-4 move a weight by < 1e-3
    assert (official["c_head.output.LayerNorm.weight"] - 1).abs().max() > 1e-2
    assert json.loads((run / "config.json").read_text())["decoder_visibility"] == "reference"


def test_an_output_inside_the_official_checkpoint_is_refused(tmp_path, capsys):
    checkpoint = shutil.copytree(CHECKPOINT, tmp_path / "official")
    out = checkpoint / "converted"
    assert main(["import-official", str(checkpoint), str(out), "--decoder", str(DECODER)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"OUT {out}: writing into it would change the official checkpoint" in err, err
    assert not out.exists()
