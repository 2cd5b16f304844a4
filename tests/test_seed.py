"""SEED-Encoder: windowed causal decoder (no leakage beyond the receptive field), targets, losses, checkpoints."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from conftest import run_without_retromae, tiny_bert_kwargs
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_seed import SEEDConfig
from retromae.modeling.modeling_seed import (
    SEEDEncoderForPretraining,
    SEEDEncoderModel,
    next_token_targets,
    windowed_causal_visibility,
)
from transformers import BertModel

VOCAB = 99


def tiny_config(**kw) -> SEEDConfig:
    return SEEDConfig(**tiny_bert_kwargs(vocab_size=VOCAB, max_position_embeddings=64), **kw)


def make_batch(batch_size: int = 3, seq_len: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows [CLS]=2 ... [SEP]=3, the last row padded by 3; the encoder masks positions 2 and 5 with [MASK]=4."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch_size, seq_len), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    attention = torch.ones_like(ids)
    ids[-1, -3:], attention[-1, -3:] = 0, 0
    ids[-1, -4] = 3
    decoder_labels = ids.masked_fill((ids <= 3) | (attention == 0), -100)
    encoder_labels = torch.full_like(ids, -100)
    encoder_labels[:, [2, 5]] = ids[:, [2, 5]]
    masked = ids.clone()
    masked[:, [2, 5]] = 4
    return {"input_ids": masked, "attention_mask": attention, "encoder_labels": encoder_labels,
            "decoder_labels": decoder_labels}


# ---- config -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attention_window": 0}, "attention_window"),
        ({"attention_window": -2}, "attention_window"),
        ({"decoder_layers": 0}, "decoder_layers"),
        ({"decoder_init": "x"}, "decoder_init"),
        ({"decoder_loss_weight": -1.0}, "decoder_loss_weight"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field) as error:
        tiny_config(**kwargs)
    assert isinstance(error.value, ValueError) or isinstance(error.value.__cause__, ValueError)


def test_config_defaults_follow_the_paper():
    config = SEEDConfig()
    assert (config.decoder_layers, config.attention_window, config.model_type) == (3, 2, "seed_encoder")


# ---- mask and targets ---------------------------------------------------------------------------------------------


def test_visibility_matches_the_reference_mask_for_k2():
    # microsoft/SEED-Encoder buffered_future_mask, k=2, L=6: column 0 plus positions i-1, i
    expected = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                             [1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 0], [1, 0, 0, 0, 1, 1]]).bool()
    assert torch.equal(windowed_causal_visibility(torch.ones(1, 6), 2)[0, 0], expected)


def test_padding_columns_are_never_visible_and_no_row_is_empty():
    visible = windowed_causal_visibility(torch.tensor([[1, 1, 1, 1, 0, 0]]), 3)[0, 0]  # (6, 6)
    assert not visible[:, 4:].any()
    assert visible[:, 0].all()


def test_next_token_targets_by_hand():
    # o = [CLS, a, b, c, SEP, pad]: labels [-100, a, b, c, -100, -100]; input [h, a, b, c, SEP, pad]
    labels = torch.tensor([[-100, 11, 12, 13, -100, -100]])
    # position 0 (h) -> a, 1 (a) -> b, 2 (b) -> c, 3 (c) -> SEP: not a target, rest none
    assert next_token_targets(labels).tolist() == [[11, 12, 13, -100, -100, -100]]


# ---- leakage ------------------------------------------------------------------------------------------------------


def _decoder_states(model, h, ids, attention):
    with torch.no_grad():
        return model.decoder(h, ids, attention, model.bert.embeddings)


@pytest.mark.parametrize(("layers", "window"), [(1, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_token_outside_the_receptive_field_leaks(layers, window, attn):
    """Each layer attends to h and the previous `window` positions, so after N layers position j depends on h and the
    positions j - N(window - 1) ... j (for N=1: exactly the window). A token just outside must not move position j's
    state (eval mode: no dropout); the farthest token inside, the nearest, and h must."""
    torch.manual_seed(0)
    # large init so that influences through several layers are far above float noise
    config = tiny_config(decoder_layers=layers, attention_window=window, initializer_range=0.3)
    model = SEEDEncoderForPretraining(config).eval()
    model.set_attn_implementation(attn)
    seq_len, j = 16, 12
    reach = layers * (window - 1)
    ids = torch.randint(5, VOCAB, (1, seq_len))
    ids[0, 0] = 2
    attention = torch.ones_like(ids)
    h = torch.randn(1, 32)
    base = _decoder_states(model, h, ids, attention)

    def change(position: int) -> float:
        changed = ids.clone()
        changed[0, position] = 5 if ids[0, position] != 5 else 6
        return (_decoder_states(model, h, changed, attention)[0, j] - base[0, j]).abs().max().item()

    assert change(j - reach - 1) == 0.0  # just outside the receptive field: bit-identical
    assert change(1) == 0.0
    assert change(j + 1) == 0.0  # the future: causal
    assert change(j - reach) > 1e-3 and change(j) > 1e-3
    assert (_decoder_states(model, h + 1.0, ids, attention)[0, j] - base[0, j]).abs().max() > 1e-3


def test_eager_and_sdpa_give_the_same_losses():
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config()).eval()
    batch = make_batch()
    sdpa = model(**batch)
    model.set_attn_implementation("eager")
    eager = model(**batch)
    assert torch.allclose(sdpa.loss, eager.loss, atol=1e-5)


# ---- model --------------------------------------------------------------------------------------------------------


def test_forward_backward_and_parameter_layout():
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config(decoder_loss_weight=0.5))
    assert len(model.decoder.layers) == 3
    assert {k.split(".")[0] for k in model.state_dict()} == {"bert", "cls", "decoder"}
    # decoder layers keep BertLayer names: the encoder's last layer loads into them
    model.decoder.layers[0].load_state_dict(model.bert.encoder.layer[-1].state_dict())
    batch = make_batch()
    out = model(**batch)
    assert out.sentence_embedding.shape == (3, 32) and out.bow_loss is None
    assert torch.allclose(out.loss, out.encoder_mlm_loss + 0.5 * out.decoder_loss)
    out.decoder_loss.backward()  # the decoder loss alone reaches the encoder only through h
    assert model.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert model.decoder.layers[-1].output.dense.weight.grad.abs().sum() > 0
    assert model(input_ids=batch["input_ids"]).loss is None


def test_decoder_loss_is_the_mean_over_every_real_non_special_token():
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config()).eval()
    batch = make_batch()
    with torch.no_grad():
        out = model(**batch)
        h = out.sentence_embedding
        original = torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["input_ids"])
        states = model.decoder(h, original, batch["attention_mask"], model.bert.embeddings)
        logits = model.cls(states)  # (B, L, V)
    targets = next_token_targets(batch["decoder_labels"])
    assert (targets != -100).sum() == (batch["decoder_labels"] != -100).sum()  # each token predicted once
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
    assert out.decoder_loss.item() == pytest.approx(expected.item(), abs=1e-5)


# ---- checkpoints --------------------------------------------------------------------------------------------------


def test_from_encoder_checkpoint_minilm_reports_only_the_heads_new(minilm_dir, caplog):
    caplog.set_level(logging.INFO, logger="retromae.modeling.pretraining_base")
    model = SEEDEncoderForPretraining.from_encoder_checkpoint(minilm_dir, decoder_layers=1, decoder_init="copy_last_layer")
    new = [r.args[1] for r in caplog.records if r.getMessage().startswith("Initialised from scratch")]
    assert new == [["cls.predictions", "decoder.layers"]]
    assert torch.equal(model.decoder.layers[0].intermediate.dense.weight, model.bert.encoder.layer[-1].intermediate.dense.weight)
    assert model.decoder.layers[0].intermediate.dense.weight.data_ptr() != model.bert.encoder.layer[-1].intermediate.dense.weight.data_ptr()
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


LOAD_AND_COMPARE = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining
try:
    import retromae  # noqa: F401
    sys.exit("retromae must not be importable here")
except ImportError:
    pass
d = sys.argv[1]
config = AutoConfig.from_pretrained(d, trust_remote_code=True)
encoder = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
full = AutoModelForPreTraining.from_pretrained(d, trust_remote_code=True).eval()
batch = {k: torch.tensor(v) for k, v in json.load(open(d + "/batch.json")).items()}
with torch.no_grad():
    cls = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).pooler_output
    out = full(**batch)
print(json.dumps({"config": type(config).__name__, "encoder": type(encoder).__name__, "full": type(full).__name__,
                  "window": config.attention_window, "layers": len(full.decoder.layers), "cls": cls.tolist(),
                  "loss": out.loss.item(), "decoder_loss": out.decoder_loss.item()}))
"""


