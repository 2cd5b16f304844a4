"""RetroMAE (Xiao et al., 2022): masked auto-encoder pre-training for retrieval."""

import torch
from torch import nn

from .backbones import DecoderEmbeddings, decoder_position_table
from .configuration_retromae import RetroMAEConfig
from .masked_lm import MaskedLMBase
from .pretraining_base import IGNORE_INDEX, AnyEncoderModel, ClsEncoderModel, PretrainingBase, PretrainingBatch
from .two_stream import TwoStreamBertLayer
from .visibility import enhanced_visibility_mask, random_row_mask, reference_target_positions, reference_visibility_mask


class RetroMAEModel(ClsEncoderModel):
    """The RetroMAE encoder (`AutoModel`): a plain BERT; `pooler_output` is the [CLS] sentence embedding."""

    config_class = RetroMAEConfig


class RetroMAEAnyEncoderModel(AnyEncoderModel):
    """The RetroMAE encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base."""

    config_class = RetroMAEConfig


class RetroMAEForMaskedLM(MaskedLMBase):
    """The RetroMAE encoder and its trained MLM head (`AutoModelForMaskedLM`, fill-mask) on any base."""

    config_class = RetroMAEConfig


class RetroMAEDecoder(nn.Module):
    """RetroMAE's light-weight decoder (paper §3.2-3.3).

    Enhanced decoding: one layer, queries h + p_i, keys/values [h, e(x_1) + p_1 ...] of the unmasked input, a fresh
    per-row visibility matrix each step. Basic decoding: [h, e(x~) + p] with `decoder_mask_ratio` of the tokens
    masked, self-attention through `num_decoder_layers` layers. A base without a position table gets
    `position_embeddings` (`DecoderEmbeddings`).
    """

    def __init__(self, config: RetroMAEConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList([TwoStreamBertLayer(config) for _ in range(config.num_decoder_layers)])
        self.position_embeddings = decoder_position_table(config)

    def forward(
        self, sentence_embedding: torch.Tensor, original_ids: torch.Tensor, attention_mask: torch.Tensor,
        decoder_labels: torch.Tensor, embeddings: DecoderEmbeddings, word_starts: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder states `(B, L, H)` and the labels they are scored against `(B, L)`; `word_starts` `(B, L)` is
        read by `decoder_visibility="reference"` only, which raises `ValueError` without it."""
        if self.config.decoder_targets == "reference":  # the official targets: all but [CLS] and [SEP], [UNK] included
            decoder_labels = original_ids.masked_fill(~reference_target_positions(attention_mask), IGNORE_INDEX)
        if self.config.decoding == "enhanced":
            hidden = self._enhanced(sentence_embedding, original_ids, attention_mask, embeddings, word_starts)
            return hidden, decoder_labels
        return self._basic(sentence_embedding, original_ids, attention_mask, decoder_labels, embeddings)

    def _visibility(self, attention_mask: torch.Tensor, word_starts: torch.Tensor | None) -> torch.Tensor:
        if self.config.decoder_visibility == "token":
            return enhanced_visibility_mask(attention_mask, self.config.decoder_mask_ratio)
        if word_starts is None:
            raise ValueError(
                "decoder_visibility='reference' hides whole words and needs the batch key 'decoder_word_starts' "
                "(the collator's word_starts: 1 where a token begins a word); pass it, or set "
                "decoder_visibility='token'"
            )
        return reference_visibility_mask(attention_mask, word_starts, self.config.decoder_mask_ratio)

    def _enhanced(
        self, h: torch.Tensor, original_ids: torch.Tensor, attention_mask: torch.Tensor, embeddings,
        word_starts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        batch_size, seq_len = original_ids.shape
        h_rows = h[:, None, :].expand(batch_size, seq_len, h.shape[-1])  # (B, L, H)
        if self.config.query_stream == "position":
            query_stream = h_rows + embeddings.positions(seq_len)  # h + p_i (paper eq. 4)
        else:
            query_stream = embeddings.query(h_rows)  # BERT: LayerNorm(h + p_i + t_0), dropout
        content = embeddings.tokens(original_ids)  # (B, L, H): e(x_i) + p_i over the unmasked input
        content_stream = torch.cat([h[:, None, :], content[:, 1:]], dim=1)  # position 0 carries h
        visible = self._visibility(attention_mask, word_starts)  # (B, 1, L, L)
        return self.layers[0](query_stream, content_stream, visible)

    def _basic(self, h, original_ids, attention_mask, decoder_labels, embeddings) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.mask_token_id is None:
            raise ValueError("decoding='basic' needs config.mask_token_id (set it from tokenizer.mask_token_id)")
        targets = random_row_mask(decoder_labels != IGNORE_INDEX, self.config.decoder_mask_ratio)  # (B, L)
        decoder_ids = original_ids.masked_fill(targets, self.config.mask_token_id)
        hidden = torch.cat([h[:, None, :], embeddings.tokens(decoder_ids)[:, 1:]], dim=1)  # (B, L, H)
        visible = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L): ordinary self-attention over real tokens
        for layer in self.layers:
            hidden = layer(hidden, hidden, visible)
        return hidden, decoder_labels.masked_fill(~targets, IGNORE_INDEX)


class RetroMAEForPretraining(PretrainingBase):
    """RetroMAE pre-training model (`AutoModelForPreTraining`): encoder MLM + decoder reconstruction.

    Keys: `bert.*`, `cls.*` (the MLM head of encoder and decoder), `decoder.*`; other bases use their own names.
    Besides the shared inputs, `forward` takes `decoder_word_starts` `(batch_size, seq_len)`, 1 where a token begins
    a word, read by `decoder_visibility="reference"` only.
    """

    config_class = RetroMAEConfig
    encoder_class = RetroMAEModel
    any_encoder_class = RetroMAEAnyEncoderModel
    masked_lm_class = RetroMAEForMaskedLM
    head_prefixes = ("decoder.",)
    method_input_names = ("decoder_word_starts",)

    def __init__(self, config: RetroMAEConfig):
        super().__init__(config)
        self.decoder = self.build_decoder(config)
        self.post_init()

    def build_decoder(self, config: RetroMAEConfig) -> RetroMAEDecoder | None:
        """The [CLS] decoder; a subclass that can switch it off returns None."""
        return RetroMAEDecoder(config)

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: PretrainingBatch
    ) -> dict[str, torch.Tensor]:
        """`decoder_loss`: the decoder rebuilds the unmasked input from h (every real non-special token with
        enhanced decoding, the masked ones with basic decoding)."""
        decoder_hidden, targets = self.decoder(
            sentence_embedding, batch.original_ids, batch.attention_mask, batch.decoder_labels, self.decoder_embeddings(),
            batch.method_inputs.get("decoder_word_starts"),
        )
        return self.decoder_terms(decoder_hidden, targets)

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        return {"encoder_mlm_loss": self.config.encoder_loss_weight, "decoder_loss": self.config.decoder_loss_weight}


RetroMAEConfig.register_for_auto_class()
RetroMAEModel.register_for_auto_class("AutoModel")
RetroMAEAnyEncoderModel.register_for_auto_class("AutoModel")
RetroMAEForPretraining.register_for_auto_class("AutoModelForPreTraining")
RetroMAEForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = ["RetroMAEAnyEncoderModel", "RetroMAEDecoder", "RetroMAEForMaskedLM", "RetroMAEForPretraining", "RetroMAEModel"]
