"""SentMAE (Liu & Yang, 2022): two-stage RetroMAE. Stage 1 is plain RetroMAE on generic text; stage 2
(`SentMAEForPretraining`) continues that checkpoint, decoder included, on domain text, optionally plus an in-batch
contrastive loss (paper §2.2, eq. 9)."""

import logging

import torch
import torch.nn.functional as F
from torch import distributed as dist

from .configuration_sentmae import SentMAEConfig
from .masked_lm import MaskedLMBase
from .modeling_retromae import RetroMAEForPretraining
from .pretraining_base import AnyEncoderModel, ClsEncoderModel, PretrainingBatch

logger = logging.getLogger(__name__)

POSITIVE_PREFIX = "positive_"
# the inputs a positive repeats under POSITIVE_PREFIX, in PretrainingBatch's order
PAIRED_INPUTS = ("input_ids", "attention_mask", "encoder_labels", "decoder_labels", "token_type_ids")


class SentMAEModel(ClsEncoderModel):
    """The SentMAE encoder (`AutoModel`): a plain BERT; `pooler_output` is the [CLS] sentence embedding."""

    config_class = SentMAEConfig


class SentMAEAnyEncoderModel(AnyEncoderModel):
    """The SentMAE encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base."""

    config_class = SentMAEConfig


class SentMAEForMaskedLM(MaskedLMBase):
    """The SentMAE encoder and its trained MLM head (`AutoModelForMaskedLM`, fill-mask) on any base."""

    config_class = SentMAEConfig


class _SumGradientAcrossProcesses(torch.autograd.Function):
    """Identity forward; backward sums the gradient over all processes (every process's loss reads every row), so
    DDP's averaging gives exactly the gradient of the mean of the per-process losses."""

    @staticmethod
    def forward(ctx, gathered: torch.Tensor) -> torch.Tensor:
        return gathered.view_as(gathered)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad


