"""Building blocks of the pre-training models: the vocabulary projection fused with cross-entropy in row chunks,
RetroMAE's visibility-mask samplers (paper eq. 7 and the official collator's), the two-stream `BertLayer` every
decoder runs through, and the bag-of-words objective of BoW prediction and DupMAE.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertLayer, eager_attention_forward

IGNORE_INDEX = -100  # label of positions that carry no target


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
            grad_hidden[start : start + chunk_size] = (grad_logits @ w).to(hidden.dtype)  # (n, H)
        if grad_weight is not None and compute_dtype == acc_dtype:
            grad_weight.addmm_(grad_logits.t(), h)  # (V, H)
        elif grad_weight is not None:
            grad_weight += (grad_logits.t() @ h).to(acc_dtype)
        if grad_bias is not None:
            grad_bias += grad_logits.to(acc_dtype).sum(0)
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

    Returns:
        Scalar mean loss; exactly 0 (still attached to the graph) when there are no rows.
    """
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0 + weight.sum() * 0.0
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
    tracks_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad or bias.requires_grad)
    with torch.autocast(device_type, enabled=False):
        if not tracks_grad:
            no_grad = (False, False, False)
            total = _fused_cross_entropy(
                hidden, weight, bias, labels, chunk_size, compute_dtype, no_grad, compiled, vocab_multiple
            )[0]
            return total * (1.0 / hidden.shape[0])
        return _LinearCrossEntropy.apply(hidden, weight, bias, labels, chunk_size, compute_dtype, compiled, vocab_multiple)


# The mask samplers run eagerly inside a compiled model: they sync with the host anyway, and inductor mis-sizes the
# int32 view of `_random_keys`' int64 draws once sliced for topk ("setStorage: ... out of bounds", torch 2.13).
@torch.compiler.disable
def random_row_mask(candidates: torch.Tensor, ratio: float) -> torch.Tensor:
    """Pick exactly `round(ratio * n)` (at least 1) of the `n` True positions of each row of `candidates` `(..., L)`
    bool; returns a `(..., L)` bool subset of `candidates`."""
    keys = torch.rand(candidates.shape, device=candidates.device).masked_fill(~candidates, 2.0)
    count = (candidates.sum(-1, keepdim=True) * ratio).round().clamp(min=1)  # (..., 1)
    ranks = keys.argsort(-1).argsort(-1)  # rank of each position among its row's keys
    return (ranks < count) & candidates


_KEY_MASK = 0x3FFFFFFF  # 30 random bits per key
_PADDING_KEY_BIT = 0x40000000  # set on padding columns: above every real key, so never among the smallest


