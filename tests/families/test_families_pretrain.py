"""`retromae pretrain` on RoBERTa, XLM-R and ModernBERT bases: every method end to end, the continued-pre-training
recipe on the family's layers, the position limits and `--extend-position-embeddings`, the loss chunk of a large
vocabulary, validation and coverage on the family's encoder and head, and the one-line refusal of other
architectures."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.cli import main
from retromae.trainers.export.cards import method_hyperparameters
from retromae.trainers.methods import METHODS
from retromae.trainers.retrieval.coverage import input_token_coverage
from retromae.trainers.training import retrieval_validation as validation
from retromae.trainers.training.positions import extend_position_embeddings, usable_positions
from retromae.trainers.training.pretraining import scale_loss_chunk
from retromae.trainers.training.recipe import RecipeArguments, encoder_parameters, has_mlm_head, parameter_groups
from safetensors.torch import load_file
from transformers import AutoTokenizer

from ..builders import SENTENCES, pretrain_args, write_beir, write_lines

FAMILY_FIXTURES = {"roberta": "tiny_roberta", "xlm-roberta": "tiny_xlm_roberta", "modernbert": "tiny_modernbert"}
# the pre-training model's key prefixes of each family: encoder, its layers, MLM head
FAMILY_KEYS = {
    "roberta": ("roberta.", "roberta.encoder.layer.", "lm_head."),
    "xlm-roberta": ("roberta.", "roberta.encoder.layer.", "lm_head."),
    "modernbert": ("model.", "model.layers.", "lm_head."),
}
# the tiny vocabularies (300 tokens) are smaller than DupMAE's default top-k (384)
TINY_OPTIONS = {
    "dupmae": ["--method-options", '{"dense_dim": 16, "doc_top_k": 32}'],
    "retromae-basic": ["--method", "retromae", "--decoding", "basic"],
    "retromae-reference": ["--method", "retromae", "--method-options", '{"decoder_visibility": "reference"}'],
}
RECIPE_LOGGER = "retromae.trainers.training.recipe"

# every method on RoBERTa (enhanced decoding with both visibilities, basic decoding), RetroMAE and DupMAE on the others
CASES = [
    *[("roberta", m) for m in ("retromae", "retromae-basic", "retromae-reference", "dupmae", "bow", "seed", "sentmae")],
    *[(family, m) for family in ("xlm-roberta", "modernbert") for m in ("retromae", "dupmae")],
]


def family_folder(request, family: str) -> Path:
    return request.getfixturevalue(FAMILY_FIXTURES[family])


def tiny_run(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    """2 steps, no checkpoint before the final save, no export (the exporters are not part of this test)."""
    return pretrain_args(model, corpus, out, *extra,
                         defaults={"--max-steps": "2", "--save-steps": "100", "--no-export": "true"})


@pytest.mark.parametrize(("family", "case"), CASES)
def test_every_method_pretrains_on_the_family(family, case, request, corpus, tmp_path, caplog, capsys):
    base = family_folder(request, family)
    method_flags = TINY_OPTIONS.get(case, []) if case.startswith("retromae-") else ["--method", case,
                                                                                    *TINY_OPTIONS.get(case, [])]
    out = tmp_path / case
    with caplog.at_level(logging.WARNING, logger=RECIPE_LOGGER):
        assert main(tiny_run(base, corpus, out, *method_flags)) == 0, capsys.readouterr().err[-2000:]
    info = json.loads((out / "retromae_run.json").read_text())
    assert info["global_step"] == 2
    logged = [e for e in json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    assert len(logged) == 2 and all(math.isfinite(e["loss"]) and math.isfinite(e["encoder_mlm_loss"]) for e in logged)
    assert info["final_losses"] and all(math.isfinite(v) for v in info["final_losses"].values())
    encoder, layers, head = FAMILY_KEYS[family]
    weights = load_file(str(out / "model.safetensors"))
    assert any(k.startswith(layers) for k in weights) and any(k.startswith(head) for k in weights)
    assert not any(k.startswith(("bert.", "cls.")) for k in weights), "the family's own names, not BERT's"
    config = json.loads((out / "config.json").read_text())
    assert config["encoder_type"] == family
    # the tiny bases carry a trained MLM head: no suggestion of the recipe for a headless retriever
    assert not [r for r in caplog.records if "has no MLM head" in r.getMessage()]


@pytest.mark.parametrize("family", sorted(FAMILY_FIXTURES))
def test_the_recipe_assigns_layer_rates_to_the_familys_layers(family, request):
    model = RetroMAEForPretraining.from_encoder_checkpoint(family_folder(request, family))
    encoder_prefix, layer_prefix, head = FAMILY_KEYS[family]
    num_layers = model.config.num_hidden_layers
    recipe = RecipeArguments(encoder_lr_scale=0.1, layer_lr_decay=0.5)
    groups = parameter_groups(model, recipe, num_layers, 1.0, 0.01, set())
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    for name, param in names.items():
        if name.startswith(layer_prefix):
            layer = int(name[len(layer_prefix):].split(".")[0])
            expected = 0.1 * 0.5 ** (num_layers - layer)
        elif name.startswith(f"{encoder_prefix}embeddings."):
            expected = 0.1 * 0.5 ** (num_layers + 1)
        elif name.startswith(encoder_prefix):  # ModernBERT's final_norm
            expected = 0.1
        else:
            expected = 1.0
        assert lr_of[id(param)] == pytest.approx(expected, rel=1e-12), name
    assert any(name.startswith(head) and lr_of[id(p)] == 1.0 for name, p in names.items()), "the head: full rate"
    top = next(p for n, p in names.items() if n.startswith(f"{layer_prefix}{num_layers - 1}."))
    assert lr_of[id(top)] == pytest.approx(recipe.top_layer_scale(num_layers))
    frozen = {id(p) for p in encoder_parameters(model)}
    assert frozen == {id(p) for n, p in names.items() if n.startswith(encoder_prefix)}
    assert has_mlm_head(str(family_folder(request, family))) is True


def test_the_trainer_builds_the_familys_groups(tiny_modernbert, corpus, tmp_path):
    out = tmp_path / "run"
    assert main(tiny_run(tiny_modernbert, corpus, out, "--max-steps", "1", "--save-steps", "1", "--learning-rate",
                         "1e-4", "--encoder-lr-scale", "0.1", "--layer-lr-decay", "0.5")) == 0
    saved = torch.load(out / "checkpoint-1" / "optimizer.pt", weights_only=True)
    rates = sorted({round(g["initial_lr"], 15) for g in saved["param_groups"]}, reverse=True)
    # head and decoder; final_norm (S); layers 2, 1, 0 (S D, S D^2, S D^3); embeddings (S D^4)
    assert rates == [1e-4, 1e-5, 5e-6, 2.5e-6, 1.25e-6, 6.25e-7]


def test_an_unsupported_architecture_is_refused_in_one_line(tmp_path, corpus, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    from ..builders import tiny_bpe_tokenizer

    folder = tmp_path / "gpt2"
    tokenizer = tiny_bpe_tokenizer("roberta")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                               bos_token_id=0, eos_token_id=2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    capsys.readouterr()  # the save's own progress bars
    assert main(tiny_run(folder, corpus, tmp_path / "run")) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"--model {folder} is a 'gpt2' checkpoint" in lines[0]
    assert "BERT, RoBERTa, XLM-R, ModernBERT" in lines[0] and "bert, roberta, xlm-roberta, modernbert" in lines[0]
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_config_of_another_architecture_without_weights_is_named_as_such(tmp_path, corpus, capsys):
    """HEAD called a folder of a gpt2 config.json alone "incomplete ... killed mid-save"."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "vocab_size": 100}')
    assert main(tiny_run(folder, corpus, tmp_path / "run")) == 2
    assert f"--model {folder} is a 'gpt2' checkpoint; retromae pre-trains" in capsys.readouterr().err


