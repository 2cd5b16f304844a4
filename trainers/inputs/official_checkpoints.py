"""Checkpoints of the official RetroMAE code (github.com/staoxiao/RetroMAE, `src/pretrain`, transformers 4.x) as our
RetroMAE pre-training checkpoints, so that `retromae pretrain --model OUT` continues the run, decoder included.

The official `RetroMAEForPretraining` holds `lm` (a `BertForMaskedLM`), `c_head` (its one decoder layer, with a
`BertLayer`'s parameters) and `decoder_embeddings` (the very module `lm.bert.embeddings`). Its save
(`save_pretrained`, what its `PreTrainer` writes as the output and as every checkpoint-N) keeps `lm` alone; `c_head`
must come from the model's `state_dict()` (in the checkpoint's weights or a separate safetensors file). Key map:

    bert.*  or lm.bert.*      -> bert.*               the encoder (its embeddings are the decoder's too)
    cls.*   or lm.cls.*       -> cls.*                the MLM head of encoder and decoder
    c_head.*                  -> decoder.layers.0.*   the decoder layer (same parameter names)
    decoder_embeddings.*      -> bert.embeddings.*    the same module: kept only where lm's copy is absent
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from retromae.modeling.backbones import BertBackbone
from retromae.modeling.loading import base_config_fields
from safetensors.torch import load_file
from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..methods import METHODS, get_method
from .checkpoints import CheckpointError, load_tokenizer, read_state_dict
from .folders import check_model_folder
from .outputs import atomic_folder

# our config fields for the official objective: enhanced decoding with h + p_i queries, the official collator's
# whole-word visibility masks and targets (every token but the first and the last), plain sum of the two losses
OFFICIAL_SETTINGS = {
    "decoding": "enhanced", "num_decoder_layers": 1, "query_stream": "position", "whole_word_mask": True,
    "decoder_visibility": "reference", "decoder_targets": "reference", "encoder_loss_weight": 1.0,
    "decoder_loss_weight": 1.0,
}
# the official objective is RetroMAE's: its model class comes from the registry
OFFICIAL_METHOD = "retromae"
# the official defaults of --encoder_mlm_probability / --decoder_mlm_probability (its arguments.py)
OFFICIAL_ENCODER_MASK_RATIO, OFFICIAL_DECODER_MASK_RATIO = 0.3, 0.5
DECODER_PREFIX = "c_head."
OURS_DECODER_PREFIX = "decoder.layers.0."
# the MLM output layer is tied to the word embeddings and the head's bias: a save may hold either name
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
NOT_OURS = ("bert.pooler.", "cls.seq_relationship.", "bert.embeddings.position_ids")  # unused by our models
DECODER_HINT = ("the official save (save_pretrained) keeps the encoder only: pass --decoder FILE, a .safetensors of "
                "the official model's c_head weights (safetensors.torch.save_file(model.c_head.state_dict(), FILE)), "
                "or, to go on with a fresh decoder, give the folder to `retromae pretrain --model` as it is")


def official_config(checkpoint: Path, tokenizer: PreTrainedTokenizerBase, encoder_mask_ratio: float,
                    decoder_mask_ratio: float) -> PreTrainedConfig:
    """Our `RetroMAEConfig`: the official BERT config's architecture, `OFFICIAL_SETTINGS`, the given mask ratios
    and the tokenizer's mask id. `CheckpointError` when config.json does not describe a BERT."""
    model_type = json.loads((checkpoint / "config.json").read_text(encoding="utf-8")).get("model_type")
    ours = {method.model_class.config_class.model_type: name for name, method in METHODS.items()}
    if model_type in ours:
        raise CheckpointError(f"{checkpoint} is already a retromae pre-training checkpoint (method "
                              f"{ours[model_type]}), not an official one: continue it with `retromae pretrain --model`")
    if model_type not in BertBackbone.model_types:
        raise CheckpointError(f"{checkpoint} is not an official RetroMAE checkpoint: its config.json has model_type "
                              f"{model_type!r}; the official code saves a BertForMaskedLM (model_type 'bert')")
    fields = base_config_fields(checkpoint, model_type)
    return get_method(OFFICIAL_METHOD).model_class.config_class(
        **fields, **OFFICIAL_SETTINGS, encoder_mask_ratio=float(encoder_mask_ratio),
        decoder_mask_ratio=float(decoder_mask_ratio), mask_token_id=tokenizer.mask_token_id,
    )


def decoder_weights(state: dict[str, torch.Tensor], decoder_file: Path | None, checkpoint: Path
                    ) -> dict[str, torch.Tensor]:
    """The official decoder layer under our names (`decoder.layers.0.*`): the `c_head.*` weights of `decoder_file`
    (keys with or without the `c_head.` prefix) or, without one, of the checkpoint's own weights."""
    if decoder_file is not None:
        if not decoder_file.is_file():
            raise CheckpointError(f"--decoder {decoder_file}: no such file")
        if decoder_file.suffix != ".safetensors":
            raise CheckpointError(f"--decoder {decoder_file}: not a .safetensors file (pickle weights are not read; "
                                  "save them with safetensors.torch.save_file)")
        found = load_file(decoder_file)
        prefixed = any(k.startswith(DECODER_PREFIX) for k in found)  # a whole-model state dict, or c_head's own
        layer = {k.removeprefix(DECODER_PREFIX): v for k, v in found.items() if k.startswith(DECODER_PREFIX) or not prefixed}
        where = f"--decoder {decoder_file}"
    else:
        layer = {k.removeprefix(DECODER_PREFIX): v for k, v in state.items() if k.startswith(DECODER_PREFIX)}
        where = str(checkpoint)
    if not layer:
        raise CheckpointError(f"{where} holds no decoder weights (c_head.*); {DECODER_HINT}")
    return {OURS_DECODER_PREFIX + k: v for k, v in layer.items()}


