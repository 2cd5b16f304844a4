"""DupMAE's representation (paper §3.4), shared by the pre-training model, the encoder and `st_dupmae.DupMAEPooling`:
mu, the vocabulary logits max-pooled over the ordinary tokens (eq. 6-7), its top-k (eq. 11), and the hybrid
[W h ; top-k(mu)] embedding. Imports torch only, none of our files: it ships alone beside `st_dupmae.py`.
"""

from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import nn

Representation = Literal["hybrid", "cls", "ot"]
REPRESENTATIONS: tuple[str, ...] = get_args(Representation)
OTActivation = Literal["none", "log1p_relu"]
OT_ACTIVATIONS: tuple[str, ...] = get_args(OTActivation)


def _chunked_max(hidden, weight, bias, keep, chunk_positions: int, compute_dtype: torch.dtype, track: bool):
    """The forward of `token_max_logits`: (mu, arg-max positions or None, rows that have kept positions)."""
    batch_size, seq_len, _ = hidden.shape  # (B, L, H)
    vocab_size = weight.shape[0]
    # The mask rides along in the matmul: an extra input column holding 0 (kept) or a huge negative number (not
    # kept) times an extra weight column of ones, which saves a masking pass over every (B, c, V) chunk.
    w = torch.cat([weight.to(compute_dtype), weight.new_ones(vocab_size, 1, dtype=compute_dtype)], dim=1)  # (V, H+1)
    penalty = torch.zeros(keep.shape, dtype=compute_dtype, device=hidden.device)
    penalty.masked_fill_(~keep, torch.finfo(compute_dtype).min / 2)  # (B, L)
    acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # bf16/fp16 logits are compared in float32
    best = torch.full((batch_size, vocab_size), float("-inf"), dtype=acc_dtype, device=hidden.device)
    best_pos = torch.zeros((batch_size, vocab_size), dtype=torch.long, device=hidden.device) if track else None
    for start in range(0, seq_len, chunk_positions):
        stop = start + chunk_positions
        h = torch.cat([hidden[:, start:stop].to(compute_dtype), penalty[:, start:stop, None]], dim=-1)  # (B, c, H+1)
        logits = torch.matmul(h, w.t()).to(acc_dtype)  # (B, c, V); the bias is added after the max (same arg-max)
        if not track:  # inference: no arg-max bookkeeping
            torch.maximum(best, logits.amax(dim=1), out=best)
            continue
        chunk_max, chunk_pos = logits.max(dim=1)  # (B, V)
        better = chunk_max > best  # strict: ties keep the earliest position, as torch.max does
        best = torch.where(better, chunk_max, best)
        best_pos = torch.where(better, chunk_pos + start, best_pos)
        del logits
    has_tokens = keep.any(dim=1)  # (B,) rows without a single ordinary token get mu = 0, no gradient
    mu = (best + bias.to(acc_dtype)).masked_fill_(~has_tokens[:, None], 0.0)
    return mu.to(hidden.dtype), best_pos, has_tokens


