"""DupMAE (Liu et al., 2023, "RetroMAE-2 / DupMAE"): RetroMAE's [CLS] decoding plus ordinary-token (OT) decoding,
and the hybrid dense + sparse representation of paper §3.4."""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.models.bert.modeling_bert import BertOnlyMLMHead

from .backbones import BertBackbone
from .configuration_dupmae import DupMAEConfig
from .layers_dupmae import (
    dense_and_ot_parts,
    hybrid_embedding,
    initial_dense_projection,
    ordinary_token_mask,
    ot_vector,
    sparse_top_k,
    sparsify_top_k,
)
from .masked_lm import MaskedLMBase
from .modeling_retromae import RetroMAEDecoder, RetroMAEForPretraining
from .pretraining_base import IGNORE_INDEX, AnyEncoderModel, ClsEncoderModel, PretrainingBatch
from .vocab_losses import bag_of_words_loss, bag_of_words_targets


@dataclass
class DupMAEModelOutput(BaseModelOutputWithPoolingAndCrossAttentions):
    """Output of `DupMAEModel`.

    Args:
        last_hidden_state: `(batch_size, seq_len, hidden_size)`.
        pooler_output: `(batch_size, hidden_size)` last-layer [CLS] state h.
        dense_embedding: `(batch_size, dense_dim)` W^cls h (eq. 10) for ``"hybrid"``, h for ``"cls"``; None for
            ``"ot"``.
        ot_embedding: `(batch_size, vocab_size)` mu over the unmasked input's ordinary tokens (eq. 6-7) after
            `ot_activation`, before top-k; None for ``"cls"``.
    """

    dense_embedding: torch.Tensor | None = None
    ot_embedding: torch.Tensor | None = None


