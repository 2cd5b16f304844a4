"""RetroMAE's reference-exact sampling options: `decoder_visibility="reference"` and
`decoder_targets="reference"` sample as the official code (staoxiao/RetroMAE, src/pretrain/data.py) does, beside the
paper's defaults."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import partial

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.visibility import enhanced_visibility_mask, reference_visibility_mask

from ..builders import masked_batch, tiny_pretraining_config

tiny_config = partial(tiny_pretraining_config, RetroMAEConfig)


def official_pool_mask_distribution(word_sizes: list[int], budget: int) -> dict[frozenset[int], float]:
    """Exact distribution of one official whole-word mask, by enumerating every shuffle of the words: walk them in
    order, skip a word that would overflow the budget, stop once the budget is met."""
    counts: Counter[frozenset[int]] = Counter()
    for order in itertools.permutations(range(len(word_sizes))):
        taken, covered = [], 0
        for word in order:
            if covered >= budget:
                break
            if covered + word_sizes[word] > budget:
                continue
            taken.append(word)
            covered += word_sizes[word]
        counts[frozenset(taken)] += 1
    total = math.factorial(len(word_sizes))
    return {subset: count / total for subset, count in counts.items()}


def words_of(word_starts: list[int]) -> list[list[int]]:
    """Token positions of each word between [CLS] (position 0) and [SEP] (the last position)."""
    words: list[list[int]] = []
    for position, start in enumerate(word_starts[1:-1], start=1):
        if start or not words:
            words.append([position])
        else:
            words[-1].append(position)
    return words


def test_pool_masks_follow_the_official_distribution():
    """[CLS] a b ## c d e ## ## [SEP]: words of sizes 1, 2, 1, 1, 3; n = 10, ratio 0.5 -> budget 5. Row 0 ([CLS]) is never in a mask, so what it cannot see is exactly one pool mask."""
    word_starts = [1, 1, 1, 0, 1, 1, 1, 0, 0, 1]  # [CLS] a b ## c d e ## ## [SEP]
    words = words_of(word_starts)
    assert [len(w) for w in words] == [1, 2, 1, 1, 3]
    exact = official_pool_mask_distribution([len(w) for w in words], budget=5)
    torch.manual_seed(0)
    draws = 6000
    starts = torch.tensor(word_starts).repeat(draws, 1)
    visible = reference_visibility_mask(torch.ones_like(starts), starts, 0.5)[:, 0]  # (draws, 10, 10)
    hidden = ~visible[:, 0, 1:-1]  # (draws, 8): row 0's hidden tokens, [CLS] and [SEP] aside
    assert visible[:, 0, -1].all(), "[SEP] is never hidden"
    observed: Counter[frozenset[int]] = Counter()
    for row in hidden.tolist():
        hidden_positions = {i + 1 for i, h in enumerate(row) if h}
        subset = frozenset(w for w, positions in enumerate(words) if set(positions) <= hidden_positions)
        assert hidden_positions == {p for w in subset for p in words[w]}, "whole words only"
        observed[subset] += 1
    assert set(observed) == set(exact)
    chi_square = sum((observed[s] - draws * p) ** 2 / (draws * p) for s, p in exact.items())
    assert chi_square < 2 * len(exact) + 20, (chi_square, exact, observed)  # far above the dof, far below a bias


def test_budget_rounds_like_python():
    """n = 45, ratio 0.7: 45 * 0.7 = 31.499999999999996 in double precision, so the official code hides
    round(31.4999...) = 31 tokens, where single precision would give 32."""
    assert round(45 * 0.7) == 31
    starts = torch.ones(50, 45, dtype=torch.long)
    visible = reference_visibility_mask(torch.ones_like(starts), starts, 0.7)[:, 0]
    assert (~visible[:, 0, 1:-1]).sum(-1).eq(31).all()


def test_reference_visibility_hides_whole_words_and_always_shows_cls_and_sep():
    torch.manual_seed(0)
    batch_size, seq_len = 6, 40
    lengths = [40, 33, 17, 25, 3, 40]
    attention = torch.zeros(batch_size, seq_len, dtype=torch.long)
    starts = (torch.rand(batch_size, seq_len) < 0.5).long()
    for b, n in enumerate(lengths):
        attention[b, :n] = 1
        starts[b, [0, n - 1]] = 1
    visible = reference_visibility_mask(attention, starts, 0.5)[:, 0]
    token_visible = enhanced_visibility_mask(attention, 0.5)[:, 0]
    split_words_token = 0
    for b, n in enumerate(lengths):
        words = words_of(starts[b, :n].tolist())
        assert not visible[b, :, n:].any(), "padding columns are never visible"
        assert visible[b, n:, 0].all() and not visible[b, n:, 1:].any(), "padding rows see position 0 only"
        for i in range(n):
            row = visible[b, i, :n]
            assert i == 0 or row[0], "[CLS] (h) is visible to every row i > 0"
            assert i == n - 1 or n == 1 or row[n - 1], "[SEP] is visible to every row but its own"
            assert not row[i]
            for positions in words:
                others = [p for p in positions if p != i]
                assert len({bool(row[p]) for p in others}) <= 1, "a word is hidden or shown as a whole"
                split_words_token += len({bool(token_visible[b, i, p]) for p in others}) > 1
    assert split_words_token > 0, "the paper's per-token sampling does split words"


