"""Fine-tuning losses: in-batch contrastive and score distillation."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.losses.merged_forward import embed_columns
from sentence_transformers.sentence_transformer.losses import (
    CachedMultipleNegativesRankingLoss,
    DistillKLDivLoss,
    MultipleNegativesRankingLoss,
)
from sentence_transformers.util import (
    cos_sim,
    dot_score,
    pairwise_cos_sim,
    pairwise_dot_score,
)
from torch import nn


def similarity_functions(model: SentenceTransformer):
    """(matrix similarity, pairwise similarity, default scale) for the model's similarity function."""
    if (model.similarity_fn_name or "cosine") == "cosine":
        return cos_sim, pairwise_cos_sim, 20.0
    if model.similarity_fn_name == "dot":
        return dot_score, pairwise_dot_score, 1.0
    raise ValueError(f"similarity {model.similarity_fn_name!r} is not supported for fine-tuning (use dot or cosine)")


class DistillationLoss(nn.Module):
    """Eq. 15 of the DupMAE paper: KL(teacher || student) over each query's group (positive + negatives), reduction
    `batchmean`, plus an optional in-batch contrastive term.

    loss = distill_loss_weight * KL_batchmean(softmax(t / T) || log_softmax(s / T)) * T^2
           + contrastive_loss_weight * MultipleNegativesRankingLoss

    The two parts are returned as a dict (`distill_loss`, `contrastive_loss`), so the trainer logs each. The
    embeddings are computed once and shared by both parts.

    Args:
        model: the student SentenceTransformer.
        distill_loss_weight: weight of the KL term (> 0).
        contrastive_loss_weight: weight of the in-batch contrastive term (>= 0; 0 = the paper's eq. 15 alone).
        temperature: softmax temperature T of both score lists (> 0).
        scale: logit scale of the contrastive term.
        gather_across_devices: the contrastive term's in-batch negatives from all DDP ranks.
    """

    def __init__(
        self,
        model: SentenceTransformer,
        distill_loss_weight: float = 1.0,
        contrastive_loss_weight: float = 0.0,
        temperature: float = 1.0,
        scale: float | None = None,
        gather_across_devices: bool = False,
    ):
        super().__init__()
        if not distill_loss_weight > 0:
            raise ValueError(f"distill_loss_weight must be > 0, got {distill_loss_weight}")
        if contrastive_loss_weight < 0:
            raise ValueError(f"contrastive_loss_weight must be >= 0, got {contrastive_loss_weight}")
        similarity, pairwise, default_scale = similarity_functions(model)
        self.model = model
        self.distill_loss_weight = distill_loss_weight
        self.contrastive_loss_weight = contrastive_loss_weight
        self.kl = DistillKLDivLoss(model, similarity_fct=pairwise, temperature=temperature)
        self.contrastive = MultipleNegativesRankingLoss(
            model, scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices
        )

    def forward(self, sentence_features: Iterable[dict[str, torch.Tensor]], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        embeddings = embed_columns(self.model, sentence_features)  # [query, positive, negative_1, ...], each (B, D)
        return self.compute_loss_from_embeddings(embeddings, labels)

    def compute_loss_from_embeddings(self, embeddings: list[torch.Tensor], labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Args: embeddings `[query, positive, negative_1, ...]`, each `(batch_size, dim)`; labels (teacher scores)
        `(batch_size, 1 + num_negatives)`, positive first."""
        losses = {"distill_loss": self.distill_loss_weight * self.kl.compute_loss_from_embeddings(embeddings, labels)}
        if self.contrastive_loss_weight > 0:
            losses["contrastive_loss"] = self.contrastive_loss_weight * self.contrastive.compute_loss_from_embeddings(
                embeddings, labels
            )
        return losses

    def get_config_dict(self) -> dict[str, Any]:
        return {"distill_loss_weight": self.distill_loss_weight, "contrastive_loss_weight": self.contrastive_loss_weight,
                **self.kl.get_config_dict(), "contrastive": self.contrastive.get_config_dict()}


def contrastive_loss(model: SentenceTransformer, scale: float | None, gather_across_devices: bool,
                     mini_batch_size: int | None = None) -> nn.Module:
    """sentence-transformers' `MultipleNegativesRankingLoss` at the model's similarity; with `mini_batch_size` its
    GradCache form, which gives the same loss and gradients in the memory of `mini_batch_size` texts."""
    similarity, _, default_scale = similarity_functions(model)
    options = dict(scale=scale or default_scale, similarity_fct=similarity, gather_across_devices=gather_across_devices)
    if mini_batch_size is None:
        return MultipleNegativesRankingLoss(model, **options)
    return CachedMultipleNegativesRankingLoss(model, mini_batch_size=mini_batch_size, **options)


__all__ = ["DistillationLoss"]
