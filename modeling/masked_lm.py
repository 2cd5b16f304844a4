"""The encoder and MLM head every pre-training model is built on, and the masked LM of a pre-training checkpoint
(`AutoModelForMaskedLM`, so `pipeline("fill-mask")` runs on it): that encoder and its trained head, decoders dropped."""

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_outputs import MaskedLMOutput
from transformers.models.bert.modeling_bert import BertPreTrainedModel

from .backbones import BertBackbone, HeadParts, backbone_of
from .loading import QuietLoadReportMixin
from .vocab_losses import IGNORE_INDEX


class BaseInitMixin:
    """`_init_weights` of the model's base family: on a base other than BERT the encoder's own (`self.backbone`);
    BERT's is the inherited one."""

    @torch.no_grad()
    def _init_weights(self, module):
        encoder = getattr(self, self.backbone.prefix, None) if hasattr(self, "backbone") else None
        if encoder is None or self.backbone is BertBackbone:
            super()._init_weights(module)
        else:
            encoder._init_weights(module)


class EncoderHeadMixin:
    """The config's base family (`backbone`): its encoder and MLM head, named as in the base's `*ForMaskedLM`
    (BERT: `bert` + `cls`; see `backbones`) and tied as there, so the base's checkpoints load unchanged."""

    base_model_prefix = BertBackbone.prefix  # BERT's; another base sets its own on the instance
    _tied_weights_keys = BertBackbone.tied_weights_keys(f"{BertBackbone.prefix}.")

    def build_encoder_and_head(self, config) -> None:
        """Set `backbone` and build the encoder and the MLM head; call before `post_init`."""
        self.backbone = backbone_of(config)
        if self.backbone is not BertBackbone:  # instance attributes: transformers reads them from the model
            self.base_model_prefix = self.backbone.prefix
            self._tied_weights_keys = self.backbone.tied_weights_keys(f"{self.backbone.prefix}.")
        setattr(self, self.backbone.prefix, self.backbone.build_encoder(config))
        setattr(self, self.backbone.head_name, self.backbone.build_head(config))

    @property
    def mlm_head(self) -> nn.Module:
        return getattr(self, self.backbone.head_name)

    def head_parts(self) -> HeadParts:
        """The tied MLM head as (transform, output weight, output bias)."""
        return self.backbone.head_parts(self.mlm_head)

    def get_output_embeddings(self):
        return self.backbone.output_embeddings(self.mlm_head)

    def set_output_embeddings(self, new_embeddings):
        self.backbone.set_output_embeddings(self.mlm_head, new_embeddings)


class MaskedLMBase(EncoderHeadMixin, BaseInitMixin, QuietLoadReportMixin, BertPreTrainedModel):
    """The `AutoModelForMaskedLM` of a pre-training checkpoint on any base: the encoder and the trained MLM head
    under the pre-training model's names (BERT, RoBERTa, XLM-R: those of the base's `*ForMaskedLM`), so the
    checkpoint's keys load as they are and its decoders are left out. Each method subclasses it with its
    `config_class`."""

    quiet_unexpected_keys = (r"^decoder\.",)  # the method's decoders

    def __init__(self, config):
        super().__init__(config)
        self.build_encoder_and_head(config)
        self.post_init()

    def forward(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs,
    ) -> MaskedLMOutput:
        r"""
        Args:
            input_ids: `(batch_size, seq_len)`, masked positions holding the mask token.
            attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
            token_type_ids: `(batch_size, seq_len)`, optional; dropped on a base without them (ModernBERT).
            labels: `(batch_size, seq_len)` ids to predict, -100 elsewhere; optional.
            **kwargs: the base model's other inputs (`output_hidden_states`, ...).

        Returns:
            `MaskedLMOutput`: `logits` `(batch_size, seq_len, vocab_size)`; `loss`, the mean cross-entropy over the
            labelled positions, when `labels` are given.
        """
        if self.backbone.takes_token_type_ids:
            kwargs["token_type_ids"] = token_type_ids
        kwargs["return_dict"] = True
        output = self.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        logits = self.mlm_head(output.last_hidden_state)  # (B, L, V)
        loss = None
        if labels is not None:
            keep = labels != IGNORE_INDEX  # (B, L)
            loss = F.cross_entropy(logits[keep].float(), labels[keep])
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=output.hidden_states,
                              attentions=output.attentions)


__all__ = ["BaseInitMixin", "EncoderHeadMixin", "MaskedLMBase"]