def test_roberta_position_limit_leaves_out_the_padding_offset(tiny_roberta, tiny_modernbert, corpus, tmp_path,
                                                              capsys):
    # max_position_embeddings 130, pad 1: 128 usable positions
    assert main(tiny_run(tiny_roberta, corpus, tmp_path / "r", "--max-seq-length", "129")) == 2
    err = capsys.readouterr().err
    assert "position limit (128, max_position_embeddings 130 - padding offset 2" in err and "Traceback" not in err
    assert main(tiny_run(tiny_roberta, corpus, tmp_path / "ok", "--max-seq-length", "128", "--max-steps",
                         "1")) == 0
    assert main(tiny_run(tiny_modernbert, corpus, tmp_path / "m", "--max-seq-length", "129")) == 2
    assert "position limit (128, max_position_embeddings in" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["bert", "roberta", "xlm-roberta"])
def test_extend_position_embeddings_tiles_the_learned_table(family, request):
    base = request.getfixturevalue("tiny_bert" if family == "bert" else FAMILY_FIXTURES[family])
    model = RetroMAEForPretraining.from_encoder_checkpoint(base).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    old = model.base_model.embeddings.position_embeddings.weight.detach().clone()
    offset = 0 if family == "bert" else model.config.pad_token_id + 1
    limit = usable_positions(model.config)
    assert limit == old.shape[0] - offset == 128
    extend_position_embeddings(model, tokenizer, 300)
    embeddings = model.base_model.embeddings
    new = embeddings.position_embeddings.weight
    assert new.shape == (offset + 300, old.shape[1]) and model.config.max_position_embeddings == offset + 300
    assert usable_positions(model.config) == 300 and tokenizer.model_max_length == 300
    assert torch.equal(new[: old.shape[0]], old), "the first positions keep their rows (and the padding rows)"
    for copy in (1, 2):  # the learned rows again, from the first token's row on
        start = offset + copy * limit
        end = min(start + limit, new.shape[0])
        assert torch.equal(new[start:end], old[offset : offset + end - start])
    assert embeddings.position_ids.shape == (1, offset + 300)
    if hasattr(embeddings, "token_type_ids"):
        assert embeddings.token_type_ids.shape == (1, offset + 300)
    ids = torch.randint(5, 250, (2, 290))
    ids[:, 0] = tokenizer.cls_token_id
    with torch.no_grad():
        output = model(input_ids=ids, attention_mask=torch.ones_like(ids))  # beyond the old limit of 128
    assert output.sentence_embedding.shape == (2, model.config.hidden_size)