def representation_parts(
    config: DupMAEConfig, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
    dense_proj, ot_head,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(dense, mu) of the representation (`dense_and_ot_parts`) from the last-layer states `hidden` `(B, L, H)` of
    the unmasked input, mu pooled over its ordinary tokens through `ot_head` (None for ``"cls"``)."""
    keep = None
    if config.representation != "cls":
        if attention_mask is None:
            attention_mask = torch.ones(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        keep = ordinary_token_mask(input_ids, attention_mask, config.special_token_ids)  # (B, L)
    return dense_and_ot_parts(
        hidden, keep, config.representation, dense_proj, ot_head, config.ot_activation, config.loss_chunk_size
    )


def hybrid_representation(
    config: DupMAEConfig, dense: torch.Tensor | None, mu: torch.Tensor | None, task: str = "document"
) -> torch.Tensor:
    """[dense ; sparsified mu] `(batch_size, dense_dim + vocab_size)` (fewer columns for "cls" / "ot"): `doc_top_k`
    or `query_top_k` entries of mu scaled by sqrt(`sparse_weight`), so a query's and a document's dot product is
    eq. 12. A `task` other than "query" or "document" raises `ValueError`."""
    if task not in ("query", "document"):
        raise ValueError(f"task={task!r} must be 'query' or 'document'")
    sparse = None
    if mu is not None:
        k = config.doc_top_k if task == "document" else config.query_top_k
        sparse = sparse_top_k(mu, k, config.sparse_weight)[0]
    return hybrid_embedding(dense, sparse)


def ot_bag_of_words_targets(token_labels: torch.Tensor, vocab_size: int, normalization: str) -> torch.Tensor:
    """OT decoding's bag-of-words target `(batch_size, vocab_size)`: 1/|S| on each unique labelled id (``"unique"``)
    or 1/n, n counting repeats (``"all_tokens"``, the official `bag_word_weight`: the row sums to |S|/n)."""
    unique_targets = bag_of_words_targets(token_labels, vocab_size)  # (B, V)
    if normalization == "unique":
        return unique_targets
    if normalization == "all_tokens":
        token_count = (token_labels != IGNORE_INDEX).sum(-1, keepdim=True).clamp(min=1).float()  # (B, 1) n
        return (unique_targets > 0).float() / token_count
    raise ValueError(f"bow_normalization={normalization!r} is not supported; choose 'unique' or 'all_tokens'")


class DupMAERepresentationMixin:
    """What a DupMAE encoder (`AutoModel`) adds to the base: the tied MLM head (for mu), `dense_proj`
    Linear(hidden_size -> dense_dim) (eq. 10; absent from pre-training checkpoints, as the paper learns W^cls in
    fine-tuning, so it starts as `initial_dense_projection`), and the representation in `forward`, which pools mu
    over the unmasked input's ordinary tokens (`ordinary_token_mask`: set `config.special_token_ids` for pairs)."""

    config_class = DupMAEConfig
    quiet_missing_keys = (*ClsEncoderModel.quiet_missing_keys, r"^dense_proj\.")  # from the config's seed

    def build_representation(self, config: DupMAEConfig, head_name: str, head_factory, tied_keys: dict) -> None:
        """The MLM head under `head_name` (with `tied_keys`) unless the representation is "cls", and `dense_proj`
        for "hybrid"."""
        self.head_name = head_name
        setattr(self, head_name, None)
        if config.representation != "cls":
            setattr(self, head_name, head_factory(config))
            self._tied_weights_keys = dict(tied_keys)  # the head's output layer is the word embeddings
        self.dense_proj = nn.Linear(config.hidden_size, config.dense_dim) if config.representation == "hybrid" else None

    def ot_head_parts(self):
        """The MLM head as (transform, weight, bias), or None without one."""
        raise NotImplementedError

    @torch.no_grad()
    def _init_weights(self, module):
        if module is not None and module is getattr(self, "dense_proj", None):
            config = self.config
            start = initial_dense_projection(config.hidden_size, config.dense_dim, config.dense_proj_seed)
            init.copy_(module.weight, start.to(module.weight.dtype))
            init.zeros_(module.bias)
            return
        super()._init_weights(module)

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, **kwargs
    ) -> DupMAEModelOutput:
        r"""
        Args:
            input_ids: `(batch_size, seq_len)` the unmasked input, `[CLS] text [SEP]` with right padding.
            attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
            **kwargs: the base model's other inputs (`token_type_ids`, ...).
        """
        output = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        hidden = output.last_hidden_state  # (B, L, H)
        dense, mu = representation_parts(
            self.config, hidden, input_ids, attention_mask, self.dense_proj, self.ot_head_parts()
        )
        return DupMAEModelOutput(
            last_hidden_state=hidden,
            pooler_output=output.pooler_output,
            hidden_states=output.hidden_states,
            attentions=output.attentions,
            dense_embedding=dense,
            ot_embedding=mu,
        )

    def hybrid_embedding(self, output: DupMAEModelOutput, task: str = "document") -> torch.Tensor:
        """The hybrid embedding of `output` for `task` ("query" or "document"): `hybrid_representation`."""
        return hybrid_representation(self.config, output.dense_embedding, output.ot_embedding, task)


class DupMAEModel(DupMAERepresentationMixin, ClsEncoderModel):
    """The DupMAE encoder (`AutoModel`) on a BERT base: a plain BERT (same parameter names) plus `cls` (the tied
    MLM head) and `dense_proj` (`DupMAERepresentationMixin`)."""

    def __init__(self, config: DupMAEConfig, add_pooling_layer: bool = False):
        super().__init__(config, add_pooling_layer=add_pooling_layer)  # runs BertModel's post_init: no head yet
        self.build_representation(config, "cls", BertOnlyMLMHead, BertBackbone.tied_weights_keys(""))
        self.post_init()

    def ot_head_parts(self):
        return None if self.cls is None else BertBackbone.head_parts(self.cls)

    def get_output_embeddings(self):
        return None if self.cls is None else BertBackbone.output_embeddings(self.cls)

    def set_output_embeddings(self, new_embeddings):
        BertBackbone.set_output_embeddings(self.cls, new_embeddings)


