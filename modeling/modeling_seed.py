"""SEED-Encoder (Lu et al., 2021): encoder MLM plus a weak auto-regressive decoder that sees only the [CLS]
embedding and a window of the previous k tokens."""

import torch
from torch import nn

from .backbones import DecoderEmbeddings, decoder_position_table
from .configuration_seed import SEEDConfig
from .masked_lm import MaskedLMBase
from .pretraining_base import IGNORE_INDEX, AnyEncoderModel, ClsEncoderModel, PretrainingBase, PretrainingBatch
from .two_stream import TwoStreamBertLayer


def windowed_causal_visibility(attention_mask: torch.Tensor, window: int) -> torch.Tensor:
    """Which decoder positions each position may attend to: itself, the `window - 1` positions before it, and 0.

    With the input shifted right, row j sees the k = `window` tokens before its target plus h at position 0; for
    k=2, L=6 the rows are [1,0,0,0,0,0], [1,1,0,0,0,0], [1,1,1,0,0,0], [1,0,1,1,0,0], [1,0,0,1,1,0], [1,0,0,0,1,1]
    (the reference's `buffered_future_mask`). Padding columns are never visible.

    Args:
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        window: k >= 1 (else `ValueError`).

    Returns:
        `(batch_size, 1, seq_len, seq_len)` bool, True = may attend.
    """
    if window < 1:
        raise ValueError(f"attention_window={window} must be >= 1")
    real = attention_mask.bool()  # (B, L)
    seq_len = real.shape[1]
    # (Lq, Lk) keys j-k+1 ... j, built in bool: an int64 query-key offset matrix would be 8 bytes per pair
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool, device=real.device)
    band = ones.tril() & ~ones.tril(-window)
    band[:, 0] = True  # the sentence embedding h
    visible = band[None] & real[:, None, :]  # (B, Lq, Lk)
    visible[:, :, 0] = True
    return visible[:, None]


def next_token_targets(decoder_labels: torch.Tensor) -> torch.Tensor:
    """Targets `(batch_size, seq_len)` of the shifted-right decoder: position j is scored against the label of
    position j + 1 of `decoder_labels` `(batch_size, seq_len)`; the last column is -100."""
    targets = torch.full_like(decoder_labels, IGNORE_INDEX)
    targets[:, :-1] = decoder_labels[:, 1:]
    return targets


class SEEDEncoderModel(ClsEncoderModel):
    """The SEED-Encoder encoder (`AutoModel`): a plain BERT; `pooler_output` is the [CLS] sentence embedding."""

    config_class = SEEDConfig


class SEEDAnyEncoderModel(AnyEncoderModel):
    """The SEED-Encoder encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base."""

    config_class = SEEDConfig


class SEEDEncoderForMaskedLM(MaskedLMBase):
    """The SEED-Encoder encoder and its trained MLM head (`AutoModelForMaskedLM`, fill-mask) on any base."""

    config_class = SEEDConfig


class SEEDDecoder(nn.Module):
    """SEED-Encoder's weak decoder: `num_decoder_layers` BertLayers with windowed causal self-attention.

    Its input is the collator's [CLS, x_1 ... x_n, SEP, pad ...] shifted right behind h: position j holds h (j = 0)
    or e(x_j) and predicts x_{j+1}, so every real non-special token is predicted once (e: the encoder's embedding
    module, plus the decoder's own positions on a base without a table). Each layer's rows see h and the k =
    `attention_window` last inputs: per layer, as in the reference code, so N layers reach N(k-1)+1 tokens back
    (`attention_window_scope="total"`: k in all).

    h is a prefix token, not the reference's one-vector cross-attention memory (microsoft/SEED-Encoder): attention
    over a single key has weight 1 and adds the same W_o W_v h everywhere, while a prefix reaches each position with
    a learned weight; plain `BertLayer`s keep BERT's names and add no cross-attention parameters (as bowdpr's).
    """

    def __init__(self, config: SEEDConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(
            [TwoStreamBertLayer(config, layer_idx=i) for i in range(config.num_decoder_layers)]
        )
        self.position_embeddings = decoder_position_table(config)

    def forward(
        self, sentence_embedding: torch.Tensor, original_ids: torch.Tensor, attention_mask: torch.Tensor,
        embeddings: DecoderEmbeddings,
    ) -> torch.Tensor:
        """
        Args:
            sentence_embedding: `(batch_size, hidden_size)` h.
            original_ids: `(batch_size, seq_len)` the unmasked input, [CLS] at position 0.
            attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
            embeddings: the encoder's embeddings (tied input embeddings) with the decoder's positions.

        Returns:
            `(batch_size, seq_len, hidden_size)`; position j predicts the token at position j + 1.
        """
        tokens = embeddings.tokens(original_ids)  # (B, L, H)
        hidden = torch.cat([sentence_embedding[:, None, :].to(tokens.dtype), tokens[:, 1:]], dim=1)  # h replaces [CLS]
        first_visible = windowed_causal_visibility(attention_mask, self.config.attention_window)  # (B, 1, L, L)
        # "total": the later layers see only their own position and h, so the whole stack sees k tokens back
        later_visible = first_visible if self.config.attention_window_scope == "per_layer" else (
            windowed_causal_visibility(attention_mask, 1)
        )
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, hidden, first_visible if index == 0 else later_visible)  # ordinary self-attention
        return hidden


class SEEDEncoderForPretraining(PretrainingBase):
    """SEED-Encoder pre-training model (`AutoModelForPreTraining`): encoder MLM + weak-decoder reconstruction.
    Keys: `bert.*`, `cls.*` (the tied MLM head of encoder and decoder), `decoder.layers.N.*` (BertLayer names)."""

    config_class = SEEDConfig
    encoder_class = SEEDEncoderModel
    any_encoder_class = SEEDAnyEncoderModel
    masked_lm_class = SEEDEncoderForMaskedLM
    head_prefixes = ("decoder.",)

    def __init__(self, config: SEEDConfig):
        super().__init__(config)
        self.decoder = SEEDDecoder(config)
        self.post_init()

    def method_losses(
        self, hidden: torch.Tensor, sentence_embedding: torch.Tensor, batch: PretrainingBatch
    ) -> dict[str, torch.Tensor]:
        """`decoder_loss`: every label of `decoder_labels` predicted from h and the k tokens before it."""
        decoder_hidden = self.decoder(
            sentence_embedding, batch.original_ids, batch.attention_mask, self.decoder_embeddings()
        )
        return self.decoder_terms(decoder_hidden, next_token_targets(batch.decoder_labels))

    def loss_weights(self) -> dict[str, float | torch.Tensor]:
        return {"encoder_mlm_loss": self.config.encoder_loss_weight, "decoder_loss": self.config.decoder_loss_weight}


SEEDConfig.register_for_auto_class()
SEEDEncoderModel.register_for_auto_class("AutoModel")
SEEDAnyEncoderModel.register_for_auto_class("AutoModel")
SEEDEncoderForPretraining.register_for_auto_class("AutoModelForPreTraining")
SEEDEncoderForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = [
    "SEEDAnyEncoderModel",
    "SEEDDecoder",
    "SEEDEncoderForMaskedLM",
    "SEEDEncoderForPretraining",
    "SEEDEncoderModel",
    "next_token_targets",
    "windowed_causal_visibility",
]
