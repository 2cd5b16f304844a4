"""The vocabulary projection fused with cross-entropy in row chunks (every MLM and decoder loss), and the
bag-of-words objective of BoW prediction and DupMAE."""

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # label of positions that carry no target
# `linear_cross_entropy`'s kernels: our row chunks; Apple's cut-cross-entropy (logits never stored), exact or with its
# gradient filter (softmax entries below bf16 resolution / 32 skipped in the backward)
LOSS_KERNELS = ("chunked", "cce", "cce_filtered")


def _fused_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int,
    compute_dtype: torch.dtype,
    needs_grad: tuple[bool, bool, bool],
    compiled: bool = False,
    vocab_multiple: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Summed cross-entropy over chunks of rows, and the unscaled gradients of the summed loss w.r.t. the inputs
    flagged in `needs_grad` (None for the others; no (V, H) buffer when none is). `compiled`: see `_chunk_terms`;
    `vocab_multiple`: see `_padded_projection` (the gradients come back in the unpadded shapes)."""
    num_rows, vocab_size = hidden.shape[0], weight.shape[0]  # N, V
    any_grad = any(needs_grad)
    w, b = _padded_projection(weight, bias, compute_dtype, vocab_multiple)  # (V', H), (V',)
    acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # softmax and sums never below fp32
    total = torch.zeros((), dtype=acc_dtype, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if needs_grad[0] else None
    grad_weight = torch.zeros(w.shape, dtype=acc_dtype, device=weight.device) if needs_grad[1] else None
    grad_bias = torch.zeros(b.shape, dtype=acc_dtype, device=bias.device) if needs_grad[2] else None
    for start in range(0, num_rows, chunk_size):
        h = hidden[start : start + chunk_size].to(compute_dtype)  # (n, H)
        y = labels[start : start + chunk_size]  # (n,)
        logits = torch.addmm(b, h, w.t())  # (n, V'); the padded columns are -inf
        if compiled:
            chunk_total, grad_logits = _compiled_chunk_terms()(logits, y, any_grad)
            total += chunk_total
        else:
            logits = logits.to(acc_dtype)
            lse = torch.logsumexp(logits, dim=-1)  # (n,)
            total += (lse - logits.gather(1, y[:, None]).squeeze(1)).sum()
            if any_grad:
                grad_logits = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
                grad_logits[torch.arange(y.shape[0], device=y.device), y] -= 1.0
                grad_logits = grad_logits.to(compute_dtype)
        if not any_grad:
            continue
        if grad_hidden is not None:
            grad_hidden[start : start + chunk_size] = grad_logits @ w  # (n, H), cast by the copy
        if grad_weight is not None and compute_dtype == acc_dtype:
            grad_weight.addmm_(grad_logits.t(), h)  # (V, H)
        elif grad_weight is not None:  # cast inside the add: no fp32 copy of the (V, H) product
            grad_weight.add_(grad_logits.t() @ h)
        if grad_bias is not None:  # summed in acc_dtype without an fp32 copy of the (n, V') logits
            grad_bias += grad_logits.sum(0, dtype=acc_dtype)
    if grad_weight is not None:  # leading rows of a contiguous buffer: a contiguous view, no copy
        grad_weight = grad_weight[:vocab_size]
    if grad_bias is not None:
        grad_bias = grad_bias[:vocab_size]
    return total, grad_hidden, grad_weight, grad_bias


def _padded_projection(weight: torch.Tensor, bias: torch.Tensor, compute_dtype: torch.dtype, vocab_multiple: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` `(V, H)` and `bias` `(V,)` in `compute_dtype`, their vocabulary dimension padded up to a multiple of
    `vocab_multiple` (16-byte-aligned GEMMs; V = 30,522 is not) with zero weight rows and a bias of -inf, so that the
    padded logits are -inf: softmax probability and gradient exactly 0. Cast and padding in one copy."""
    vocab_size, hidden_size = weight.shape
    padding = -vocab_size % vocab_multiple if vocab_multiple > 1 else 0
    if not padding:
        return weight.to(compute_dtype), bias.to(compute_dtype)
    w = torch.empty(vocab_size + padding, hidden_size, dtype=compute_dtype, device=weight.device)
    w[:vocab_size].copy_(weight)
    w[vocab_size:].zero_()
    b = torch.empty(vocab_size + padding, dtype=compute_dtype, device=bias.device)
    b[:vocab_size].copy_(bias)
    b[vocab_size:].fill_(float("-inf"))
    return w, b


