"""SEED-Encoder configuration."""

from typing import Literal

from transformers import BertConfig

from .configuration_retromae import MethodConfigMixin, check_loss_settings, strict_config


@strict_config
class SEEDConfig(MethodConfigMixin, BertConfig):
    r"""BERT encoder plus SEED-Encoder's weak auto-regressive decoder (Lu et al., 2021, "Less is More").
    Loss = encoder_loss_weight * L_mlm + decoder_loss_weight * L_dec (paper eq. 10).

    Args:
        encoder_mask_ratio: share of ordinary tokens masked in the encoder input, in (0, 1).
        whole_word_mask: mask whole words in the encoder input.
        num_decoder_layers: >= 1 (paper: 3); the legacy key `decoder_layers` still loads, with a warning.
        attention_window: k >= 1, the tokens before x_t the decoder attends to (paper eq. 9: 2).
        attention_window_scope: ``"per_layer"`` (the reference code: N layers reach N(k-1)+1 tokens back) or
            ``"total"`` (the paper's reading: the whole decoder sees k tokens); see `SEEDDecoder`.
        encoder_loss_weight / decoder_loss_weight: >= 0 (paper: plain sum).
        decoder_init: ``"bert"`` or ``"copy_last_layer"`` (every decoder layer starts as the encoder's last layer).
        loss_chunk_size: >= 1, rows per chunk of the fused vocabulary projection + cross-entropy.
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

    legacy_keys = {"decoder_layers": "num_decoder_layers"}

    def validate_seed_fields(self) -> None:
        if self.num_decoder_layers < 1:
            raise ValueError(f"num_decoder_layers={self.num_decoder_layers} must be >= 1")
        if self.attention_window < 1:
            raise ValueError(
                f"attention_window={self.attention_window} must be >= 1 (number of previous tokens each decoder "
                "position may attend to; paper: 2)"
            )
        check_loss_settings(self)


__all__ = ["SEEDConfig"]