class DupMAEAnyEncoderModel(DupMAERepresentationMixin, AnyEncoderModel):
    """The DupMAE encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base: the base under its pre-training
    name plus its MLM head under the pre-training model's name (`lm_head`) and `dense_proj`."""

    def build_heads(self, config: DupMAEConfig) -> None:
        backbone = self.backbone
        self.build_representation(
            config, backbone.head_name, backbone.build_head, backbone.tied_weights_keys(f"{backbone.prefix}.")
        )

    def ot_head_parts(self):
        head = getattr(self, self.head_name)
        return None if head is None else self.backbone.head_parts(head)

    def get_output_embeddings(self):
        head = getattr(self, self.head_name)
        return None if head is None else self.backbone.output_embeddings(head)


class DupMAEForMaskedLM(MaskedLMBase):
    """The DupMAE encoder and its trained MLM head (`AutoModelForMaskedLM`, fill-mask) on any base."""

    config_class = DupMAEConfig


class DupMAEForPretraining(RetroMAEForPretraining):
    """DupMAE pre-training model (`AutoModelForPreTraining`): encoder MLM + [CLS] decoding (RetroMAE's decoder) +
    OT decoding (§3.3): the masked input's states at its unmasked ordinary tokens go through the tied MLM head (as in
    the official code) and are max-pooled into mu (eq. 6-7); the BoW loss (eq. 8) is the cross-entropy of softmax(mu)
    against `ot_bag_of_words_targets` (normalised, unlike eq. 8 as printed), averaged over rows. Keys: `bert.*`,
    `cls.*`, `decoder.*` (absent without `cls_decoding`)."""

    config_class = DupMAEConfig
    encoder_class = DupMAEModel
    any_encoder_class = DupMAEAnyEncoderModel
    masked_lm_class = DupMAEForMaskedLM
    head_prefixes = ("decoder.",)

    def build_decoder(self, config: DupMAEConfig) -> RetroMAEDecoder | None:
        # no unused decoder: it would break DDP's gradient bookkeeping and bloat checkpoints
        return super().build_decoder(config) if config.cls_decoding else None

    def ot_embedding(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """mu `(batch_size, vocab_size)` pooled over the positions `keep` `(batch_size, seq_len)` of `hidden`."""
        return ot_vector(hidden, keep, *self.head_parts(), self.config.loss_chunk_size)

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: PretrainingBatch
    ) -> dict[str, torch.Tensor]:
        """`decoder_loss` of the [CLS] decoder (RetroMAE's, with `cls_decoding`) and `bow_loss` of OT decoding (with
        `ot_decoding`): `decoder_labels` are the decoder's targets and, as a set per row, the bag of words."""
        losses = super().method_losses(hidden, sentence_embedding, batch) if self.config.cls_decoding else {}
        if self.config.ot_decoding:
            keep = (batch.decoder_labels != IGNORE_INDEX) & (batch.encoder_labels == IGNORE_INDEX)  # unmasked ordinary
            mu = self.ot_embedding(hidden, keep)  # (B, V)
            targets = ot_bag_of_words_targets(batch.decoder_labels, mu.shape[-1], self.config.bow_normalization)
            losses["bow_loss"] = bag_of_words_loss(mu, targets)
        return losses

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        return {**super().loss_weights(), "bow_loss": self.config.bow_loss_weight}


DupMAEConfig.register_for_auto_class()
DupMAEModel.register_for_auto_class("AutoModel")
DupMAEAnyEncoderModel.register_for_auto_class("AutoModel")
DupMAEForPretraining.register_for_auto_class("AutoModelForPreTraining")
DupMAEForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = [
    "DupMAEAnyEncoderModel",
    "DupMAEForMaskedLM",
    "DupMAEForPretraining",
    "DupMAEModel",
    "DupMAEModelOutput",
    "hybrid_representation",
    "representation_parts",
    "ot_bag_of_words_targets",
    "ot_vector",
    "sparsify_top_k",
]