class _TokenMaxLogits(torch.autograd.Function):
    """mu[b, v] = max_{l : keep[b, l]} (hidden[b, l] . weight[v] + bias[v]), chunked over the sequence.

    Only the arg-max per (b, v) is kept; the backward rebuilds each chunk's sparse `(B, c, V)` gradient from it, so
    compute equals the naive max's and peak extra memory is one chunk of logits instead of `B * L * V`.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, keep, chunk_positions: int, compute_dtype: torch.dtype):
        mu, best_pos, has_tokens = _chunked_max(hidden, weight, bias, keep, chunk_positions, compute_dtype, True)
        ctx.save_for_backward(hidden, weight, best_pos, has_tokens)
        ctx.chunk_positions = chunk_positions
        ctx.compute_dtype = compute_dtype
        return mu

    @staticmethod
    def backward(ctx, grad_mu):
        hidden, weight, best_pos, has_tokens = ctx.saved_tensors
        chunk_positions, compute_dtype = ctx.chunk_positions, ctx.compute_dtype
        batch_size, seq_len, hidden_size = hidden.shape
        acc_dtype = torch.promote_types(compute_dtype, torch.float32)
        grad_mu = grad_mu.to(acc_dtype).masked_fill(~has_tokens[:, None], 0.0)  # (B, V)
        w = weight.to(compute_dtype)
        grad_hidden = torch.zeros_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device)
        for start in range(0, seq_len, chunk_positions):
            positions = torch.arange(start, min(start + chunk_positions, seq_len), device=hidden.device)  # (c,)
            # (B, c, V): grad_mu[b, v] at (b, best_pos[b, v], v), zero elsewhere
            grad_logits = torch.where(best_pos[:, None, :] == positions[None, :, None], grad_mu[:, None, :], 0.0)
            grad_logits = grad_logits.to(compute_dtype)
            h = hidden[:, start : start + chunk_positions].to(compute_dtype)  # (B, c, H)
            if grad_hidden is not None:
                grad_hidden[:, start : start + chunk_positions] = torch.matmul(grad_logits, w).to(hidden.dtype)
            # (V, B*c) @ (B*c, H)
            grad_weight += (grad_logits.reshape(-1, grad_logits.shape[-1]).t() @ h.reshape(-1, hidden_size)).to(
                acc_dtype
            )
            del grad_logits
        grad_bias = grad_mu.sum(0)  # every (b, v) with tokens contributes exactly once
        return grad_hidden, grad_weight.to(weight.dtype), grad_bias.to(weight.dtype), None, None, None


def token_max_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    keep: torch.Tensor,
    chunk_size: int = 4096,
) -> torch.Tensor:
    """DupMAE's OT vector mu (eq. 6-7): the vocabulary logits max-pooled over the kept positions.

    Args:
        hidden: `(batch_size, seq_len, hidden_size)` token states, already through the MLM head's transform.
        weight: `(vocab_size, hidden_size)` vocabulary projection (the tied word embeddings).
        bias: `(vocab_size,)`.
        keep: `(batch_size, seq_len)` bool, the positions pooled over.
        chunk_size: logits rows (batch_size * positions) per chunk.

    Returns:
        `(batch_size, vocab_size)` mu in `hidden`'s dtype; all zeros for a row with no kept position.
    """
    batch_size, seq_len, _ = hidden.shape
    if batch_size == 0 or seq_len == 0:
        return hidden.new_zeros((batch_size, weight.shape[0])) + weight.sum() * 0.0
    chunk_positions = max(1, chunk_size // batch_size)
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    track = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad)
    with torch.autocast(device_type, enabled=False):
        if not track:
            return _chunked_max(hidden, weight, bias, keep.bool(), chunk_positions, compute_dtype, False)[0]
        return _TokenMaxLogits.apply(hidden, weight, bias, keep.bool(), chunk_positions, compute_dtype)


def ordinary_token_mask(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor,
    special_token_ids: list[int] | None,
) -> torch.Tensor:
    """Positions of ordinary tokens `(batch_size, seq_len)` bool: real and not a special token.

    Args:
        input_ids: `(batch_size, seq_len)`; None only with `special_token_ids` None (else `ValueError`).
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        special_token_ids: the tokenizer's special ids; None excludes position 0 and the last real position of each
            row (the layout `[CLS] text [SEP]`).
    """
    real = attention_mask.bool()
    if special_token_ids is not None:
        if input_ids is None:
            raise ValueError("ordinary_token_mask needs input_ids to exclude special_token_ids")
        specials = torch.tensor(sorted(set(special_token_ids)), dtype=input_ids.dtype, device=input_ids.device)
        return real & ~torch.isin(input_ids, specials)
    seq_len = real.shape[1]
    positions = torch.arange(seq_len, device=real.device)[None, :]  # (1, L)
    last_real = (real.long() * positions).amax(dim=1, keepdim=True)  # (B, 1), right padding
    return real & (positions > 0) & (positions != last_real)


def initial_dense_projection(hidden_size: int, dense_dim: int, seed: int) -> torch.Tensor:
    """The starting W^cls `(dense_dim, hidden_size)`: a random Johnson-Lindenstrauss map, normal(0, 1/sqrt(dense_dim)),
    from its own CPU generator seeded with `seed`, never the global RNG, so `DupMAEModel` and the sentence-transformers
    export start from the same matrix; (W h_q) . (W h_d) estimates h_q . h_d without bias until fine-tuning."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(dense_dim, hidden_size, generator=generator) * dense_dim**-0.5


