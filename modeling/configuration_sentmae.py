"""SentMAE (two-stage RetroMAE) configuration."""

import math
from typing import Literal

from .configuration_retromae import RetroMAEConfig, check_weight, strict_config


@strict_config
class SentMAEConfig(RetroMAEConfig):
    r"""Stage 2 of SentMAE (Liu & Yang, 2022, "Masked Autoencoders As The Unified Learners For Pre-Trained Sentence
    Representation", §2.2): RetroMAE continued from a stage-1 `retromae` checkpoint on domain text, optionally with
    an in-batch contrastive loss. Loss = encoder_loss_weight * L_enc + decoder_loss_weight * L_dec +
    contrastive_loss_weight * L_ctr (paper eq. 9), L_ctr as `in_batch_contrastive_loss`.

    Args:
        contrastive_loss_weight: >= 0; 0 = RetroMAE alone (eq. 9 (1), no positives needed). The legacy key
            `contrastive_weight` still loads, with a warning.
        temperature: tau > 0 (finite) of eq. 8 (default 0.05, SimCSE's; 1.0 is usual with ``"dot"``, as coCondenser).
        similarity: ``"cos"`` (SimCSE) or ``"dot"`` (coCondenser; the exported encoder's retrieval metric).
        positives: where h^+ comes from, recorded for the model card: ``"spans"`` (two spans of one document) or
            ``"pairs"`` (given pairs, e.g. NLI or query-passage).
    """

    model_type = "sentmae"

    contrastive_loss_weight: float | int = 1.0
    temperature: float | int = 0.05
    similarity: Literal["cos", "dot"] = "cos"
    positives: Literal["spans", "pairs"] = "spans"

    # every loss weight is `<term>_loss_weight`
    legacy_keys = {"contrastive_weight": "contrastive_loss_weight"}

    def validate_sentmae_fields(self) -> None:
        check_weight("contrastive_loss_weight", self.contrastive_loss_weight, " (0 = RetroMAE alone, paper eq. 9 (1))")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature={self.temperature} must be a finite number > 0 (the tau of paper eq. 8)")


__all__ = ["SentMAEConfig"]