def encoder_weights(state: dict[str, torch.Tensor], checkpoint: Path) -> dict[str, torch.Tensor]:
    """`lm`'s weights under our names (`bert.*`, `cls.*`) from a `save_pretrained` of `lm` or a whole-model
    `state_dict()` (`lm.*`, `decoder_embeddings.*`); `CheckpointError` when the two copies of the embeddings differ,
    which the official model (one module) never saves."""
    mapped = {k.removeprefix("lm."): v for k, v in state.items() if k.startswith(("bert.", "cls.", "lm."))}
    for key, value in state.items():
        if not key.startswith("decoder_embeddings."):
            continue
        ours = "bert.embeddings." + key.removeprefix("decoder_embeddings.")
        if ours not in mapped:  # a deduplicating save (safetensors' save_model) may keep this name of the two
            mapped[ours] = value
        elif not torch.equal(mapped[ours], value):
            raise CheckpointError(f"{checkpoint}: {key} differs from lm.{ours}; the official model shares them, so "
                                  "this is not a checkpoint of the official RetroMAEForPretraining")
    return {k: v for k, v in mapped.items() if not k.startswith(NOT_OURS)}


def official_model(checkpoint: str | os.PathLike, decoder_file: str | os.PathLike | None = None, *,
                   encoder_mask_ratio: float = OFFICIAL_ENCODER_MASK_RATIO,
                   decoder_mask_ratio: float = OFFICIAL_DECODER_MASK_RATIO,
                   ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Our RetroMAE pre-training model holding every weight of an official checkpoint, and its tokenizer.

    Raises:
        UserError / CheckpointError: one line naming what `checkpoint` lacks (config, safetensors weights, tokenizer,
            decoder, encoder weights) or what does not fit (model type, shapes, unknown keys).
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():  # a local save of the official code, never a Hub id
        state = "is a file, not a folder" if checkpoint.exists() else "does not exist"
        raise CheckpointError(f"CHECKPOINT {checkpoint} {state}; give the folder the official code saved (its "
                              "config.json, weights and tokenizer files)")
    check_model_folder(checkpoint, purpose="import-official")
    tokenizer = load_tokenizer(checkpoint)
    config = official_config(checkpoint, tokenizer, encoder_mask_ratio, decoder_mask_ratio)
    state = read_state_dict(checkpoint)
    weights = {**encoder_weights(state, checkpoint),
               **decoder_weights(state, Path(decoder_file) if decoder_file else None, checkpoint)}
    model = get_method(OFFICIAL_METHOD).model_class(config)
    _check_keys(model, weights, checkpoint, decoder_file)
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    return model, tokenizer


def _check_keys(model: PreTrainedModel, weights: dict[str, torch.Tensor], checkpoint: Path,
                decoder_file: str | os.PathLike | None) -> None:
    """Refuse weights that would leave part of `model` at its initialisation, that it has no place for, or of
    another shape, naming `decoder_file` (when given) for the decoder layer's; the tied output layer may be absent."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights) - set(TIED_KEYS))
    unknown = sorted(set(weights) - set(expected))
    wrong = sorted(k for k in set(weights) & set(expected) if weights[k].shape != expected[k].shape)
    for problem, keys in (("lacks the weights", missing), ("has weights of no official RetroMAE", unknown),
                          ("has weights of another shape than its config.json says", wrong)):
        decoder_keys = [k for k in keys if k.startswith(OURS_DECODER_PREFIX)] if decoder_file else []
        if decoder_keys:
            where, prefix, keys = f"--decoder {decoder_file} is not the official decoder layer (c_head)", "", decoder_keys
        else:
            where, prefix = f"{checkpoint} is not an official RetroMAE checkpoint", DECODER_PREFIX
        if keys:
            official = [k.replace(OURS_DECODER_PREFIX, prefix) for k in keys]
            raise CheckpointError(f"{where}: it {problem} {official[:4]}{' ...' if len(keys) > 4 else ''} "
                                  f"({len(keys)} in all)")


def import_official_checkpoint(checkpoint: str | os.PathLike, output_dir: str | os.PathLike, *,
                               decoder_file: str | os.PathLike | None = None, overwrite: bool = False,
                               encoder_mask_ratio: float = OFFICIAL_ENCODER_MASK_RATIO,
                               decoder_mask_ratio: float = OFFICIAL_DECODER_MASK_RATIO) -> Path:
    """Write `official_model(...)` to `output_dir` as our pre-training checkpoint (config.json with model_type
    "retromae" and auto_map, model.safetensors, the modeling files, the tokenizer), all at once
    (`atomic_folder`); returns `output_dir`. The caller claims `output_dir` first (`claim_output`)."""
    model, tokenizer = official_model(checkpoint, decoder_file, encoder_mask_ratio=encoder_mask_ratio,
                                      decoder_mask_ratio=decoder_mask_ratio)
    with atomic_folder(output_dir, overwrite=overwrite) as build_dir:
        model.save_pretrained(build_dir)
        tokenizer.save_pretrained(build_dir)
    return Path(output_dir)


__all__ = ["OFFICIAL_SETTINGS", "import_official_checkpoint", "official_model"]