def test_checkpoint_loads_as_remote_code_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config(decoder_layers=2, attention_window=3)).eval()
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    batch = make_batch()
    (checkpoint / "batch.json").write_text(json.dumps({k: v.tolist() for k, v in batch.items()}))
    saved = json.loads((checkpoint / "config.json").read_text())
    assert saved["model_type"] == "seed_encoder"
    assert saved["auto_map"] == {
        "AutoConfig": "configuration_seed.SEEDConfig",
        "AutoModel": "modeling_seed.SEEDEncoderModel",
        "AutoModelForPreTraining": "modeling_seed.SEEDEncoderForPretraining",
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = run_without_retromae(LOAD_AND_COMPARE, [str(checkpoint)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert (got["config"], got["encoder"], got["full"]) == ("SEEDConfig", "SEEDEncoderModel", "SEEDEncoderForPretraining")
    assert (got["window"], got["layers"]) == (3, 2)
    with torch.no_grad():
        out = model(**batch)
    assert torch.allclose(torch.tensor(got["cls"]), out.sentence_embedding, atol=1e-6)
    assert abs(got["decoder_loss"] - out.decoder_loss.item()) < 1e-5  # decoder weights saved and reloaded
    assert abs(got["loss"] - out.loss.item()) < 1e-5


def test_encoder_class_and_plain_bert_load_the_checkpoint_by_prefix(tmp_path):
    model = SEEDEncoderForPretraining(tiny_config()).eval()
    model.save_pretrained(tmp_path)
    batch = make_batch()
    with torch.no_grad():
        expected = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).sentence_embedding
    for klass in (SEEDEncoderModel, BertModel):
        encoder, info = klass.from_pretrained(tmp_path, output_loading_info=True)
        assert not [k for k in info["missing_keys"] if "pooler" not in k]
        assert any(k.startswith("decoder.") for k in info["unexpected_keys"])
        with torch.no_grad():
            got = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
        assert torch.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize(("layers", "window"), [(3, 2), (2, 3)])
def test_total_window_scope_keeps_the_papers_receptive_field_of_k(layers, window):
    """Paper eq. 9: x_t is predicted from h and x_{t-k} ... x_{t-1} only. The decoder position that predicts x_t is
    t-1 (shifted input), so changing the token at position t-k-1 (x_{t-k-1}) must leave it bit-identical under
    `attention_window_scope="total"`; with the per-layer window (reference code) it moves it."""
    torch.manual_seed(0)
    seq_len, t = 16, 13
    ids = torch.randint(5, VOCAB, (1, seq_len))
    ids[0, 0] = 2
    attention = torch.ones_like(ids)
    h = torch.randn(1, 32)
    changed = ids.clone()
    changed[0, t - window - 1] = 5 if ids[0, t - window - 1] != 5 else 6

    def moved(scope: str) -> float:
        torch.manual_seed(0)
        config = tiny_config(decoder_layers=layers, attention_window=window, initializer_range=0.3,
                             attention_window_scope=scope)
        model = SEEDEncoderForPretraining(config).eval()
        before, after = _decoder_states(model, h, ids, attention), _decoder_states(model, h, changed, attention)
        return (after[0, t - 1] - before[0, t - 1]).abs().max().item()

    assert moved("total") == 0.0
    assert moved("per_layer") > 1e-3
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config(decoder_layers=layers, attention_window=window,
                                                  attention_window_scope="total", initializer_range=0.3)).eval()
    nearest = ids.clone()
    nearest[0, t - window] = 5 if ids[0, t - window] != 5 else 6  # x_{t-k}: inside the paper's window
    assert (_decoder_states(model, h, nearest, attention)[0, t - 1] - _decoder_states(model, h, ids, attention)[0, t - 1]).abs().max() > 1e-3


def test_attention_window_scope_is_checked():
    with pytest.raises((ValueError, StrictDataclassError), match="attention_window_scope"):
        tiny_config(attention_window_scope="global")
    assert SEEDConfig().attention_window_scope == "per_layer"