def activate_ot(mu: torch.Tensor, activation: str) -> torch.Tensor:
    """The OT vector a representation uses, from mu `(batch_size, vocab_size)`: ``"none"`` mu itself (eq. 6-7);
    ``"log1p_relu"`` SPLADE's log(1 + relu(mu)), which tames the mostly positive raw logits whose sparse sum would
    dwarf the dense term of eq. 12. Any other `activation` raises `ValueError`."""
    if activation == "none":
        return mu
    if activation == "log1p_relu":
        return torch.log1p(torch.relu(mu))
    raise ValueError(f"ot_activation={activation!r} is not supported; choose one of {OT_ACTIVATIONS}")


def sparsify_top_k(mu: torch.Tensor, k: int | None) -> torch.Tensor:
    """Keep the `k` largest entries of each row of `mu` `(batch_size, vocab_size)`, zero the rest (eq. 11); `k=None`
    or `k >= vocab_size` returns `mu`."""
    if k is None or k >= mu.shape[-1]:
        return mu
    values, indices = mu.topk(k, dim=-1)  # (B, k)
    return torch.zeros_like(mu).scatter(-1, indices, values)


def ot_vector(
    hidden: torch.Tensor,
    keep: torch.Tensor,
    transform: nn.Module,
    weight: torch.Tensor,
    bias: torch.Tensor,
    chunk_size: int,
) -> torch.Tensor:
    """mu = max over the kept positions of an MLM head's logits, `(batch_size, vocab_size)` (eq. 6-7).

    The kept positions are packed to the front (stably: ties resolve to the earliest) and the sequence is cut to the
    longest row's count, so in pre-training the head's `transform` runs on ~0.7 L rows per sequence, not L.

    Args:
        hidden: `(batch_size, seq_len, hidden_size)` token states.
        keep: `(batch_size, seq_len)` the positions pooled over.
        transform, weight `(vocab_size, hidden_size)`, bias `(vocab_size,)`: the MLM head.
        chunk_size: logits rows per chunk of `token_max_logits`.
    """
    keep = keep.bool()
    kept = int(keep.sum(dim=1).max()) if keep.numel() else 0
    if 0 < kept < keep.shape[1]:
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :kept]  # (B, L_kept) kept first
        hidden = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, L_kept, H)
        keep = keep.gather(1, order)
    return token_max_logits(transform(hidden), weight, bias, keep, chunk_size)