def gather_across_processes(local: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Concatenates the row blocks of all processes in global-rank order (uneven sizes allowed); this process's own
    block is `local` itself, so its gradient flows (the others' through `_SumGradientAcrossProcesses`).

    Args:
        local: `(n_local, hidden_size)` rows of this process.

    Returns:
        `(n_global, hidden_size)` rows of every process and the offset of this process's first row; `(local, 0)`
        without an initialised process group or with one process.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return local, 0
    world_size, rank = dist.get_world_size(), dist.get_rank()
    n_local = torch.tensor([local.shape[0]], dtype=torch.long, device=local.device)
    sizes = [torch.zeros_like(n_local) for _ in range(world_size)]
    dist.all_gather(sizes, n_local)
    sizes = [int(size) for size in sizes]  # (world_size,) rows per process
    longest = max(sizes)
    padded = local.detach()
    if local.shape[0] < longest:  # all_gather needs equal shapes: pad, then cut each block back to its size
        padded = F.pad(padded, (0, 0, 0, longest - local.shape[0]))
    blocks = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(blocks, padded.contiguous())
    blocks = [block[:size] for block, size in zip(blocks, sizes, strict=True)]
    blocks[rank] = local  # reinsert the local tensor: its autograd graph is kept
    gathered = _SumGradientAcrossProcesses.apply(torch.cat(blocks))  # (n_global, H)
    return gathered, sum(sizes[:rank])


def in_batch_contrastive_loss(
    anchors: torch.Tensor, positives: torch.Tensor, temperature: float, similarity: str = "cos"
) -> torch.Tensor:
    """Paper eq. 8 with in-batch negatives, in float32: anchor i against every positive of the batch, gathered across
    processes under DDP.

    Args:
        anchors: `(batch_size, hidden_size)` h_i.
        positives: `(batch_size, hidden_size)` h_i^+ (row i is the positive of anchor i).
        temperature: tau > 0.
        similarity: ``"cos"`` or ``"dot"``.

    Returns:
        Mean over this process's anchors of -log softmax_j(sim(h_i, h_j^+) / tau)[i] (a scalar).

    Raises:
        ValueError: shapes that differ, another `similarity`, or a global batch of fewer than 2 pairs.
    """
    if anchors.shape != positives.shape:
        raise ValueError(f"anchors {tuple(anchors.shape)} and positives {tuple(positives.shape)} differ in shape")
    with torch.autocast(device_type=anchors.device.type, enabled=False):
        anchors, positives = anchors.float(), positives.float()
        if similarity == "cos":
            anchors, positives = F.normalize(anchors, dim=-1), F.normalize(positives, dim=-1)
        elif similarity != "dot":
            raise ValueError(f"similarity={similarity!r} is not supported; choose 'cos' or 'dot'")
        all_positives, offset = gather_across_processes(positives)  # (B_global, H)
        if all_positives.shape[0] < 2:
            raise ValueError(
                f"the in-batch contrastive loss needs at least 2 (anchor, positive) pairs per batch for a negative, "
                f"got {all_positives.shape[0]}: raise the batch size (--per-device-train-batch-size 2 or more)"
            )
        scores = anchors @ all_positives.T / temperature  # (B, B_global)
        targets = torch.arange(anchors.shape[0], device=anchors.device) + offset  # (B,) own positive, global index
        return F.cross_entropy(scores, targets)


class SentMAEForPretraining(RetroMAEForPretraining):
    """SentMAE stage-2 model (`AutoModelForPreTraining`): RetroMAE + in-batch contrastive loss.

    Same keys as `RetroMAEForPretraining`, so a stage-1 `retromae` checkpoint continues with its decoder. `forward`
    also takes the positives' five inputs as `positive_input_ids`, ... (row i the positive of anchor i, padded to the
    anchors' length; needed when `contrastive_loss_weight > 0`). Anchors and positives share one encoder and decoder
    pass, whose [CLS] states L_ctr reuses (as coCondenser); `sentence_embedding` covers the anchors only.
    """

    config_class = SentMAEConfig
    encoder_class = SentMAEModel
    any_encoder_class = SentMAEAnyEncoderModel
    masked_lm_class = SentMAEForMaskedLM
    # model types of checkpoints whose weights continue into this model (stage 1 -> stage 2)
    continues_from = ("retromae",)
    method_input_names = tuple(POSITIVE_PREFIX + name for name in PAIRED_INPUTS)

    def after_encoder_checkpoint_loaded(self, missing_keys: set[str]) -> None:
        if any(k.startswith("decoder.") for k in missing_keys):
            logger.warning(
                "SentMAE stage 2 starts without a trained RetroMAE decoder: the decoder is new. The paper "
                "continues a stage-1 RetroMAE checkpoint (decoder included); run `--method retromae` first for that."
            )
        super().after_encoder_checkpoint_loaded(missing_keys)

    def method_batch(self, batch: PretrainingBatch) -> PretrainingBatch:
        """Anchors then positives, `(2 * batch_size, seq_len)` each, with `anchor_count` among the method inputs;
        the anchors alone when no positive is given."""
        positives = tuple(batch.method_inputs.get(POSITIVE_PREFIX + name) for name in PAIRED_INPUTS)
        if positives[0] is None:
            if any(t is not None for t in positives):
                raise ValueError("positive_* tensors were given without positive_input_ids")
            return batch
        anchors = tuple(getattr(batch, name) for name in PAIRED_INPUTS)
        return PretrainingBatch(*_concat_pairs(anchors, positives), {"anchor_count": len(batch.input_ids)})

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: PretrainingBatch
    ) -> dict[str, torch.Tensor]:
        """RetroMAE's `decoder_loss` over anchors and positives, and `contrastive_loss` of each anchor (the first
        `anchor_count` rows) against the positives (the rest), when `contrastive_loss_weight > 0`."""
        losses = super().method_losses(hidden, sentence_embedding, batch)
        if self.config.contrastive_loss_weight == 0:
            return losses
        anchor_count = batch.method_inputs.get("anchor_count")
        if anchor_count is None:
            raise ValueError(
                f"contrastive_loss_weight={self.config.contrastive_loss_weight} needs positives (positive_input_ids "
                "...): collate with retromae.trainers.data.pairs.ContrastiveCollator, or set "
                "contrastive_loss_weight=0 for RetroMAE alone"
            )
        losses["contrastive_loss"] = in_batch_contrastive_loss(
            sentence_embedding[:anchor_count], sentence_embedding[anchor_count:], self.config.temperature,
            self.config.similarity,
        )
        return losses

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        return {**super().loss_weights(), "contrastive_loss": self.config.contrastive_loss_weight}


def _concat_pairs(anchors: tuple, positives: tuple) -> tuple:
    """Anchors then positives along the batch dimension, `(2B, L)` each; checks that the two halves match."""
    shape = anchors[0].shape
    merged = []
    for name, anchor, positive in zip(PAIRED_INPUTS, anchors, positives, strict=True):
        if (anchor is None) != (positive is None):
            given, missing = (name, POSITIVE_PREFIX + name) if positive is None else (POSITIVE_PREFIX + name, name)
            raise ValueError(f"{given} was given but {missing} was not; pass both or neither")
        if anchor is None:
            merged.append(None)
            continue
        if anchor.shape != shape or positive.shape != shape:
            raise ValueError(
                f"{name} {tuple(anchor.shape)} and {POSITIVE_PREFIX}{name} {tuple(positive.shape)} must both have "
                f"the anchors' shape {tuple(shape)} (pad anchors and positives to one length)"
            )
        merged.append(torch.cat([anchor, positive]))
    return tuple(merged)


SentMAEConfig.register_for_auto_class()
SentMAEModel.register_for_auto_class("AutoModel")
SentMAEAnyEncoderModel.register_for_auto_class("AutoModel")
SentMAEForPretraining.register_for_auto_class("AutoModelForPreTraining")
SentMAEForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = [
    "SentMAEAnyEncoderModel",
    "SentMAEForMaskedLM",
    "SentMAEForPretraining",
    "SentMAEModel",
    "gather_across_processes",
    "in_batch_contrastive_loss",
]
