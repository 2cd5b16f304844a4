"""Bag-of-Word prediction (Ma et al., 2024, "Drop your Decoder"): encoder MLM plus predicting the set of input
tokens from the [CLS] embedding through the tied MLM head; no decoder, no extra parameters."""

import math

import torch
from transformers import initialization as init

from .configuration_bow import BoWConfig
from .masked_lm import MaskedLMBase
from .pretraining_base import AnyEncoderModel, ClsEncoderModel, PretrainingBase, PretrainingBatch
from .vocab_losses import bag_of_words_loss, bag_of_words_targets


def bow_weight_factor(progress: float, schedule: str, final: float) -> float:
    """The schedule factor s of the BoW weight at `progress` = optimizer step / total steps (clamped to [0, 1]): 1 for
    ``"constant"``, final + (1 - final) * (1 + cos(pi * progress)) / 2 for ``"cosine"``; any other raises."""
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        progress = min(max(progress, 0.0), 1.0)
        return final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"bow_weight_schedule={schedule!r} is not supported; choose 'constant' or 'cosine'")


class BoWModel(ClsEncoderModel):
    """The BoW-prediction encoder (`AutoModel`): a plain BERT; `pooler_output` is the [CLS] sentence embedding."""

    config_class = BoWConfig


class BoWAnyEncoderModel(AnyEncoderModel):
    """The BoW encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base."""

    config_class = BoWConfig


class BoWForMaskedLM(MaskedLMBase):
    """The BoW-prediction encoder and its trained MLM head (`AutoModelForMaskedLM`, fill-mask) on any base."""

    config_class = BoWConfig


class BoWForPretraining(PretrainingBase):
    """BoW-prediction pre-training model (`AutoModelForPreTraining`): encoder MLM + Bag-of-Word prediction.

    Keys are `BertForMaskedLM`'s. The BoW logits are the masked input's [CLS] state through the full tied MLM head,
    as in the reference code (bowdpr). The schedule factor is the non-persistent buffer `bow_schedule_factor` (a
    tensor, so changing it does not recompile), set each optimizer step by
    `retromae.trainers.training.schedules.BoWScheduleCallback`.
    """

    config_class = BoWConfig
    encoder_class = BoWModel
    any_encoder_class = BoWAnyEncoderModel
    masked_lm_class = BoWForMaskedLM
    head_prefixes = ()

    def __init__(self, config: BoWConfig):
        super().__init__(config)
        self.register_buffer("bow_schedule_factor", torch.ones((), dtype=torch.float32), persistent=False)
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, BoWForPretraining):
            init.ones_(module.bow_schedule_factor)

    def set_training_progress(self, progress: float) -> float:
        """Set `bow_schedule_factor` for `progress` in [0, 1] (optimizer step / total steps); returns the factor."""
        factor = bow_weight_factor(progress, self.config.bow_weight_schedule, self.config.bow_weight_final)
        self.bow_schedule_factor.fill_(factor)
        return factor

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: PretrainingBatch
    ) -> dict[str, torch.Tensor]:
        """`bow_loss`: the unique ids of each row's `decoder_labels` predicted from its [CLS] state."""
        bow_logits = self.vocab_logits(sentence_embedding)  # (B, V): tied MLM head incl. transform and bias
        targets = bag_of_words_targets(batch.decoder_labels, bow_logits.shape[-1])  # (B, V)
        return {"bow_loss": bag_of_words_loss(bow_logits, targets)}

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        return {
            "encoder_mlm_loss": self.config.encoder_loss_weight,
            "bow_loss": self.config.bow_loss_weight * self.bow_schedule_factor,
        }


BoWConfig.register_for_auto_class()
BoWModel.register_for_auto_class("AutoModel")
BoWAnyEncoderModel.register_for_auto_class("AutoModel")
BoWForPretraining.register_for_auto_class("AutoModelForPreTraining")
BoWForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = [
    "BoWAnyEncoderModel",
    "BoWForMaskedLM",
    "BoWForPretraining",
    "BoWModel",
    "bag_of_words_loss",
    "bag_of_words_targets",
    "bow_weight_factor",
]
