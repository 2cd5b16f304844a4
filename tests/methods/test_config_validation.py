"""What every method's config shares: `from_pretrained(path, field=value)` overrides validated as constructor arguments,
refusals that are `ValueError` / `TypeError`, its own `model_type` when built from a base's config.json, and loss
weights that must be finite."""

from __future__ import annotations

import json
import math

import pytest
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_bow import BoWConfig
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.configuration_seed import SEEDConfig
from retromae.modeling.configuration_sentmae import SentMAEConfig
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.modeling_sentmae import SentMAEForPretraining
from retromae.trainers.export.sentence_transformer import export_from_model

from ..builders import tiny_bert_kwargs, tiny_pretraining_config

MODELS = [RetroMAEForPretraining, DupMAEForPretraining, BoWForPretraining, SEEDEncoderForPretraining,
          SentMAEForPretraining]
# one value each config's class validator refuses, and the field it names
REFUSED = {
    RetroMAEConfig: ("decoder_mask_ratio", 5.0),
    DupMAEConfig: ("dense_dim", 33),  # above hidden_size=32
    BoWConfig: ("bow_weight_final", -1.0),
    SEEDConfig: ("attention_window", 0),
    SentMAEConfig: ("temperature", 0.0),
}


def tiny_fields(config_class: type) -> dict:
    """The fields a tiny config of `config_class` needs beyond BERT's sizes (DupMAE's d' and k fit hidden_size 32)."""
    return {"dense_dim": 16, "doc_top_k": 8} if issubclass(config_class, DupMAEConfig) else {}


# ---- from_pretrained overrides (B-003) --------------------------------------------------------------------------


@pytest.mark.parametrize("config_class", list(REFUSED), ids=lambda c: c.__name__)
def test_from_pretrained_override_is_validated(config_class, tmp_path):
    """transformers sets `from_pretrained`'s overrides after construction, which no class validator sees: the
    override of a valid saved config is refused as the constructor refuses it."""
    field, value = REFUSED[config_class]
    tiny_pretraining_config(config_class, **tiny_fields(config_class)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"{field}={value}"):
        config_class.from_pretrained(tmp_path, **{field: value})


def test_model_from_pretrained_override_is_validated(tmp_path):
    """The model's `from_pretrained` passes the overrides to its config: refused before any weight is built."""
    RetroMAEForPretraining(tiny_pretraining_config(RetroMAEConfig)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="decoder_mask_ratio=5.0 must lie in the open interval"):
        RetroMAEForPretraining.from_pretrained(tmp_path, decoder_mask_ratio=5.0)
    with pytest.raises(ValueError, match="num_decoder_layers=3 with decoding='enhanced'"):
        RetroMAEForPretraining.from_pretrained(tmp_path, num_decoder_layers=3)
    model = RetroMAEForPretraining.from_pretrained(tmp_path, decoding="basic", num_decoder_layers=3)
    assert (model.config.decoding, len(model.decoder.layers)) == ("basic", 3)


def test_valid_override_replaces_the_default_it_overrides(tiny_bert):
    """DupMAE's default d' (384) exceeds the tiny BERT's hidden size (32): an override that fits is accepted, not
    refused for the default it replaces."""
    assert DupMAEConfig.from_pretrained(tiny_bert, dense_dim=16).dense_dim == 16
    assert DupMAEForPretraining.from_pretrained(tiny_bert, dense_dim=16).config.dense_dim == 16


def test_other_kwargs_keep_transformers_handling(tmp_path):
    """Only the config's own fields (and their legacy names) are merged: PreTrainedConfig's and unknown kwargs keep
    transformers' handling (`return_unused_kwargs`); a file's legacy key yields to an override of its new name."""
    tiny_pretraining_config(SEEDConfig).save_pretrained(tmp_path)
    config, unused = SEEDConfig.from_pretrained(tmp_path, num_decoder_layers=2, output_hidden_states=True, foo=1,
                                                return_unused_kwargs=True)
    assert (config.num_decoder_layers, config.output_hidden_states, unused) == (2, True, {"foo": 1})
    assert SEEDConfig.from_pretrained(tmp_path, decoder_layers=1).num_decoder_layers == 1  # the legacy name
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["decoder_layers"] = saved.pop("num_decoder_layers")  # a file written before the rename
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert SEEDConfig.from_pretrained(tmp_path).num_decoder_layers == 3
    assert SEEDConfig.from_pretrained(tmp_path, num_decoder_layers=1).num_decoder_layers == 1