def _chunk_terms(logits: torch.Tensor, labels: torch.Tensor, with_grad: bool
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Summed cross-entropy of `logits` `(n, V)` against `labels` `(n,)` in fp32 at least, and its gradient w.r.t. the
    logits (softmax - one-hot) or None; out of place, so that compiled it makes two passes over the logits."""
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(scores, dim=-1)  # (n,)
    total = (lse - scores.gather(1, labels[:, None]).squeeze(1)).sum()
    if not with_grad:
        return total, None
    columns = torch.arange(scores.shape[1], device=scores.device)
    grad = (scores - lse[:, None]).exp() - (columns == labels[:, None]).to(scores.dtype)
    return total, grad.to(logits.dtype)


_compiled_chunk = None


def _compiled_chunk_terms():
    """`_chunk_terms` under torch.compile, built on first use (dynamic: every chunk and batch has its own row count)."""
    global _compiled_chunk
    if _compiled_chunk is None:
        _compiled_chunk = torch.compile(_chunk_terms, dynamic=True)
    return _compiled_chunk


class _LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of `hidden @ weight.T + bias` against `labels`, chunked over rows.

    The gradients are formed chunk by chunk in the forward pass (the same three matmuls as forward + backward, one
    chunk of logits alive) and scaled in place by the backward, so a second backward through the graph raises.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size: int, compute_dtype: torch.dtype, compiled: bool,
                vocab_multiple: int):
        needs_grad = tuple(ctx.needs_input_grad[:3])
        total, grad_hidden, grad_weight, grad_bias = _fused_cross_entropy(
            hidden, weight, bias, labels, chunk_size, compute_dtype, needs_grad, compiled, vocab_multiple
        )
        scale = 1.0 / max(hidden.shape[0], 1)
        ctx.backward_done = False
        ctx.save_for_backward(
            grad_hidden.mul_(scale) if grad_hidden is not None else None,
            grad_weight.mul_(scale).to(weight.dtype) if grad_weight is not None else None,
            grad_bias.mul_(scale).to(bias.dtype) if grad_bias is not None else None,
        )
        return total * scale

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        if ctx.backward_done:  # the saved gradients were already scaled in place by the first backward
            raise RuntimeError(
                "linear_cross_entropy does not support a second backward through the same graph (retain_graph=True): "
                "its gradients are formed in the forward pass and consumed by the first backward; compute the loss "
                "again for another backward"
            )
        ctx.backward_done = True
        grads = [g.mul_(grad_output) if g is not None else None for g in ctx.saved_tensors]
        return grads[0], grads[1], grads[2], None, None, None, None, None


def _cut_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, labels: torch.Tensor,
                       compute_dtype: torch.dtype, filtered: bool) -> torch.Tensor:
    """Mean cross-entropy by the `cut-cross-entropy` package: its Triton kernels on CUDA, its torch.compile version
    (all logits at once) elsewhere. The kernel takes no bias, so the bias rides on one more hidden column
    (`[hidden, 1] @ [weight, bias].T`), zero-padded to a multiple of 16 columns for aligned loads."""
    try:
        from cut_cross_entropy import linear_cross_entropy as cut_cross_entropy
    except ImportError as error:
        raise ImportError("the cce loss kernels need the cut-cross-entropy package: pip install cut-cross-entropy, "
                          "or use the chunked kernel") from error
    hidden_size = hidden.shape[1]
    extra = 16 - hidden_size % 16  # >= 1: the bias column, then zeros
    e = F.pad(hidden.to(compute_dtype), (0, extra))  # (N, H')
    e[:, hidden_size] = 1.0
    c = F.pad(torch.cat([weight.to(compute_dtype), bias.to(compute_dtype)[:, None]], dim=1), (0, extra - 1))  # (V, H')
    impl = "cce" if hidden.device.type == "cuda" else "torch_compile"
    filter_eps = "auto" if filtered and impl == "cce" else None
    return cut_cross_entropy(e, c, labels, reduction="mean", filter_eps=filter_eps, impl=impl).float()


@torch.no_grad()
def linear_argmax_accuracy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, labels: torch.Tensor,
                           chunk_size: int = 4096) -> torch.Tensor:
    """Share of rows whose highest-scoring id under `hidden @ weight.T + bias` is the label, over chunks of rows
    (shapes as `linear_cross_entropy`'s); a float32 scalar without gradient, NaN when there are no rows."""
    if hidden.shape[0] == 0:
        return torch.full((), float("nan"), device=hidden.device)
    correct = torch.zeros((), dtype=torch.long, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk_size):
        logits = F.linear(hidden[start : start + chunk_size], weight, bias)  # (n, V), one chunk at a time
        correct += (logits.argmax(dim=-1) == labels[start : start + chunk_size]).sum()
    return correct.float() / hidden.shape[0]


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = 4096,
    compiled: bool = False,
    vocab_multiple: int = 1,
    kernel: str = "chunked",
) -> torch.Tensor:
    """Mean cross-entropy of the vocabulary projection of `hidden`; without gradient, no gradient buffers.

    Args:
        hidden: `(num_rows, hidden_size)` states at the positions that carry a label.
        weight: `(vocab_size, hidden_size)` output projection (tied to the word embeddings).
        bias: `(vocab_size,)`.
        labels: `(num_rows,)` target ids, all valid (no -100).
        chunk_size: rows per chunk.
        compiled: each chunk's softmax and gradient in one compiled kernel (the same result within rounding).
        vocab_multiple: inside the loss, pad the vocabulary dimension up to a multiple of this (zero weight rows, bias
            -inf: probability and gradient exactly 0), so that the GEMMs are aligned (e.g. 64 for V = 30,522); the
            loss and gradients (of the unpadded shapes) are the unpadded ones within rounding. 1: no padding.
        kernel: one of `LOSS_KERNELS`. `cce` / `cce_filtered` need the `cut-cross-entropy` package and ignore
            `chunk_size`, `compiled` and `vocab_multiple`; `cce_filtered` filters only on CUDA.

    Returns:
        Scalar mean loss; exactly 0 (still attached to the graph) when there are no rows.
    """
    if kernel not in LOSS_KERNELS:
        raise ValueError(f"kernel={kernel!r}: choose one of {', '.join(LOSS_KERNELS)}")
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0 + weight.sum() * 0.0
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    tracks_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad)
    with torch.autocast(device_type, enabled=False):
        if kernel != "chunked":
            return _cut_cross_entropy(hidden, weight, bias, labels, compute_dtype, kernel == "cce_filtered")
        if not tracks_grad:
            no_grad = (False, False, False)
            total = _fused_cross_entropy(
                hidden, weight, bias, labels, chunk_size, compute_dtype, no_grad, compiled, vocab_multiple
            )[0]
            return total * (1.0 / hidden.shape[0])
        return _LinearCrossEntropy.apply(hidden, weight, bias, labels, chunk_size, compute_dtype, compiled, vocab_multiple)


