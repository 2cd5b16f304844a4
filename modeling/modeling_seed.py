"""SEED-Encoder (Lu et al., 2021): encoder MLM plus a weak auto-regressive decoder that sees only the [CLS]
embedding and a window of the previous k tokens.

Hub remote code: torch/transformers only, relative imports for our own files.

Decoder, precisely. The collator's sequence is o = [CLS, x_1, ..., x_n, SEP, pad ...] and `decoder_labels` holds x_j at
positions 1..n and -100 at [CLS]/[SEP]/padding. The decoder input is the sequence shifted right with h in front:

    position j:   0        1         2        ...   n-1          (n, n+1, ... : inputs without a target)
    input:        h        e(x_1)    e(x_2)   ...   e(x_{n-1})
    target:       x_1      x_2       x_3      ...   x_n

(e = the encoder's embedding module: tied word + position + token-type embeddings, LayerNorm, dropout; h enters raw.
On a base without a position table (ModernBERT) e adds a position table of the decoder's own: the window mask alone
does not order the tokens inside the window.)
In every layer, row j attends to column 0 (h) and to columns j-k+1 ... j (k = `attention_window`); padding columns
are never visible. With one layer, x_t is predicted from h and exactly x_{t-k} ... x_{t-1} (paper eq. 9). The window
is an attention span per layer, as in the reference code (its `buffered_future_mask` is applied in each of the
3 layers) and the paper's "attention span k = 2": stacked, N layers reach N(k-1)+1 inputs back, so the default 3
layers with k=2 predict x_t from h and x_{t-4} ... x_{t-1}. `attention_window_scope="total"` offers the paper's
reading instead (eq. 9, a receptive field of exactly k): the first layer attends to the k-window, the later layers
only to their own position and h, so x_t is predicted from h and x_{t-k} ... x_{t-1}. Every real non-special token
x_1..x_n is predicted exactly once. The output head is the encoder's tied MLM head (`cls`), so input and output embeddings are shared.

Conditioning: h is a prefix token at position 0 that every row may attend to, not the one-vector cross-attention
memory of the reference code (microsoft/SEED-Encoder, fairseq `TransformerDecoder` with `EncoderOut` of length 1).
Cross-attention over a single key is degenerate: its softmax weight is identically 1, so each layer merely adds the
same position-independent vector W_o W_v h to every position, at the price of an extra attention block per layer.
As a prefix, h reaches every position through ordinary self-attention with a learned, position-dependent weight; the
layers are plain `BertLayer`s (state-dict names identical to the encoder's, so `decoder_init="copy_last_layer"` and
BERT weights load into them) and the decoder stays as small as the paper asks (no cross-attention parameters). This
is also how the BoW-prediction authors built their SEED-like AR decoder (bowdpr `ar_dec.py`: [CLS_rep, emb(text)[1:]],
row i sees column 0 and the previous k positions). The reference's extra always-visible BOS column is the slot h
takes here; the attention span over tokens is the same.
"""

import torch
from torch import nn

from .backbones import DecoderEmbeddings, decoder_position_table
from .configuration_seed import SEEDConfig
from .layers_retromae import TwoStreamBertLayer
from .pretraining_base import IGNORE_INDEX, AnyEncoderModel, BertPretrainingBase, ClsEncoderModel, PretrainingBatch


def windowed_causal_visibility(attention_mask: torch.Tensor, window: int) -> torch.Tensor:
    """Which decoder positions each position may attend to: itself, the `window - 1` positions before it, and 0.

    With the decoder input shifted right (position j holds x_j and predicts x_{j+1}), row j therefore sees the k =
    `window` previous tokens x_{j-k+1} ... x_j of its target, plus the sentence embedding at position 0. For k=2, L=6:
    rows [1,0,0,0,0,0], [1,1,0,0,0,0], [1,1,1,0,0,0], [1,0,1,1,0,0], [1,0,0,1,1,0], [1,0,0,0,1,1] (the reference's
    `buffered_future_mask`). Padding columns are never visible; every row sees column 0, so no row is empty.

    Args:
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        window: k >= 1.

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
    """Targets of the shifted-right decoder: position j is scored against the label of position j + 1.

    Args:
        decoder_labels: `(batch_size, seq_len)` original ids at real non-special positions, -100 elsewhere.

    Returns:
        `(batch_size, seq_len)`; the last column is -100.
    """
    targets = torch.full_like(decoder_labels, IGNORE_INDEX)
    targets[:, :-1] = decoder_labels[:, 1:]
    return targets


class SEEDEncoderModel(ClsEncoderModel):
    """The SEED-Encoder encoder (`AutoModel`): a plain BERT; `pooler_output` is the [CLS] sentence embedding."""

    config_class = SEEDConfig


class SEEDAnyEncoderModel(AnyEncoderModel):
    """The SEED-Encoder encoder (`AutoModel`) on a RoBERTa, XLM-R or ModernBERT base."""

    config_class = SEEDConfig


class SEEDDecoder(nn.Module):
    """SEED-Encoder's weak decoder: `num_decoder_layers` BertLayers with windowed causal self-attention over
    [h, e(x_1), ..., e(x_{L-1})] (see the module docstring)."""

    def __init__(self, config: SEEDConfig):
        super().__init__()
        self.config = config
        # BertLayer names and weights; attention on the decoder's own implementation (`decoder_attn_implementation`)
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


class SEEDEncoderForPretraining(BertPretrainingBase):
    """SEED-Encoder pre-training model (`AutoModelForPreTraining`): encoder MLM + weak-decoder reconstruction.

    Keys: `bert.*` (encoder), `cls.*` (MLM head, shared by encoder and decoder, tied to the word embeddings),
    `decoder.layers.N.*` (BertLayer names). Any attention implementation BERT offers is accepted for the encoder;
    the decoder relies on an explicit 4-D mask and runs on `decoder_attn_implementation` of it (eager or sdpa).
    """

    config_class = SEEDConfig
    encoder_class = SEEDEncoderModel
    any_encoder_class = SEEDAnyEncoderModel
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

__all__ = [
    "SEEDAnyEncoderModel",
    "SEEDDecoder",
    "SEEDEncoderForPretraining",
    "SEEDEncoderModel",
    "next_token_targets",
    "windowed_causal_visibility",
]
