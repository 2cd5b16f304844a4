"""SentMAE (two-stage RetroMAE) configuration (Hub remote code: torch/transformers imports only, relative imports)."""

from typing import Literal

from huggingface_hub.dataclasses import strict

from .configuration_retromae import LegacyKeysMixin, RetroMAEConfig


@strict
class SentMAEConfig(LegacyKeysMixin, RetroMAEConfig):
    r"""Stage 2 of the two-stage workflow of SentMAE (Liu & Yang, 2022, "Masked Autoencoders As The Unified Learners
    For Pre-Trained Sentence Representation", §2.2): RetroMAE continued on domain text, optionally plus an in-batch
    contrastive loss.

    Stage 1 is plain RetroMAE on generic text (`RetroMAEConfig`, method ``retromae``); stage 2 loads that checkpoint,
    decoder included (every RetroMAE field and weight carries over).

    Loss = encoder_loss_weight * L_enc + decoder_loss_weight * L_dec + contrastive_loss_weight * L_ctr
    (paper eq. 9: (1) ``contrastive_loss_weight=0``, RetroMAE alone; (2) ``contrastive_loss_weight=1``, the plain
    sum).

    L_ctr (paper eq. 8) = mean_i -log softmax_j(sim(h_i, h_j^+) / temperature)[i], where h_i, h_j^+ are the
    last-layer [CLS] states of the masked anchor / positive inputs (the same encoder pass that feeds the RetroMAE
    losses, as coCondenser does) and j runs over the positives of the whole batch, across processes under DDP.

    Args:
        contrastive_loss_weight: weight of L_ctr; 0 switches it off (loss (1) of the paper, no positives needed).
            Configs saved before the rename call it `contrastive_weight`; that key still loads, with a deprecation
            warning.
        temperature: tau of eq. 8, > 0. The paper gives no value; 0.05 is SimCSE's (the paper's NLI stage follows
            supervised SimCSE). With ``similarity="dot"`` and unnormalised 768-d embeddings, 1.0 (coCondenser,
            tevatron) is the usual choice.
        similarity: ``"cos"`` (cosine, SimCSE) or ``"dot"`` (inner product, coCondenser; the retrieval metric of the
            exported encoder).
        positives: where h^+ comes from (recorded for the model card; the data pipeline builds the batch):
            ``"spans"`` = two random spans of the same document (coCondenser-style, in-domain retrieval) or
            ``"pairs"`` = given (anchor, positive) pairs, e.g. NLI entailment pairs or query-passage pairs.
    """

    model_type = "sentmae"

    contrastive_loss_weight: float | int = 1.0
    temperature: float | int = 0.05
    similarity: Literal["cos", "dot"] = "cos"
    positives: Literal["spans", "pairs"] = "spans"

    # every loss weight is `<term>_loss_weight`
    legacy_keys = {"contrastive_weight": "contrastive_loss_weight"}

    def validate_sentmae_fields(self) -> None:
        if self.contrastive_loss_weight < 0:
            raise ValueError(
                f"contrastive_loss_weight={self.contrastive_loss_weight} must be >= 0 (0 = RetroMAE alone, paper "
                "eq. 9 (1))"
            )
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (the tau of paper eq. 8)")


__all__ = ["SentMAEConfig"]