def bag_of_words_targets(token_labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The uniform distribution over each row's unique labelled tokens (repeats count once).

    Args:
        token_labels: `(batch_size, seq_len)` token ids, -100 where a position is not part of the bag (the collator's
            `decoder_labels` mark special tokens and padding so).
        vocab_size: size of the vocabulary axis.

    Returns:
        `(batch_size, vocab_size)` float32: 1/|S_b| on row b's unique ids S_b, all zeros for a row without labels.
    """
    labelled = token_labels != IGNORE_INDEX  # (B, L)
    counts = torch.zeros(token_labels.shape[0], vocab_size, dtype=torch.float32, device=token_labels.device)
    counts.scatter_add_(1, token_labels.clamp(min=0), labelled.float())  # (B, V) occurrences per id
    present = (counts > 0).float()  # (B, V)
    return present / present.sum(-1, keepdim=True).clamp(min=1.0)


def bag_of_words_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of softmax(`logits`) `(batch_size, vocab_size)` against `targets` `(batch_size, vocab_size)` from
    `bag_of_words_targets` (per row, the mean over its unique tokens of -log p(token)), averaged over the rows with
    targets: a scalar, exactly 0 (still attached to the graph) when no row has one."""
    has_targets = (targets.sum(-1) > 0).float()  # (B,)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, V), float32 even under autocast
    per_row = -(targets * log_probs).sum(-1)  # (B,), 0 for rows without targets
    return (per_row * has_targets).sum() / has_targets.sum().clamp(min=1.0)  # no host sync


__all__ = ["IGNORE_INDEX", "LOSS_KERNELS", "bag_of_words_loss", "bag_of_words_targets", "linear_argmax_accuracy", "linear_cross_entropy"]