def check_representation(
    representation: str,
    hidden_size: int,
    vocab_size: int,
    dense_dim: int,
    doc_top_k: int,
    query_top_k: int | None,
    ot_activation: str,
    sparse_weight: float,
    set_hint: Callable[[str, int], str] | None = None,
) -> None:
    """`ValueError` naming the setting when the representation's settings do not fit the model; `set_hint(name,
    value)` (how a user sets it) ends the `dense_dim` and `doc_top_k` messages."""
    hint = set_hint or (lambda name, value: "")
    if representation not in REPRESENTATIONS:
        raise ValueError(f"representation={representation!r} is not supported; choose one of {REPRESENTATIONS}")
    if ot_activation not in OT_ACTIVATIONS:
        raise ValueError(f"ot_activation={ot_activation!r} is not supported; choose one of {OT_ACTIVATIONS}")
    if not 1 <= dense_dim <= hidden_size:
        raise ValueError(
            f"dense_dim={dense_dim} must lie in [1, hidden_size={hidden_size}] (d' is a reduction of the [CLS] "
            f"embedding; a larger d' adds cost but no information){hint('dense_dim', hidden_size)}"
        )
    if representation == "cls" and dense_dim != hidden_size:
        raise ValueError(
            f"representation='cls' uses the [CLS] state without projection: dense_dim={dense_dim} must equal "
            f"hidden_size={hidden_size}"
        )
    if not 1 <= doc_top_k <= vocab_size:
        raise ValueError(f"doc_top_k={doc_top_k} must lie in [1, vocab_size={vocab_size}]"
                         f"{hint('doc_top_k', min(max(doc_top_k, 1), vocab_size))}")
    if query_top_k is not None and not 1 <= query_top_k <= vocab_size:
        raise ValueError(f"query_top_k={query_top_k} must be None (full mu) or lie in [1, vocab_size={vocab_size}]")
    if not sparse_weight > 0:
        raise ValueError(f"sparse_weight={sparse_weight} must be > 0 (1.0 = the paper's eq. 12)")


def dense_and_ot_parts(
    token_states: torch.Tensor,
    keep: torch.Tensor,
    representation: str,
    dense_proj: nn.Module | None,
    ot_head: tuple[nn.Module, torch.Tensor, torch.Tensor] | None,
    ot_activation: str,
    chunk_size: int,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The two parts of a text's representation (paper §3.4), before top-k.

    Args:
        token_states: `(batch_size, seq_len, hidden_size)` last-layer states of the unmasked input, [CLS] first.
        keep: `(batch_size, seq_len)` its ordinary tokens (`ordinary_token_mask`).
        representation: ``"hybrid"``, ``"cls"`` or ``"ot"``.
        dense_proj: W^cls (eq. 10), read for ``"hybrid"``; ot_head: (transform, weight, bias), read unless ``"cls"``.
        ot_activation / chunk_size: as `activate_ot` / `token_max_logits` take them.

    Returns:
        dense `(batch_size, dense_dim)` (W^cls h; h for ``"cls"``; None for ``"ot"``) and mu `(batch_size,
        vocab_size)` after `ot_activation` (None for ``"cls"``).
    """
    h = token_states[:, 0]  # (B, H) [CLS]
    dense = None if representation == "ot" else (dense_proj(h) if representation == "hybrid" else h)
    mu = None
    if representation != "cls":
        mu = activate_ot(ot_vector(token_states, keep, *ot_head, chunk_size), ot_activation)
    return dense, mu


def sparse_top_k(
    mu: torch.Tensor, k: int | None, sparse_weight: float
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The sparse part sqrt(`sparse_weight`) * top-k(mu) (eq. 11) `(batch_size, vocab_size)`, and its kept entries
    as (indices, values) `(batch_size, k)` -- None when `k` keeps the whole of mu (`k=None` or `k >= vocab_size`)."""
    scale = sparse_weight**0.5
    if k is None or k >= mu.shape[-1]:
        return mu * scale, None, None
    values, indices = mu.topk(k, dim=-1)  # (B, k)
    values = values * scale
    return torch.zeros_like(mu).scatter(-1, indices, values), indices, values


def hybrid_embedding(dense: torch.Tensor | None, sparse: torch.Tensor | None) -> torch.Tensor:
    """[dense ; sparse] `(batch_size, dense_dim + vocab_size)` (one part only for ``"cls"`` / ``"ot"``): the dot
    product of a query's and a document's embedding is the paper's eq. 12 score."""
    return torch.cat([part for part in (dense, sparse) if part is not None], dim=-1)


__all__ = [
    "OT_ACTIVATIONS",
    "REPRESENTATIONS",
    "OTActivation",
    "Representation",
    "activate_ot",
    "check_representation",
    "dense_and_ot_parts",
    "hybrid_embedding",
    "initial_dense_projection",
    "ordinary_token_mask",
    "ot_vector",
    "sparse_top_k",
    "sparsify_top_k",
    "token_max_logits",
]