def test_rows_pick_from_a_pool_of_256_masks_per_sequence():
    """n = 300 > 256: the official code draws 256 masks per sequence and every row picks one, so among 40 rows
    about C(40, 2) / 256 = 3 pairs share a mask; per-token sampling gives every row its own."""
    torch.manual_seed(0)
    starts = torch.ones(8, 300, dtype=torch.long)
    visible = reference_visibility_mask(torch.ones_like(starts), starts, 0.5)[:, 0]
    rows = visible[:, 1:41, 41:299]  # rows 1..40 seen through the columns no one of them sits on
    shared = sum(40 - len({tuple(r.tolist()) for r in rows[b]}) for b in range(8))
    assert 8 <= shared <= 60, shared  # expected 8 * ~3
    token_rows = enhanced_visibility_mask(torch.ones(1, 300, dtype=torch.long), 0.5)[0, 0, 1:41, 41:299]
    assert len({tuple(r.tolist()) for r in token_rows}) == 40


def test_reference_targets_include_unk(monkeypatch):
    """The collator's decoder_labels skip [UNK] (a special token); the official targets are every token but [CLS]
    and [SEP]."""
    unk = 1
    batch = masked_batch()
    batch["input_ids"][0, 7] = unk
    batch["decoder_labels"][0, 7] = -100  # as the collator labels [UNK]
    model = RetroMAEForPretraining(tiny_config(decoder_targets="reference")).eval()
    scored = []
    original = model.mlm_loss
    monkeypatch.setattr(model, "mlm_loss", lambda hidden, labels: scored.append(labels) or original(hidden, labels))
    model(**batch)
    decoder_targets = scored[1]
    assert decoder_targets[0, 7] == unk
    real = batch["attention_mask"].bool()
    ends = [(0, 11), (1, 11), (2, 8)]  # [CLS] and [SEP] of each row (the last row is padded by 3)
    for b, last in ends:
        assert decoder_targets[b, 0] == -100 and decoder_targets[b, last] == -100
        assert (decoder_targets[b, 1:last] != -100).all()
    assert (decoder_targets[~real] == -100).all()
    default = RetroMAEForPretraining(tiny_config()).eval()
    assert default.config.decoder_targets == "ordinary" and default.config.decoder_visibility == "token"


def test_reference_options_train_and_agree_across_attention_implementations():
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config(decoder_visibility="reference", decoder_targets="reference")).eval()
    batch = masked_batch()
    word_starts = torch.ones_like(batch["input_ids"])
    word_starts[:, [3, 6, 7]] = 0
    torch.manual_seed(1)
    sdpa = model(**batch, decoder_word_starts=word_starts)
    model.set_attn_implementation("eager")
    torch.manual_seed(1)
    eager = model(**batch, decoder_word_starts=word_starts)
    assert torch.isfinite(sdpa.loss) and torch.allclose(sdpa.loss, eager.loss, atol=1e-5)
    model.train()
    model(**batch, decoder_word_starts=word_starts).loss.backward()
    assert model.decoder.layers[0].attention.self.query.weight.grad.abs().sum() > 0


def test_reference_visibility_without_word_starts_names_the_batch_key():
    model = RetroMAEForPretraining(tiny_config(decoder_visibility="reference"))
    with pytest.raises(ValueError, match="decoder_word_starts"):
        model(**masked_batch())


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"decoder_visibility": "word"}, "decoder_visibility"),
        ({"decoder_targets": "all"}, "decoder_targets"),
        ({"decoder_visibility": "reference", "decoding": "basic", "mask_token_id": 4}, "decoder_visibility"),
    ],
)
def test_reference_option_values_are_checked(kwargs, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field):
        tiny_config(**kwargs)


# ---- the output for a fixed seed is pinned: a faster sampler must draw the very same masks -------------------------


