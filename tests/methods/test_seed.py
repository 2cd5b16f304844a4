"""SEED-Encoder: windowed causal decoder (no leakage beyond the receptive field), targets, losses, checkpoints."""

from __future__ import annotations

import logging
from functools import partial

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_seed import SEEDConfig
from retromae.modeling.modeling_seed import (
    SEEDEncoderForPretraining,
    next_token_targets,
    windowed_causal_visibility,
)

from ..builders import (
    TINY_VOCAB,
    assert_loads_as_remote_code,
    load_with_legacy_key,
    masked_batch,
    tiny_pretraining_config,
)

tiny_config = partial(tiny_pretraining_config, SEEDConfig)


# ---- config -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"attention_window": 0}, "attention_window"),
        ({"attention_window": -2}, "attention_window"),
        ({"num_decoder_layers": 0}, "num_decoder_layers"),
        ({"decoder_init": "x"}, "decoder_init"),
        ({"decoder_loss_weight": -1.0}, "decoder_loss_weight"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field) as error:
        tiny_config(**kwargs)
    # a validator's ValueError, or @strict's TypeError for a value outside a Literal field's choices
    assert isinstance(error.value, ValueError) or isinstance(error.value.__cause__, ValueError | TypeError)


def test_config_defaults_follow_the_paper():
    config = SEEDConfig()
    assert (config.num_decoder_layers, config.attention_window, config.model_type) == (3, 2, "seed_encoder")


def test_legacy_decoder_layers_key_loads_with_a_deprecation_warning(tmp_path, caplog):
    loaded = load_with_legacy_key(tiny_config(num_decoder_layers=2), tmp_path, "decoder_layers", "num_decoder_layers",
                                  caplog)
    assert len(SEEDEncoderForPretraining(loaded).decoder.layers) == 2


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
        return model.decoder(h, ids, attention, model.decoder_embeddings())


@pytest.mark.parametrize(("layers", "window"), [(1, 2), (3, 2), (2, 3)])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_no_token_outside_the_receptive_field_leaks(layers, window, attn):
    """Each layer attends to h and the previous `window` positions, so after N layers position j depends on h and the
    positions j - N(window - 1) ... j (for N=1: exactly the window). A token just outside must not move position j's
    state (eval mode: no dropout); the farthest token inside, the nearest, and h must."""
    torch.manual_seed(0)
    # large init so that influences through several layers are far above float noise
    config = tiny_config(num_decoder_layers=layers, attention_window=window, initializer_range=0.3)
    model = SEEDEncoderForPretraining(config).eval()
    model.set_attn_implementation(attn)
    seq_len, j = 16, 12
    reach = layers * (window - 1)
    ids = torch.randint(5, TINY_VOCAB, (1, seq_len))
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
    batch = masked_batch()
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
    batch = masked_batch()
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
    batch = masked_batch()
    with torch.no_grad():
        out = model(**batch)
        h = out.sentence_embedding
        original = torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["input_ids"])
        states = model.decoder(h, original, batch["attention_mask"], model.decoder_embeddings())
        logits = model.cls(states)  # (B, L, V)
    targets = next_token_targets(batch["decoder_labels"])
    assert (targets != -100).sum() == (batch["decoder_labels"] != -100).sum()  # each token predicted once
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, TINY_VOCAB), targets.reshape(-1), ignore_index=-100)
    assert out.decoder_loss.item() == pytest.approx(expected.item(), abs=1e-5)


# ---- checkpoints --------------------------------------------------------------------------------------------------


def test_from_encoder_checkpoint_minilm_reports_only_the_heads_new(minilm_dir, caplog):
    caplog.set_level(logging.INFO, logger="retromae.modeling.pretraining_base")
    model = SEEDEncoderForPretraining.from_encoder_checkpoint(minilm_dir, num_decoder_layers=1, decoder_init="copy_last_layer")
    new = [r.args[1] for r in caplog.records if r.getMessage().startswith("Initialised from scratch")]
    assert new == [["cls.predictions", "decoder.layers"]]
    assert torch.equal(model.decoder.layers[0].intermediate.dense.weight, model.bert.encoder.layer[-1].intermediate.dense.weight)
    assert model.decoder.layers[0].intermediate.dense.weight.data_ptr() != model.bert.encoder.layer[-1].intermediate.dense.weight.data_ptr()
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


@pytest.mark.long
def test_checkpoint_loads_as_remote_code_in_a_fresh_process(run_without_retromae, tmp_path):
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config(num_decoder_layers=2, attention_window=3)).eval()
    # the losses compared include decoder_loss: the decoder weights are saved and reloaded
    _, saved, got = assert_loads_as_remote_code(run_without_retromae, model, tmp_path, "seed",
                                                ("SEEDConfig", "SEEDEncoderModel", "SEEDEncoderForPretraining"))
    assert saved["model_type"] == "seed_encoder"
    assert (got["config"]["attention_window"], got["decoder_layers"]) == (3, 2)


@pytest.mark.parametrize(("layers", "window"), [(3, 2), (2, 3)])
def test_total_window_scope_keeps_the_papers_receptive_field_of_k(layers, window):
    """Paper eq. 9: x_t is predicted from h and x_{t-k} ... x_{t-1} only. The decoder position that predicts x_t is
    t-1 (shifted input), so changing the token at position t-k-1 (x_{t-k-1}) must leave it bit-identical under
    `attention_window_scope="total"`; with the per-layer window (reference code) it moves it."""
    torch.manual_seed(0)
    seq_len, t = 16, 13
    ids = torch.randint(5, TINY_VOCAB, (1, seq_len))
    ids[0, 0] = 2
    attention = torch.ones_like(ids)
    h = torch.randn(1, 32)
    changed = ids.clone()
    changed[0, t - window - 1] = 5 if ids[0, t - window - 1] != 5 else 6

    def moved(scope: str) -> float:
        torch.manual_seed(0)
        config = tiny_config(num_decoder_layers=layers, attention_window=window, initializer_range=0.3,
                             attention_window_scope=scope)
        model = SEEDEncoderForPretraining(config).eval()
        before, after = _decoder_states(model, h, ids, attention), _decoder_states(model, h, changed, attention)
        return (after[0, t - 1] - before[0, t - 1]).abs().max().item()

    assert moved("total") == 0.0
    assert moved("per_layer") > 1e-3
    torch.manual_seed(0)
    model = SEEDEncoderForPretraining(tiny_config(num_decoder_layers=layers, attention_window=window,
                                                  attention_window_scope="total", initializer_range=0.3)).eval()
    nearest = ids.clone()
    nearest[0, t - window] = 5 if ids[0, t - window] != 5 else 6  # x_{t-k}: inside the paper's window
    assert (_decoder_states(model, h, nearest, attention)[0, t - 1] - _decoder_states(model, h, ids, attention)[0, t - 1]).abs().max() > 1e-3


def test_attention_window_scope_is_checked():
    with pytest.raises((ValueError, StrictDataclassError), match="attention_window_scope"):
        tiny_config(attention_window_scope="global")
    assert SEEDConfig().attention_window_scope == "per_layer"
