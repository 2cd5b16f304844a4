"""SEED-Encoder configuration (Hub remote code: torch/transformers imports only, relative imports for our files)."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

from .configuration_retromae import LegacyKeysMixin, check_loss_settings


@strict
class SEEDConfig(LegacyKeysMixin, BertConfig):
    r"""BERT encoder plus SEED-Encoder's weak auto-regressive decoder (Lu et al., 2021, "Less is More: Pre-train a
    Strong Text Encoder for Dense Retrieval Using a Weak Decoder").

    Loss = encoder_loss_weight * L_mlm + decoder_loss_weight * L_dec (paper eq. 10: plain sum).

    Args:
        encoder_mask_ratio: share of ordinary tokens the collator masks in the encoder input.
        whole_word_mask: mask whole words (all word pieces together) in the encoder input.
        num_decoder_layers: transformer layers of the weak decoder (paper: 3; width as the encoder). Configs saved
            before the rename call it `decoder_layers`; that key still loads, with a deprecation warning.
        attention_window: k, the attention span of every decoder layer (paper: 2): the position that predicts x_t
            attends to the [CLS] embedding h and to x_{t-k} ... x_{t-1} (paper eq. 9). As in the reference code the
            span applies per layer, so a stack of `num_decoder_layers` N reaches N(k-1)+1 tokens back.
        attention_window_scope: ``"per_layer"`` (default, the reference code: every layer attends to k positions,
            so the default 3 layers with k=2 predict x_t from x_{t-4} ... x_{t-1}) or ``"total"`` (the paper's
            reading: the decoder as a whole sees exactly k previous tokens; the first layer attends to k positions,
            the later ones only to their own position and h).
        encoder_loss_weight / decoder_loss_weight: weights of the two loss terms (paper: plain sum).
        decoder_init: ``"bert"`` (fresh BERT initialisation) or ``"copy_last_layer"`` (every decoder layer starts as a
            copy of the encoder's last layer).
        loss_chunk_size: rows per chunk of the fused vocabulary projection + cross-entropy.
    """

    model_type = "seed_encoder"

    encoder_mask_ratio: float | int = 0.3
    whole_word_mask: bool = True
    num_decoder_layers: int = 3
    attention_window: int = 2
    encoder_loss_weight: float | int = 1.0
    decoder_loss_weight: float | int = 1.0
    decoder_init: Literal["bert", "copy_last_layer"] = "bert"
    loss_chunk_size: int = 4096
    attention_window_scope: Literal["per_layer", "total"] = "per_layer"

    # the decoder depth had its own name here; RetroMAE's `num_decoder_layers` is now the only one
    legacy_keys = {"decoder_layers": "num_decoder_layers"}

    def validate_seed_fields(self) -> None:
        if not 0.0 < self.encoder_mask_ratio < 1.0:
            raise ValueError(f"encoder_mask_ratio={self.encoder_mask_ratio} must lie in the open interval (0, 1)")
        if self.num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers} must be >= 1")
        if self.attention_window < 1:
            raise ValueError(
                f"attention_window={self.attention_window} must be >= 1 (number of previous tokens each decoder "
                "position may attend to; paper: 2)"
            )
        check_loss_settings(self)


__all__ = ["SEEDConfig"]
