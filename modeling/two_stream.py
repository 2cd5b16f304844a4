"""The two-stream `BertLayer` every decoder runs through (queries from one stream, keys and values from another),
attended in chunks of query rows under a dense per-row mask."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertLayer, eager_attention_forward

# attention implementations that take the decoders' dense per-row `(B, 1, Lq, Lk)` mask; flash kernels take a padding
# mask only, and flex attention would gain no block sparsity from a random mask
DENSE_MASK_ATTENTION = ("eager", "sdpa")


def decoder_attn_implementation(encoder_implementation: str | None) -> str:
    """The decoders' attention implementation for the encoder's `config._attn_implementation`: the same when it
    takes a dense mask (`DENSE_MASK_ATTENTION`), else sdpa."""
    return encoder_implementation if encoder_implementation in DENSE_MASK_ATTENTION else "sdpa"


def attention_bias(visible: torch.Tensor, attn_implementation: str | None, dtype: torch.dtype) -> torch.Tensor:
    """The mask form an attention implementation expects, from a bool `visible` (True = may attend): 0 / finfo.min of
    `dtype` for eager, which adds it to the scores; the bool mask itself for sdpa (as transformers builds them)."""
    if attn_implementation == "eager":
        return torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype, device=visible.device).masked_fill_(visible, 0.0)
    return visible


# A per-row mask of more than this many elements is attended over chunks of query rows, each recomputed in the
# backward pass, so the float mask sdpa makes of the bool one (and eager's scores) exist for one chunk at a time.
# Rows are independent: the outputs equal the unchunked ones; key/value gradients differ by rounding; dropout draws
# per chunk. L = 512 up to batch 64 and L = 2048 up to batch 4 run unchunked.
ATTENTION_CHUNK_ELEMENTS = 1 << 24


def two_stream_layer_forward(
    layer: nn.Module, query_stream: torch.Tensor, content_stream: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Run a `BertLayer` with queries from `query_stream` and keys/values from `content_stream`.

    The residual runs on the query stream (RetroMAE eq. 5); equals `layer(x, mask)` when both streams are `x`.
    Attention runs on `decoder_attn_implementation`, over chunks of query rows above `ATTENTION_CHUNK_ELEMENTS`.

    Args:
        layer: a `transformers` BertLayer.
        query_stream: `(B, Lq, H)`.
        content_stream: `(B, Lk, H)`.
        visible: `(B, 1, Lq, Lk)` bool, True = may attend (`(B, 1, 1, Lk)` for a mask shared by all rows).

    Returns:
        `(B, Lq, H)`.
    """
    attention = layer.attention.self
    batch_size, q_len, _ = query_stream.shape
    head_dim = attention.attention_head_size

    def split_heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch_size, -1, attention.num_attention_heads, head_dim).transpose(1, 2)  # (B, heads, L, d)

    q = split_heads(attention.query(query_stream))
    k = split_heads(attention.key(content_stream))
    v = split_heads(attention.value(content_stream))
    implementation = decoder_attn_implementation(attention.config._attn_implementation)
    attention_function = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
    dropout = attention.dropout.p if layer.training else 0.0

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        bias = attention_bias(visible, implementation, query_stream.dtype)
        return attention_function(attention, q, k, v, bias, dropout=dropout, scaling=attention.scaling)[0]

    rows = max(1, ATTENTION_CHUNK_ELEMENTS // (batch_size * k.shape[2]))  # query rows per chunk
    if visible.shape[-2] == 1 or rows >= q_len:
        context = attend(q, k, v, visible)  # (B, Lq, heads, d)
    else:
        recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        parts = []
        for start in range(0, q_len, rows):
            chunk = (q[:, :, start : start + rows], k, v, visible[:, :, start : start + rows])
            parts.append(checkpoint(attend, *chunk, use_reentrant=False) if recompute else attend(*chunk))
        context = torch.cat(parts, dim=1)  # (B, Lq, heads, d)
    context = context.reshape(batch_size, q_len, -1)
    return layer.feed_forward_chunk(layer.attention.output(context, query_stream))


class TwoStreamBertLayer(BertLayer):
    """A `BertLayer` (same parameter names, so BERT weights load) whose forward is `two_stream_layer_forward`; as a
    `GradientCheckpointingLayer` it takes its tensors positionally."""

    def forward(self, query_stream: torch.Tensor, content_stream: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        return two_stream_layer_forward(self, query_stream, content_stream, visible)


__all__ = ["DENSE_MASK_ATTENTION", "TwoStreamBertLayer", "attention_bias", "decoder_attn_implementation",
           "two_stream_layer_forward"]