def test_model_refuses_a_config_made_invalid_after_construction():
    """An assignment runs the field's type check only; the model's constructor runs the class validators."""
    config = tiny_pretraining_config(RetroMAEConfig)
    config.decoder_mask_ratio = 2.0
    with pytest.raises(ValueError, match="decoder_mask_ratio=2.0 must lie in the open interval"):
        RetroMAEForPretraining(config)


# ---- ValueError / TypeError (B-004) -------------------------------------------------------------------------------


@pytest.mark.parametrize("config_class", list(REFUSED), ids=lambda c: c.__name__)
def test_config_refusals_are_value_and_type_errors(config_class):
    """The README's "Python" section: bad input raises a ValueError or TypeError whose one-line message names the
    field; still huggingface_hub's StrictDataclassError, the validator's error as its cause."""
    field, value = REFUSED[config_class]
    with pytest.raises(ValueError) as refused:
        tiny_pretraining_config(config_class, **{**tiny_fields(config_class), field: value})
    assert str(refused.value).startswith(f"{field}={value}") and "\n" not in str(refused.value)
    assert isinstance(refused.value, StrictDataclassError) and isinstance(refused.value.__cause__, ValueError)
    with pytest.raises(TypeError, match=r"^Field 'encoder_mask_ratio' ") as wrong_type:
        tiny_pretraining_config(config_class, **tiny_fields(config_class), encoder_mask_ratio="0.3")
    assert isinstance(wrong_type.value, StrictDataclassError) and "\n" not in str(wrong_type.value)
    config = tiny_pretraining_config(config_class, **tiny_fields(config_class))
    with pytest.raises(TypeError, match="encoder_mask_ratio"):
        config.encoder_mask_ratio = "0.3"


@pytest.mark.parametrize("build", ["from_encoder_checkpoint", "from_encoder_config"])
def test_entry_points_raise_value_and_type_errors(build, tiny_bert):
    with pytest.raises(ValueError, match="decoder_mask_ratio=5.0"):
        getattr(RetroMAEForPretraining, build)(tiny_bert, decoder_mask_ratio=5.0)
    with pytest.raises(TypeError, match=r"'decoding' expected one of \('enhanced', 'basic'\), got fancy"):
        getattr(RetroMAEForPretraining, build)(tiny_bert, decoding="fancy")


# ---- model_type (B-005) -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_every_config_reports_its_own_model_type(model_class, tiny_bert):
    """Built from a plain BERT's config.json (`model_type: bert`), the config is still the method's."""
    config_class = model_class.config_class
    config = config_class.from_pretrained(tiny_bert, **tiny_fields(config_class))
    assert config.model_type == config_class.model_type and "model_type" not in vars(config)
    model = model_class.from_pretrained(tiny_bert, **tiny_fields(config_class))
    assert model.config.model_type == config_class.model_type
    assert config_class(model_type="bert").model_type == config_class.model_type
    assert config_class.from_pretrained(tiny_bert, model_type="bert", **tiny_fields(config_class)).model_type == (
        config_class.model_type)  # an override too (probe 75)


def test_model_loaded_from_plain_bert_exports(tiny_bert, tokenizer, tmp_path):
    """The most direct transformers call gives a RetroMAE model that exports as one."""
    model = RetroMAEForPretraining.from_pretrained(tiny_bert)
    assert model.config.model_type == "retromae"
    output = export_from_model(model, tokenizer, tmp_path / "st")
    assert (output / "modules.json").is_file()


# ---- finite loss weights (B-006) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config_class", "field"),
    [(RetroMAEConfig, "encoder_loss_weight"), (RetroMAEConfig, "decoder_loss_weight"), (DupMAEConfig, "bow_loss_weight"),
     (BoWConfig, "bow_loss_weight"), (BoWConfig, "bow_weight_final"), (SEEDConfig, "decoder_loss_weight"),
     (SentMAEConfig, "contrastive_loss_weight"), (SentMAEConfig, "temperature")],
)
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_loss_weights_and_temperature_must_be_finite(config_class, field, value):
    """`weight < 0` is False for NaN: a NaN or inf weight made every loss NaN from the first step."""
    with pytest.raises(ValueError, match=rf"^{field}={value} must be a finite number"):
        tiny_pretraining_config(config_class, **tiny_fields(config_class), **{field: value})


# ---- Python spelling in hints (B-007) -----------------------------------------------------------------------------


def test_dense_dim_hint_gives_the_python_spelling():
    with pytest.raises(ValueError) as error:
        DupMAEConfig(**tiny_bert_kwargs(), dense_dim=384)  # the paper's d' on hidden_size 32
    assert """set it with dense_dim=32 (CLI: --method-options '{"dense_dim": 32}'""" in str(error.value)