def test_extend_position_embeddings_is_refused_for_rotary_and_shorter(tiny_modernbert, tiny_roberta, corpus, tmp_path,
                                                                      capsys):
    assert main(tiny_run(tiny_modernbert, corpus, tmp_path / "m", "--extend-position-embeddings", "512")) == 2
    err = capsys.readouterr().err
    assert "rotary positions" in err and "Traceback" not in err
    assert main(tiny_run(tiny_roberta, corpus, tmp_path / "r", "--extend-position-embeddings", "128")) == 2
    assert "must exceed the model's 128 usable positions" in capsys.readouterr().err


def test_pretrain_with_extended_positions(tiny_roberta, tmp_path):
    long_corpus = write_lines(tmp_path / "long.txt", [" ".join(SENTENCES * 4)] * 8)
    out = tmp_path / "run"
    assert main(tiny_run(tiny_roberta, long_corpus, out, "--extend-position-embeddings", "192", "--max-seq-length",
                         "192", "--per-device-train-batch-size", "2")) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["max_position_embeddings"] == 192 + 2
    assert load_file(str(out / "model.safetensors"))["roberta.embeddings.position_embeddings.weight"].shape[0] == 194
    assert AutoTokenizer.from_pretrained(str(out)).model_max_length == 192
    assert json.loads((out / "retromae_run.json").read_text())["global_step"] == 2


def test_a_large_vocabulary_gets_a_smaller_loss_chunk(tmp_path, caplog):
    folder = tmp_path / "xlmr-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "xlm-roberta", "vocab_size": 250002}))
    method = METHODS["retromae"]
    settings: dict = {}
    with caplog.at_level(logging.INFO, logger="retromae"):
        scale_loss_chunk(settings, method, str(folder))
    assert settings["loss_chunk_size"] == 4096 * 30522 // 250002
    assert any("loss_chunk_size 500" in r.getMessage() for r in caplog.records)
    given = {"loss_chunk_size": 1024}
    scale_loss_chunk(given, method, str(folder))
    assert given == {"loss_chunk_size": 1024}, "the user's value stays"
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    unchanged: dict = {}
    scale_loss_chunk(unchanged, method, str(folder))
    assert unchanged == {}, "BERT's vocabulary keeps the default"


@pytest.mark.parametrize("family", ["roberta", "modernbert"])
def test_validation_and_coverage_use_the_familys_encoder_and_head(family, request):
    base = family_folder(request, family)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model = DupMAEForPretraining.from_encoder_checkpoint(
        base, dense_dim=16, doc_top_k=8, query_top_k=12, special_token_ids=sorted(set(tokenizer.all_special_ids)))
    batch = dict(tokenizer(SENTENCES[:3], padding=True, return_tensors="pt"))
    batch = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with validation.evaluation_mode(model), torch.no_grad():
        vectors = validation.sentence_vectors(model, batch, "document")
        hidden = model.encode(batch["input_ids"], batch["attention_mask"])
    assert set(vectors) == {"", "cls_"} and vectors[""].shape == (3, 16 + model.config.vocab_size)
    torch.testing.assert_close(vectors["cls_"], hidden[:, 0])
    for projection in ("embeddings", "lm_head"):
        result = input_token_coverage(model, tokenizer, SENTENCES, ks=(5, 10), projection=projection)
        assert set(result) == {5, 10} and all(0 <= v <= 1 for v in result.values())
    from_folder = input_token_coverage(str(base), None, SENTENCES, ks=(5,), projection="lm_head")
    assert 0 <= from_folder[5] <= 1


def test_pretrain_validates_on_a_family_base(tiny_xlm_roberta, corpus, tmp_path):
    beir = write_beir(tmp_path / "beir")
    out = tmp_path / "run"
    assert main(tiny_run(tiny_xlm_roberta, corpus, out, "--method", "dupmae", *TINY_OPTIONS["dupmae"],
                         "--eval-beir-folder", str(beir), "--eval-max-queries", "5", "--eval-coverage", "true")) == 0
    logs = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    evaluated = [e for e in logs if "eval_ndcg@10" in e]
    assert evaluated and all("eval_cls_ndcg@10" in e and "eval_coverage@10" in e for e in evaluated)


def test_card_hyperparameters_leave_out_the_bases_architecture(tiny_modernbert):
    model = RetroMAEForPretraining.from_encoder_checkpoint(tiny_modernbert)
    rows = dict(method_hyperparameters(METHODS["retromae"], model.config.to_dict()))
    assert "encoder_mask_ratio" in rows and "decoding" in rows
    assert not {"norm_eps", "layer_types", "rope_parameters", "global_attn_every_n_layers", "local_attention",
                "encoder_type", "sliding_window"} & rows.keys()
