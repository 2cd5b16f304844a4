"""Building blocks shared by the pre-training models (Hub remote code: torch/transformers only).

- `linear_cross_entropy`: vocabulary projection fused with cross-entropy, computed in row chunks so no
  (rows, vocab_size) logits tensor outlives its chunk; gradients are formed in the forward pass (no recompute).
- `enhanced_visibility_mask`: RetroMAE's position-specific attention mask (paper eq. 7), sampled on the device.
- `two_stream_layer_forward`: one BertLayer with queries from one stream and keys/values from another.
- `random_row_mask`: an exact-count random subset of positions per row, vectorized.
- `bag_of_words_targets` / `bag_of_words_loss`: the BoW objective shared by BoW prediction and DupMAE.
"""

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # label of positions that carry no target


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T + bias` against `labels`, chunked over rows.

    The gradient of the mean loss w.r.t. the logits is (softmax - one_hot) / N; it is folded into the gradients of
    `hidden`, `weight` and `bias` chunk by chunk during the forward pass, which costs the same three matmuls as the
    ordinary forward + backward but keeps only one chunk of logits alive.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size: int, compute_dtype: torch.dtype):
        num_rows = hidden.shape[0]  # N
        needs_grad = any(ctx.needs_input_grad[:3])
        w = weight.to(compute_dtype)
        acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # softmax and sums never below fp32
        total = torch.zeros((), dtype=acc_dtype, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if needs_grad else None
        grad_bias = torch.zeros(bias.shape, dtype=acc_dtype, device=bias.device) if needs_grad else None
        for start in range(0, num_rows, chunk_size):
            h = hidden[start : start + chunk_size].to(compute_dtype)  # (n, H)
            y = labels[start : start + chunk_size]  # (n,)
            logits = torch.addmm(bias.to(compute_dtype), h, w.t()).to(acc_dtype)  # (n, V)
            lse = torch.logsumexp(logits, dim=-1)  # (n,)
            total += (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()
            if not needs_grad:
                continue
            grad_logits = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            grad_logits[torch.arange(y.shape[0], device=y.device), y] -= 1.0
            grad_logits = grad_logits.to(compute_dtype)
            if grad_hidden is not None:
                grad_hidden[start : start + chunk_size] = (grad_logits @ w).to(hidden.dtype)  # (n, H)
            if compute_dtype == acc_dtype:
                grad_weight.addmm_(grad_logits.t(), h)  # (V, H)
            else:
                grad_weight += (grad_logits.t() @ h).to(acc_dtype)
            grad_bias += grad_logits.to(acc_dtype).sum(0)
        scale = 1.0 / max(num_rows, 1)
        if needs_grad:  # scaled in place: one (V, H) gradient buffer per call, no copies
            grad_weight = grad_weight.mul_(scale).to(weight.dtype)
            grad_bias = grad_bias.mul_(scale).to(bias.dtype)
            ctx.save_for_backward(grad_hidden.mul_(scale) if grad_hidden is not None else None, grad_weight, grad_bias)
        return total * scale

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        # the saved gradients are used once, so they are scaled in place (grad_output is 1 unless weighted)
        grads = [g.mul_(grad_output) if g is not None else None for g in ctx.saved_tensors]
        return grads[0], grads[1], grads[2], None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """Mean cross-entropy of the vocabulary projection of `hidden`.

    Args:
        hidden: `(num_rows, hidden_size)` states already selected at the positions that carry a label.
        weight: `(vocab_size, hidden_size)` output projection (tied to the word embeddings).
        bias: `(vocab_size,)`.
        labels: `(num_rows,)` target ids, all valid (no -100).
        chunk_size: rows per chunk.

    Returns:
        Scalar mean loss; exactly 0 (still attached to the graph) when there are no rows.
    """
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0 + weight.sum() * 0.0
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    with torch.autocast(device_type, enabled=False):
        return _LinearCrossEntropy.apply(hidden, weight, bias, labels, chunk_size, compute_dtype)


def random_row_mask(candidates: torch.Tensor, ratio: float) -> torch.Tensor:
    """Pick exactly `round(ratio * n)` of the `n` True positions of each row of `candidates` (at least 1).

    Args:
        candidates: `(..., L)` bool.

    Returns:
        `(..., L)` bool, a subset of `candidates`.
    """
    keys = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, 2.0)
    count = (candidates.sum(-1, keepdim=True) * ratio).round().clamp(min=1)  # (..., 1)
    ranks = keys.argsort(-1).argsort(-1)  # rank of each position among its row's keys
    return (ranks < count) & candidates


def enhanced_visibility_mask(attention_mask: torch.Tensor, mask_ratio: float) -> torch.Tensor:
    """RetroMAE's position-specific attention mask (paper eq. 7), sampled independently for every row.

    Row i may attend to a random `1 - mask_ratio` share of the real positions, never to itself, and always to
    position 0 (the sentence embedding) when i > 0. Padding is never visible; padding rows see position 0 only.

    Args:
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        mask_ratio: share of real positions hidden from each row.

    Returns:
        `(batch_size, 1, seq_len, seq_len)` bool, True = may attend (SDPA convention).
    """
    real = attention_mask.bool()  # (B, L)
    batch_size, seq_len = real.shape
    keys = torch.rand(batch_size, seq_len, seq_len, device=real.device)  # (B, Lq, Lk)
    keys.masked_fill_(~real[:, None, :], 2.0)  # padding columns sort last, never chosen
    n_visible = (real.sum(-1) - (real.sum(-1) * mask_ratio).round()).clamp(min=1).long()  # (B,)
    kth_key = keys.sort(-1).values.gather(-1, (n_visible - 1)[:, None, None].expand(-1, seq_len, 1))  # (B, Lq, 1)
    visible = keys <= kth_key  # (B, Lq, Lk), n_visible real columns per row
    eye = torch.eye(seq_len, dtype=torch.bool, device=real.device)
    visible &= ~eye
    visible[:, 1:, 0] = True
    # rows left with nothing to attend to (padding rows, row 0 of a 1-token sequence) look at position 0
    empty = ~visible.any(-1) | ~real
    visible[empty] = False
    visible[..., 0] |= empty
    return visible[:, None]


def two_stream_layer_forward(
    layer: nn.Module, query_stream: torch.Tensor, content_stream: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    """Run a `BertLayer` with queries from `query_stream` and keys/values from `content_stream`.

    The residual connection runs on the query stream (RetroMAE eq. 5); parameter names stay BertLayer's, so BERT
    weights load into the decoder. Equals `layer(x, mask)` when both streams are `x`.

    Args:
        layer: a `transformers` BertLayer.
        query_stream: `(B, Lq, H)`.
        content_stream: `(B, Lk, H)`.
        visible: `(B, 1, Lq, Lk)` bool, True = may attend.

    Returns:
        `(B, Lq, H)`.
    """
    attention = layer.attention.self
    batch_size, q_len, _ = query_stream.shape
    heads, head_dim = attention.num_attention_heads, attention.attention_head_size

    def split_heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch_size, -1, heads, head_dim).transpose(1, 2)  # (B, heads, L, head_dim)

    q = split_heads(attention.query(query_stream))
    k = split_heads(attention.key(content_stream))
    v = split_heads(attention.value(content_stream))
    context = F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible, dropout_p=attention.dropout.p if layer.training else 0.0, scale=attention.scaling
    )  # (B, heads, Lq, head_dim)
    context = context.transpose(1, 2).reshape(batch_size, q_len, heads * head_dim)
    return layer.feed_forward_chunk(layer.attention.output(context, query_stream))


def bag_of_words_targets(token_labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The uniform distribution over each row's unique labelled tokens.

    Which tokens count is decided by the labels alone: the collator's `decoder_labels` carry the original id at
    every real non-special position and -100 at special tokens and padding, so special tokens are excluded by the
    tokenizer's own special-token ids (no vocabulary-specific id thresholds). Repeated tokens count once.

    Args:
        token_labels: `(batch_size, seq_len)` token ids, -100 where a position is not part of the bag.
        vocab_size: size of the vocabulary axis.

    Returns:
        `(batch_size, vocab_size)` float32; row b is 1/|S_b| on the unique ids S_b and 0 elsewhere, all zeros when
        the row has no labelled token.
    """
    labelled = token_labels != IGNORE_INDEX  # (B, L)
    counts = torch.zeros(token_labels.shape[0], vocab_size, dtype=torch.float32, device=token_labels.device)
    counts.scatter_add_(1, token_labels.clamp(min=0), labelled.float())  # (B, V) occurrences per id
    present = (counts > 0).float()  # (B, V)
    return present / present.sum(-1, keepdim=True).clamp(min=1.0)


def bag_of_words_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of softmax(`logits`) against the target distributions, averaged over rows that have targets.

    Per row: -sum_v targets[v] * log_softmax(logits)[v] = the mean over the unique input tokens of -log p(token).

    Args:
        logits: `(batch_size, vocab_size)`.
        targets: `(batch_size, vocab_size)` from `bag_of_words_targets`.

    Returns:
        Scalar; exactly 0 (still attached to the graph) when no row has a target.
    """
    has_targets = (targets.sum(-1) > 0).float()  # (B,)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, V), float32 even under autocast
    per_row = -(targets * log_probs).sum(-1)  # (B,), 0 for rows without targets
    return (per_row * has_targets).sum() / has_targets.sum().clamp(min=1.0)  # no host sync


__all__ = ["IGNORE_INDEX", "bag_of_words_loss", "bag_of_words_targets", "enhanced_visibility_mask", "linear_cross_entropy", "random_row_mask", "two_stream_layer_forward"]
