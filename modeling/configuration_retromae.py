"""RetroMAE configuration (Hub remote code: torch/transformers imports only, relative imports for our files)."""

import logging
from collections.abc import Mapping
from typing import Any, Literal

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

logger = logging.getLogger(__name__)


def rename_legacy_keys(config_name: str, settings: dict[str, Any], renames: Mapping[str, str]) -> dict[str, Any]:
    """Pop from `settings` the keys a config had before a rename (`renames`: old name -> new name) and return their
    values under the new names, with a deprecation warning each: config.json files and `--method-options` written
    before the rename keep loading."""
    renamed = {}
    for old_name, new_name in renames.items():
        value = settings.pop(old_name, None)
        if value is None:
            continue
        logger.warning(
            "%s: `%s` is deprecated; read as %s=%s. Rename it to `%s`.",
            config_name, old_name, new_name, value, new_name,
        )
        renamed[new_name] = value
    return renamed


class LegacyKeysMixin:
    """For a config with renamed fields: the keys of its `legacy_keys` (old key -> field, a class constant and not a
    config field) are read under their old names from config.json or keyword arguments, with a deprecation warning,
    and are not kept as stray attributes under the old name."""

    legacy_keys = {}

    def __post_init__(self, **kwargs):
        for name, value in rename_legacy_keys(type(self).__name__, kwargs, self.legacy_keys).items():
            setattr(self, name, value)
        super().__post_init__(**kwargs)


def check_loss_settings(config: Any) -> None:
    """The loss fields the RetroMAE-style configs share: non-negative term weights and a positive chunk size."""
    for name in ("encoder_loss_weight", "decoder_loss_weight"):
        if getattr(config, name) < 0:
            raise ValueError(f"{name}={getattr(config, name)} must be >= 0")
    if config.loss_chunk_size < 1:
        raise ValueError(f"loss_chunk_size={config.loss_chunk_size} must be >= 1")


def hides_whole_words(config: Any) -> bool:
    """Whether the decoder's visibility is sampled over whole words (`decoder_visibility="reference"`), which needs
    the batch's word starts. Only the configs of methods with a RetroMAE decoder have the field."""
    return getattr(config, "decoder_visibility", None) == "reference"


def _check_open_unit_interval(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value} must lie in the open interval (0, 1)")


@strict
class RetroMAEConfig(BertConfig):
    r"""BERT encoder plus a RetroMAE decoder (Xiao et al., 2022, "RetroMAE").

    Args:
        encoder_mask_ratio: share of ordinary tokens the collator masks in the encoder input (paper: 0.15-0.3).
        decoder_mask_ratio: share of positions hidden from each decoder row (enhanced decoding) or replaced by
            [MASK] in the decoder input (basic decoding). Paper: 0.5 (enhanced) / 0.7 (basic) are best.
        decoding: ``"enhanced"`` (paper §3.3, two-stream attention with a per-row visibility matrix, loss on every
            token) or ``"basic"`` (paper §3.2 / Table 6 ablation, masked input and self-attention, loss on masked
            tokens only).
        num_decoder_layers: transformer layers in the decoder; 1 for enhanced decoding (the paper's only setting),
            1-3 for basic decoding.
        query_stream: ``"position"`` builds the decoder queries as h + p_i (paper eq. 4, official v1 code);
            ``"embeddings"`` passes h through the full embedding module (adds token-type, LayerNorm, dropout; the
            BGE / DupMAE code).
        whole_word_mask: mask whole words (all word pieces together) in the encoder input.
        encoder_loss_weight / decoder_loss_weight: weights of the two loss terms (paper: plain sum).
        decoder_init: ``"bert"`` (fresh BERT initialisation, as the official code) or ``"copy_last_layer"`` (start
            the decoder from the encoder's last layer, as SimLM does).
        mask_token_id: id of the tokenizer's mask token; needed by basic decoding (set from the tokenizer).
        loss_chunk_size: rows per chunk of the fused vocabulary projection + cross-entropy (bounds logits memory).
        decoder_visibility: how enhanced decoding samples each row's visible positions.

            - ``"token"`` (default, the paper's eq. 7): every row independently sees a uniformly random
              n - round(n * decoder_mask_ratio) of the n real tokens (per token, so words get split), never itself;
              [CLS] (position 0, h) is always visible, [SEP] like any other token.
            - ``"reference"`` (the official code's collator, staoxiao/RetroMAE `src/pretrain/data.py`): whole words
              are hidden, greedily up to min(512, round(n * decoder_mask_ratio)) tokens; [CLS] and [SEP] are never
              hidden, so every other row sees both; each sequence draws min(n, 256) such masks and every row picks
              one of them at random (rows may share a mask) and hides itself. Needs the batch's
              `decoder_word_starts`.
        decoder_targets: which tokens the decoder reconstructs.

            - ``"ordinary"`` (default): the collator's `decoder_labels`, every real token that is not a special
              token ([UNK] included among the special tokens, so it is never a target).
            - ``"reference"`` (the official code): every real token except the first and the last ([CLS], [SEP]),
              [UNK] included.
    """

    model_type = "retromae"

    encoder_mask_ratio: float | int = 0.3
    decoder_mask_ratio: float | int = 0.5
    decoding: Literal["enhanced", "basic"] = "enhanced"
    num_decoder_layers: int = 1
    query_stream: Literal["position", "embeddings"] = "position"
    whole_word_mask: bool = True
    encoder_loss_weight: float | int = 1.0
    decoder_loss_weight: float | int = 1.0
    decoder_init: Literal["bert", "copy_last_layer"] = "bert"
    mask_token_id: int | None = None
    loss_chunk_size: int = 4096
    decoder_visibility: Literal["token", "reference"] = "token"
    decoder_targets: Literal["ordinary", "reference"] = "ordinary"

    def validate_retromae_fields(self) -> None:
        _check_open_unit_interval("encoder_mask_ratio", self.encoder_mask_ratio)
        _check_open_unit_interval("decoder_mask_ratio", self.decoder_mask_ratio)
        if self.decoder_visibility == "reference" and self.decoding != "enhanced":
            raise ValueError(
                "decoder_visibility='reference' samples the visibility matrix of enhanced decoding; "
                f"decoding={self.decoding!r} has none (use decoding='enhanced' or decoder_visibility='token')"
            )
        if self.decoding == "enhanced" and self.num_decoder_layers != 1:
            raise ValueError(
                f"num_decoder_layers={self.num_decoder_layers} with decoding='enhanced': enhanced decoding works "
                "with exactly one decoder layer (RetroMAE §3.3, Table 6); use decoding='basic' for 1-3 layers"
            )
        if not 1 <= self.num_decoder_layers <= 3:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers} must be 1, 2 or 3")
        check_loss_settings(self)


__all__ = ["RetroMAEConfig"]
