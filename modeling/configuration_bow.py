"""Bag-of-Word prediction configuration."""

from typing import Literal

from transformers import BertConfig

from .configuration_retromae import MethodConfigMixin, check_loss_settings, strict_config


@strict_config
class BoWConfig(MethodConfigMixin, BertConfig):
    r"""BERT encoder pre-trained with encoder MLM plus Bag-of-Word prediction from [CLS] (Ma et al., 2024, "Drop your
    Decoder"). Loss = encoder_loss_weight * L_mlm + bow_loss_weight * s * L_bow, s the schedule factor
    (`BoWForPretraining.set_training_progress`).

    Args:
        encoder_mask_ratio: share of ordinary tokens masked in the encoder input, in (0, 1) (reference: 0.3).
        whole_word_mask: mask whole words in the encoder input.
        encoder_loss_weight / bow_loss_weight: finite, >= 0 (paper eq. 13: 1 each).
        bow_weight_schedule: ``"constant"`` (the paper) or ``"cosine"`` (the reference: from 1 down to
            `bow_weight_final` over the run's optimizer steps).
        bow_weight_final: >= 0, the cosine schedule's final factor (reference: 0.1).
        loss_chunk_size: >= 1, rows per chunk of the fused MLM projection + cross-entropy.
    """

    model_type = "bow_prediction"

    encoder_mask_ratio: float | int = 0.3
    whole_word_mask: bool = True
    encoder_loss_weight: float | int = 1.0
    bow_loss_weight: float | int = 1.0
    bow_weight_schedule: Literal["constant", "cosine"] = "constant"
    bow_weight_final: float | int = 0.1
    loss_chunk_size: int = 4096

    def validate_bow_fields(self) -> None:
        check_loss_settings(self, ("encoder_loss_weight", "bow_loss_weight", "bow_weight_final"))


__all__ = ["BoWConfig"]