def _previous_greedy_whole_word_fill(sizes: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """`_greedy_whole_word_fill` as it was before absent words were moved behind the real ones (verbatim copy)."""
    taken = sizes.cumsum(-1) <= budget[..., None]
    remaining = budget - (sizes * taken).sum(-1)
    next_word = taken.sum(-1)
    word_index = torch.arange(sizes.shape[-1], device=sizes.device)
    while True:
        fits = (sizes <= remaining[..., None]) & (word_index >= next_word[..., None]) & (remaining > 0)[..., None]
        found = fits.any(-1)
        if not bool(found.any()):
            return taken
        first = fits.long().argmax(-1, keepdim=True)
        taken.scatter_(-1, first, found[..., None] | taken.gather(-1, first))
        remaining = remaining - torch.where(found, sizes.gather(-1, first).squeeze(-1), 0)
        next_word = torch.where(found, first.squeeze(-1) + 1, next_word)


def _previous_reference_visibility_mask(attention_mask, word_starts, mask_ratio):
    """`reference_visibility_mask` as it was before the ragged-batch speed-up (verbatim copy, constants inlined)."""
    from retromae.modeling.visibility import reference_target_positions

    real = attention_mask.bool()
    batch_size, seq_len = real.shape
    device = real.device
    maskable = reference_target_positions(attention_mask)
    follows_maskable = torch.cat([torch.zeros_like(maskable[:, :1]), maskable[:, :-1]], dim=1)
    starts = maskable & ((word_starts != 0) | ~follows_maskable)
    word_of_token = (starts.long().cumsum(-1) - 1).clamp(min=0)
    num_words = int(starts.sum(-1).max().clamp(min=1))
    sizes = torch.zeros(batch_size, num_words, dtype=torch.long, device=device)
    sizes.scatter_add_(1, word_of_token, maskable.long())
    sizes.masked_fill_(sizes == 0, seq_len + 1)
    n_real = real.sum(-1)
    budget = (n_real.double() * mask_ratio).round().long().clamp(min=1, max=512)
    pool_sizes = n_real.clamp(min=1, max=256)
    pool = int(pool_sizes.max())
    order = torch.rand(batch_size, pool, num_words, device=device).argsort(-1)
    taken_in_order = _previous_greedy_whole_word_fill(
        sizes[:, None, :].expand(-1, pool, -1).gather(-1, order), budget[:, None]
    )
    taken = torch.zeros_like(taken_in_order).scatter_(-1, order, taken_in_order)
    hidden_pool = taken.gather(-1, word_of_token[:, None, :].expand(-1, pool, -1)) & maskable[:, None, :]
    pick = torch.randint(0, 2**62, (batch_size, seq_len), device=device) % pool_sizes[:, None]
    hidden = hidden_pool.gather(1, pick[..., None].expand(-1, -1, seq_len))
    visible = real[:, None, :] & ~hidden & real[:, :, None]
    visible.diagonal(dim1=1, dim2=2).fill_(False)
    visible[:, 1:, 0] |= ~real[:, 1:]
    visible[:, 0, 0] |= ~visible[:, 0].any(-1)
    return visible[:, None]


def _word_batch(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention_mask, word_starts) of a batch: `uniform` = copies of one sequence; the others ragged (sequences of
    different lengths and word counts, so the shorter ones have absent word slots)."""
    generator = torch.Generator().manual_seed(7)
    lengths = {
        "uniform": [60] * 6,
        "ragged_words": [60] * 6,  # same length, word densities from 0.2 to 1.0
        "ragged_lengths": [60, 45, 17, 3, 1, 2, 33, 60, 0],
        "left_padded": [50, 12, 37, 4],
        "beyond_pool": [300, 280, 120],  # n > 256: a pool of 256 masks
    }[layout]
    seq_len = max(lengths)
    attention = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    density = torch.linspace(0.2, 1.0, len(lengths))[:, None] if layout == "ragged_words" else 0.7
    starts = (torch.rand(len(lengths), seq_len, generator=generator) < density).long()
    if layout == "uniform":
        starts[:] = starts[0]
    for b, n in enumerate(lengths):
        span = slice(seq_len - n, seq_len) if layout == "left_padded" else slice(0, n)
        attention[b, span] = 1
    return attention, starts


@pytest.mark.parametrize("layout", ["uniform", "ragged_words", "ragged_lengths", "left_padded", "beyond_pool"])
@pytest.mark.parametrize("mask_ratio", [0.15, 0.5, 0.7])
def test_reference_visibility_is_bit_identical_to_the_previous_sampler(layout, mask_ratio):
    """For a fixed seed the sampler returns exactly the masks of the previous algorithm (kept above as a private
    copy): same random draws, same greedy walk, absent word slots skipped without a step of their own."""
    from retromae.modeling.visibility import reference_visibility_mask as current

    attention, starts = _word_batch(layout)
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        expected = _previous_reference_visibility_mask(attention, starts, mask_ratio)
        after_previous = torch.rand(())  # the generator's state after the call must match too
        torch.manual_seed(seed)
        ours = current(attention, starts, mask_ratio)
        assert torch.equal(ours, expected), (layout, mask_ratio, seed)
        assert torch.equal(torch.rand(()), after_previous)
