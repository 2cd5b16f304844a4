"""RetroMAE's visibility-mask samplers for the decoders: enhanced decoding (paper eq. 7) and the official
collator's whole-word pool."""

import torch


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


__all__ = ["enhanced_visibility_mask", "random_row_mask", "random_row_subsets", "reference_target_positions",
           "reference_visibility_mask"]