def _random_keys(leading_shape: tuple[int, ...], num_keys: int, device: torch.device) -> torch.Tensor:
    """`(*leading_shape, num_keys)` int32 keys, i.i.d. uniform over [0, 2**30): each int64 draw gives two, half the
    generator calls of `torch.rand`, on a finer grid than its 2**-24 (a tie at a cut-off: probability ~L / 2**30)."""
    raw = torch.empty(*leading_shape, (num_keys + 1) // 2, dtype=torch.int64, device=device).random_()
    return raw.view(torch.int32)[..., :num_keys].bitwise_and_(_KEY_MASK)


# Query rows are sampled in chunks of at most this many keys: the samplers' int32 keys and topk / sort results
# (4-16 bytes per (row, column)) exist per chunk, never for the whole (B, L, L), and the masks are the unchunked ones.
SAMPLER_CHUNK_ELEMENTS = 1 << 22


def _rows_per_chunk(row_elements: int) -> int:
    return max(1, SAMPLER_CHUNK_ELEMENTS // max(row_elements, 1))


def _row_subsets_by_topk(real: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """CPU sampler: per sequence, the `n_visible` smallest of fresh keys over its real rows x real columns (`topk`, a
    linear-time selection); padding rows choose nothing. The serial CPU generator gives chunked draws the same keys."""
    batch_size, seq_len = real.shape
    chosen = torch.zeros(batch_size, seq_len, seq_len, dtype=torch.bool, device=real.device)
    true = torch.ones((), dtype=torch.bool, device=real.device)
    if bool(real.all()):  # no padding (packed text): every row of the batch selects the same count
        count = int(n_visible[0])
        rows = chosen.view(batch_size * seq_len, seq_len)  # (B * Lq, Lk), rows in the order they are drawn
        step = _rows_per_chunk(seq_len)
        for start in range(0, rows.shape[0], step):
            keys = _random_keys((min(step, rows.shape[0] - start),), seq_len, real.device)  # (n_rows, Lk)
            picked = keys.topk(count, dim=-1, largest=False, sorted=False).indices  # (n_rows, count)
            rows[start : start + step].scatter_(-1, picked, true.expand(picked.shape))
        return chosen
    for b, count in enumerate(n_visible.tolist()):
        columns = real[b].nonzero().squeeze(1)  # (n,)
        n = columns.numel()
        if n == 0:
            continue
        right_padded = bool(real[b, :n].all())  # real tokens first: write into the (n, n) corner in place
        step = _rows_per_chunk(n)
        for start in range(0, n, step):
            stop = min(start + step, n)
            keys = _random_keys((stop - start,), n, real.device)  # (n_rows, n)
            picked = keys.topk(count, dim=-1, largest=False, sorted=False).indices  # (n_rows, count)
            if right_padded:
                chosen[b, start:stop, :n].scatter_(-1, picked, true.expand(picked.shape))
            else:
                chosen[b, columns[start:stop, None], columns[picked]] = True
    return chosen


def _row_subsets_by_sort(real: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """Accelerator sampler: one draw of all keys (chunked draws would differ on a counter-based generator), sorted in
    chunks of query rows, no host sync; padding rows choose nothing."""
    batch_size, seq_len = real.shape
    keys = _random_keys((batch_size, seq_len), seq_len, real.device)  # (B, Lq, Lk)
    keys.bitwise_or_(torch.where(real, 0, _PADDING_KEY_BIT).to(torch.int32)[:, None, :])
    chosen = torch.empty(batch_size, seq_len, seq_len, dtype=torch.bool, device=real.device)
    index = (n_visible - 1)[:, None, None]  # (B, 1, 1)
    step = _rows_per_chunk(batch_size * seq_len)
    for start in range(0, seq_len, step):
        part = keys[:, start : start + step]  # (B, n_rows, Lk)
        cutoff = part.sort(-1).values.gather(-1, index.expand(-1, part.shape[1], 1))  # (B, n_rows, 1)
        chosen[:, start : start + step] = (part <= cutoff) & real[:, start : start + step, None]
    return chosen


def random_row_subsets(real: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """For every real query row, a uniformly random set of exactly `n_visible[b]` of its sequence's real columns:
    `real` `(batch_size, seq_len)` bool, `n_visible` `(batch_size,)` long with 1 <= n_visible[b] <= real[b].sum() for
    every non-empty sequence; returns `(batch_size, seq_len, seq_len)` bool, padding rows empty."""
    sampler = _row_subsets_by_topk if real.device.type == "cpu" else _row_subsets_by_sort
    return sampler(real, n_visible)


@torch.compiler.disable  # eager inside a compiled model: see the note above random_row_mask
def enhanced_visibility_mask(attention_mask: torch.Tensor, mask_ratio: float) -> torch.Tensor:
    """RetroMAE's position-specific attention mask (paper eq. 7), sampled independently for every row: each real row
    sees a random n - round(n * mask_ratio) of the n real positions, never itself, and always position 0 (rows
    i > 0); a row left empty (row 0 of a 1-token sequence, padding rows) sees position 0.

    Args:
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        mask_ratio: share of real positions hidden from each row.

    Returns:
        `(batch_size, 1, seq_len, seq_len)` bool, True = may attend.
    """
    real = attention_mask.bool()  # (B, L)
    n_real = real.sum(-1)  # (B,)
    n_visible = (n_real - (n_real * mask_ratio).round()).clamp(min=1).long()  # (B,)
    visible = random_row_subsets(real, n_visible)  # (B, Lq, Lk)
    visible.diagonal(dim1=1, dim2=2).fill_(False)
    visible[:, 1:, 0] = True
    visible[:, 0, 0] |= ~visible[:, 0].any(-1)  # row 0 left with nothing to attend to looks at itself (position 0)
    return visible[:, None]


REFERENCE_POOL_SIZE = 256  # the official collator draws min(n, 256) whole-word masks per sequence
REFERENCE_MAX_PREDICTIONS = 512  # transformers' `_whole_word_mask` cap on masked tokens


def reference_target_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """The official code's decoder targets `(batch_size, seq_len)` bool: every real position but the first and the
    last ([CLS], [SEP]); [UNK] and other special ids inside the text included."""
    real = attention_mask.bool()  # (B, L)
    seq_len = real.shape[1]
    first = real.long().argmax(-1)  # (B,)
    last = seq_len - 1 - real.flip(-1).long().argmax(-1)  # (B,)
    positions = torch.arange(seq_len, device=real.device)
    return real & (positions != first[:, None]) & (positions != last[:, None])


def _greedy_whole_word_fill(sizes: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Which words of each shuffled word list the official `_whole_word_mask` masks, `(..., W)` bool: in order, every
    word that still fits under `budget` `(...)` tokens. `sizes` `(..., W)` counts tokens per word; absent words are
    larger than any budget and come last (`_existing_words_first`), so after the taken prefix (up to the first word
    that does not fit) at most max-word-length steps remain."""
    taken = sizes.cumsum(-1) <= budget[..., None]  # (..., W): the prefix before the first word that does not fit
    remaining = budget - (sizes * taken).sum(-1)  # (...)
    next_word = taken.sum(-1)  # (...): the first word not taken
    word_index = torch.arange(sizes.shape[-1], device=sizes.device)
    while True:
        fits = (sizes <= remaining[..., None]) & (word_index >= next_word[..., None]) & (remaining > 0)[..., None]
        found = fits.any(-1)  # (...)
        if not bool(found.any()):
            return taken
        first = fits.long().argmax(-1, keepdim=True)  # (..., 1): the next word that fits
        taken.scatter_(-1, first, found[..., None] | taken.gather(-1, first))
        remaining = remaining - torch.where(found, sizes.gather(-1, first).squeeze(-1), 0)
        next_word = torch.where(found, first.squeeze(-1) + 1, next_word)


def _existing_words_first(order: torch.Tensor, num_words: torch.Tensor) -> torch.Tensor:
    """`order` `(B, P, W)` with each row's absent word slots (ids >= `num_words` `(B,)`) moved behind its real words,
    which keep their shuffled order (a stable partition by cumulative counts: no sort, no draw). The greedy walk skips
    absent slots either way, but one left among the words would end `_greedy_whole_word_fill`'s prefix early, and
    the walk would go on one step per word."""
    if bool((num_words == order.shape[-1]).all()):  # no absent slot (e.g. packed copies): nothing to move
        return order
    exists = order < num_words[:, None, None]  # (B, P, W), in shuffled order
    real_before = exists.cumsum(-1)  # (B, P, W): real words up to and including each slot
    slot = torch.arange(order.shape[-1], device=order.device)
    # a real word goes to its rank among the real ones, an absent one behind all of them, by its rank among those
    position = torch.where(exists, real_before - 1, num_words[:, None, None] + slot - real_before)
    return torch.empty_like(order).scatter_(-1, position, order)


@torch.compiler.disable  # eager inside a compiled model: see the note above random_row_mask
def reference_visibility_mask(
    attention_mask: torch.Tensor, word_starts: torch.Tensor, mask_ratio: float
) -> torch.Tensor:
    """The decoder visibility matrix as the official RetroMAE collator samples it (`decoder_visibility="reference"`).

    Per sequence of n real tokens, [CLS] and [SEP] never hidden: a pool of min(n, 256) masks, each hiding shuffled
    whole words greedily up to min(512, max(1, round(n * mask_ratio))) tokens (transformers' `_whole_word_mask`);
    every row picks one mask of the pool and also hides itself. Padding rows see position 0 only.

    Args:
        attention_mask: `(batch_size, seq_len)`, 1 for real tokens.
        word_starts: `(batch_size, seq_len)`, 1 where a token begins a word (special tokens count as words).
        mask_ratio: the official `decoder_mlm_probability`.

    Returns:
        `(batch_size, 1, seq_len, seq_len)` bool, True = may attend.
    """
    real = attention_mask.bool()  # (B, L)
    batch_size, seq_len = real.shape
    device = real.device
    maskable = reference_target_positions(attention_mask)  # (B, L): all real tokens but [CLS] and [SEP]
    follows_maskable = torch.cat([torch.zeros_like(maskable[:, :1]), maskable[:, :-1]], dim=1)
    starts = maskable & ((word_starts != 0) | ~follows_maskable)  # a word also starts after [CLS]
    word_of_token = (starts.long().cumsum(-1) - 1).clamp(min=0)  # (B, L), meaningful where maskable
    num_words = int(starts.sum(-1).max().clamp(min=1))
    sizes = torch.zeros(batch_size, num_words, dtype=torch.long, device=device)
    sizes.scatter_add_(1, word_of_token, maskable.long())  # (B, W)
    sizes.masked_fill_(sizes == 0, seq_len + 1)  # absent words never fit
    n_real = real.sum(-1)  # (B,)
    budget = (n_real.double() * mask_ratio).round().long().clamp(min=1, max=REFERENCE_MAX_PREDICTIONS)  # Python round
    pool_sizes = n_real.clamp(min=1, max=REFERENCE_POOL_SIZE)  # (B,)
    pool = int(pool_sizes.max())
    order = torch.rand(batch_size, pool, num_words, device=device).argsort(-1)  # (B, P, W): one shuffle per mask
    order = _existing_words_first(order, starts.sum(-1))
    taken_in_order = _greedy_whole_word_fill(sizes[:, None, :].expand(-1, pool, -1).gather(-1, order), budget[:, None])
    taken = torch.zeros_like(taken_in_order).scatter_(-1, order, taken_in_order)  # (B, P, W) by word id
    hidden_pool = taken.gather(-1, word_of_token[:, None, :].expand(-1, pool, -1)) & maskable[:, None, :]  # (B, P, L)
    pick = torch.randint(0, 2**62, (batch_size, seq_len), device=device) % pool_sizes[:, None]  # (B, L)
    # the one (B, Lq, Lk) tensor here, bool, updated in place: visible = real columns & not hidden & real rows
    visible = hidden_pool.gather(1, pick[..., None].expand(-1, -1, seq_len)).logical_not_()  # (B, Lq, Lk)
    visible &= real[:, None, :]
    visible &= real[:, :, None]
    visible.diagonal(dim1=1, dim2=2).fill_(False)
    visible[:, 1:, 0] |= ~real[:, 1:]  # padding rows see position 0
    visible[:, 0, 0] |= ~visible[:, 0].any(-1)  # a 1-token sequence's row 0 looks at position 0
    return visible[:, None]


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


__all__ = ["IGNORE_INDEX", "bag_of_words_loss", "bag_of_words_targets", "enhanced_visibility_mask", "linear_argmax_accuracy", "linear_cross_entropy", "random_row_mask", "random_row_subsets", "reference_target_positions", "reference_visibility_mask", "two_stream_layer_forward", "TwoStreamBertLayer", "attention_bias", "DENSE_MASK_ATTENTION", "decoder_attn_implementation"]
