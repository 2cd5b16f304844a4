"""Bag-of-Word prediction configuration (Hub remote code: torch/transformers imports only)."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import BertConfig


@strict
class BoWConfig(BertConfig):
    r"""BERT encoder pre-trained with encoder MLM plus Bag-of-Word prediction from [CLS] (Ma et al., 2024,
    "Drop your Decoder: Pre-training with Bag-of-Word Prediction for Dense Passage Retrieval").

    Loss = encoder_loss_weight * L_mlm + bow_loss_weight * s * L_bow, where s is the schedule factor
    (`BoWForPretraining.bow_schedule_factor`, set each optimizer step by `retromae.trainers.schedules.
    BoWScheduleCallback`).

    Args:
        encoder_mask_ratio: share of ordinary tokens the collator masks in the encoder input (reference recipe: 0.3).
        whole_word_mask: mask whole words (all word pieces together) in the encoder input.
        encoder_loss_weight: weight of the encoder MLM loss (paper eq. 13: 1).
        bow_loss_weight: weight of the BoW loss at the start of training (paper eq. 13: 1; reference default 1).
        bow_weight_schedule: ``"constant"`` (the paper: plain sum) or ``"cosine"`` (the reference recipe: the BoW
            weight decays on a half cosine from 1 to `bow_weight_final` over the optimizer steps of the run).
        bow_weight_final: schedule factor at the end of a cosine schedule (reference: 0.1).
        loss_chunk_size: rows per chunk of the fused vocabulary projection + cross-entropy of the MLM loss.
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
        if not 0.0 < self.encoder_mask_ratio < 1.0:
            raise ValueError(f"encoder_mask_ratio={self.encoder_mask_ratio} must lie in the open interval (0, 1)")
        for name in ("encoder_loss_weight", "bow_loss_weight", "bow_weight_final"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.loss_chunk_size < 1:
            raise ValueError(f"loss_chunk_size={self.loss_chunk_size} must be >= 1")


__all__ = ["BoWConfig"]
