"""Long inputs: nothing but the bool visibility matrix of the RetroMAE/DupMAE decoder grows as B x L x L.

The samplers draw and select their random keys in chunks of query rows (`SAMPLER_CHUNK_ELEMENTS`), the decoder attends
over chunks of query rows (`ATTENTION_CHUNK_ELEMENTS`, recomputed in the backward pass); with both made small here,
an enhanced-decoding training step must create no tensor of at least B * L * L / 4 elements but bool ones. The
chunked samplers draw exactly the masks of the unchunked ones (and of the samplers as they were before chunking),
and chunked attention gives the unchunked outputs and gradients. Also: benchmarks/long_inputs_memory.py runs in its
tiny mode (in this process; the subprocess run is an `experiment`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from retromae.modeling import two_stream
from retromae.modeling import visibility as sampling
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.two_stream import TwoStreamBertLayer
from retromae.modeling.visibility import enhanced_visibility_mask, random_row_subsets, reference_visibility_mask
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ..builders import benchmark_script

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 100


# ---- the samplers as they were before chunking (one draw, one selection over all rows) -----------------------------


def _old_keys(leading_shape, num_keys):
    raw = torch.empty(*leading_shape, (num_keys + 1) // 2, dtype=torch.int64).random_()
    return raw.view(torch.int32)[..., :num_keys].bitwise_and_(0x3FFFFFFF)


def old_topk_sampler(real: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    batch_size, seq_len = real.shape
    chosen = torch.zeros(batch_size, seq_len, seq_len, dtype=torch.bool)
    if bool(real.all()):
        keys = _old_keys((batch_size, seq_len), seq_len)
        picked = keys.topk(int(n_visible[0]), dim=-1, largest=False, sorted=False).indices
        return chosen.scatter_(-1, picked, torch.ones((), dtype=torch.bool).expand(picked.shape))
    for b, count in enumerate(n_visible.tolist()):
        columns = real[b].nonzero().squeeze(1)
        n = columns.numel()
        if n == 0:
            continue
        picked = _old_keys((n,), n).topk(count, dim=-1, largest=False, sorted=False).indices
        if bool(real[b, :n].all()):
            chosen[b, :n, :n].scatter_(-1, picked, torch.ones((), dtype=torch.bool).expand(picked.shape))
        else:
            chosen[b, columns[:, None], columns[picked]] = True
    return chosen


def old_sort_sampler(real: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    batch_size, seq_len = real.shape
    keys = _old_keys((batch_size, seq_len), seq_len)
    keys.bitwise_or_(torch.where(real, 0, 0x40000000).to(torch.int32)[:, None, :])
    cutoff = keys.sort(-1).values.gather(-1, (n_visible - 1)[:, None, None].expand(-1, seq_len, 1))
    return (keys <= cutoff) & real[:, :, None]


def layouts(seq_len: int) -> dict[str, torch.Tensor]:
    """attention masks: packed, right padding, and real tokens not first (scattered columns)."""
    packed = torch.ones(3, seq_len, dtype=torch.long)
    lengths = torch.tensor([seq_len, seq_len // 2, 1])
    right = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    scattered = right.flip(-1).clone()
    scattered[0, ::3] = 0
    return {"packed": packed, "right": right, "scattered": scattered}


@pytest.mark.parametrize("seq_len", [37, 64])  # odd: the int32 halves of the last int64 draw are split
@pytest.mark.parametrize("layout", ["packed", "right", "scattered"])
def test_chunked_samplers_draw_the_masks_of_the_unchunked_ones(monkeypatch, seq_len, layout):
    real = layouts(seq_len)[layout].bool()
    n_real = real.sum(-1)
    n_visible = (n_real - (n_real * 0.5).round()).clamp(min=1).long()
    samplers = {
        "topk": (sampling._row_subsets_by_topk, old_topk_sampler),
        "sort": (sampling._row_subsets_by_sort, old_sort_sampler),
    }
    for name, (sampler, old) in samplers.items():
        results = []
        for chunk_elements in (1, 3 * seq_len, 1 << 30):  # one row per chunk, a few rows, everything at once
            monkeypatch.setattr(sampling, "SAMPLER_CHUNK_ELEMENTS", chunk_elements)
            torch.manual_seed(7)
            results.append(sampler(real, n_visible))
        torch.manual_seed(7)
        expected = old(real, n_visible)
        for result in results:
            assert torch.equal(result, expected), (name, layout)
        counts = results[0].sum(-1)  # (B, L): n_visible per real row, none for padding rows
        assert torch.equal(counts, torch.where(real, n_visible[:, None], 0)), name


def test_masks_are_identical_to_the_unchunked_sampling(monkeypatch):
    attention_mask = layouts(50)["right"]
    word_starts = (torch.rand(attention_mask.shape, generator=torch.Generator().manual_seed(1)) < 0.75).long()
    masks = []
    for chunk_elements in (1, 1 << 30):
        monkeypatch.setattr(sampling, "SAMPLER_CHUNK_ELEMENTS", chunk_elements)
        torch.manual_seed(3)
        masks.append((enhanced_visibility_mask(attention_mask, 0.5), reference_visibility_mask(attention_mask, word_starts, 0.5)))
    assert all(torch.equal(a, b) for a, b in zip(*masks, strict=True))
    assert masks[0][0].dtype == masks[0][1].dtype == torch.bool
    torch.manual_seed(3)
    assert torch.equal(random_row_subsets(attention_mask.bool(), torch.tensor([25, 12, 1])).sum(-1)[1, :25],
                       torch.full((25,), 12))


# ---- what an enhanced-decoding step allocates ------------------------------------------------------------------------


class LargeAllocations(TorchDispatchMode):
    """Every new tensor (storage not an input's: no views, no in-place results) of at least `min_elements` elements
    an op creates: (op, shape, dtype) -> count."""

    def __init__(self, min_elements: int):
        super().__init__()
        self.min_elements = min_elements
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        large = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.numel() >= self.min_elements]
        if large:
            inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for tensor in large:
                if tensor.untyped_storage().data_ptr() not in inputs:
                    self.seen[(func.overloadpacket.__name__, tuple(tensor.shape), tensor.dtype)] += 1
        return out


def tiny_retromae(attn_implementation: str, max_length: int = 192, **fields) -> RetroMAEForPretraining:
    torch.manual_seed(0)
    config = RetroMAEConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
        max_position_embeddings=max_length, attention_probs_dropout_prob=0.0, attn_implementation=attn_implementation,
        mask_token_id=4, loss_chunk_size=64, **fields,  # vocabulary logits of 64 rows: far below L * L
    )
    return RetroMAEForPretraining(config).train()


def long_batch(batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    original = torch.randint(5, VOCAB, (batch_size, seq_len), generator=generator)
    masked = torch.rand(batch_size, seq_len, generator=generator) < 0.3
    masked[:, 0] = masked[:, -1] = False
    labels = original.clone()
    labels[:, 0] = labels[:, -1] = -100
    return {
        "input_ids": original.masked_fill(masked, 4), "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
        "encoder_labels": original.masked_fill(~masked, -100), "decoder_labels": labels,
        "decoder_word_starts": (torch.rand(batch_size, seq_len, generator=generator) < 0.75).long(),
    }


def decoder_step(model: RetroMAEForPretraining, batch: dict[str, torch.Tensor]) -> None:
    """The enhanced decoder's L x L path alone, forward and backward: the visibility sampler, then its layer on
    random query and content streams."""
    visible = enhanced_visibility_mask(batch["attention_mask"], model.config.decoder_mask_ratio)  # (B, 1, L, L)
    generator = torch.Generator().manual_seed(0)
    shape = (*batch["input_ids"].shape, model.config.hidden_size)
    query_stream = torch.randn(shape, generator=generator, requires_grad=True)
    content_stream = torch.randn(shape, generator=generator, requires_grad=True)
    model.decoder.layers[0](query_stream, content_stream, visible).square().mean().backward()


@pytest.mark.parametrize(("attn_implementation", "visibility", "batch_size", "seq_len"), [
    ("sdpa", "token", 2, 192),
    ("eager", "token", 2, 192),
    # the official pool of min(n, 256) word masks, (B, 256, words) int64: below B * L * L / 4 from L of about 800 on
    ("sdpa", "reference", 1, 1024),
])
def test_enhanced_decoding_step_creates_no_large_tensor_but_bool(monkeypatch, attn_implementation, visibility,
                                                                 batch_size, seq_len):
    """sdpa: a whole training step (the encoder, without padding, has nothing of size L * L). eager: the decoder path
    (the encoder's eager attention has its own (B, heads, L, L) scores, as any BERT's)."""
    monkeypatch.setattr(sampling, "SAMPLER_CHUNK_ELEMENTS", 16 * seq_len)
    monkeypatch.setattr(two_stream, "ATTENTION_CHUNK_ELEMENTS", batch_size * 16 * seq_len)  # 16 query rows
    model = tiny_retromae(attn_implementation, seq_len, decoder_visibility=visibility)
    batch = long_batch(batch_size, seq_len)
    with LargeAllocations(batch_size * seq_len * seq_len // 4) as census:
        if attn_implementation == "sdpa":
            model(**batch).loss.backward()
        else:
            decoder_step(model, batch)
    assert any(dtype == torch.bool for (_, _, dtype) in census.seen), "the visibility matrix is bool"
    not_bool = {key: count for key, count in census.seen.items() if key[2] != torch.bool}
    assert not_bool == {}, f"tensors of at least B*L*L/4 elements that are not bool: {not_bool}"


def test_unchunked_step_is_what_the_census_catches(monkeypatch):
    """The census above sees the float mask sdpa makes of the bool one, and the samplers' keys, when not chunked."""
    batch_size, seq_len = 2, 192
    monkeypatch.setattr(sampling, "SAMPLER_CHUNK_ELEMENTS", 1 << 30)
    monkeypatch.setattr(two_stream, "ATTENTION_CHUNK_ELEMENTS", 1 << 30)
    for attn_implementation in ("sdpa", "eager"):
        model = tiny_retromae(attn_implementation)
        with LargeAllocations(batch_size * seq_len * seq_len // 4) as census:
            decoder_step(model, long_batch(batch_size, seq_len))
        dtypes = {dtype for (_, _, dtype) in census.seen}
        assert torch.float32 in dtypes and torch.int64 in dtypes, attn_implementation


@pytest.mark.parametrize(("attn_implementation", "gradient_checkpointing"), [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_chunked_attention_gives_the_unchunked_outputs_and_gradients(monkeypatch, attn_implementation,
                                                                      gradient_checkpointing):
    batch_size, seq_len = 2, 96
    model = tiny_retromae(attn_implementation)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    batch = long_batch(batch_size, seq_len)
    results = []
    for chunk_elements in (1 << 30, batch_size * 40 * seq_len):  # whole, then 40-row chunks (the last one shorter)
        monkeypatch.setattr(two_stream, "ATTENTION_CHUNK_ELEMENTS", chunk_elements)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(5)
        output = model(**batch)
        output.loss.backward()
        results.append((output.decoder_loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_whole, grads_whole), (loss_chunked, grads_chunked) = results
    torch.testing.assert_close(loss_chunked, loss_whole, rtol=1e-6, atol=0)
    for name, grad in grads_whole.items():
        torch.testing.assert_close(grads_chunked[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_attention_without_gradients_and_with_a_shared_row_mask(monkeypatch):
    layer = tiny_retromae("sdpa").decoder.layers[0].eval()
    assert isinstance(layer, TwoStreamBertLayer)
    generator = torch.Generator().manual_seed(0)
    query, content = torch.randn(2, 70, 32, generator=generator), torch.randn(2, 70, 32, generator=generator)
    visible = torch.rand(2, 1, 70, 70, generator=generator) < 0.5
    visible[..., 0] = True
    shared = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    with torch.no_grad():
        whole = layer(query, content, visible), layer(query, content, shared)
        monkeypatch.setattr(two_stream, "ATTENTION_CHUNK_ELEMENTS", 2 * 70 * 16)
        chunked = layer(query, content, visible), layer(query, content, shared)
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-6, atol=1e-7)
    assert torch.equal(chunked[1], whole[1])  # a (B, 1, 1, Lk) mask is never chunked


# ---- the benchmark script ----------------------------------------------------------------------------------------------


def test_benchmark_runs_in_tiny_mode(tmp_path):
    script = benchmark_script("long_inputs_memory")
    output = tmp_path / "long_inputs_memory.json"
    script.main(["--tiny", "--in-process", "--variants", "hf_mlm,retromae,seed", "--lengths", "48",
                 "--label", "smoke", "--output", str(output)])
    report = json.loads(output.read_text())
    rows = report["runs"]["smoke"]["rows"]
    assert [(row["variant"], row["status"]) for row in rows] == [("hf_mlm", "ok"), ("retromae", "ok"), ("seed", "ok")]
    assert all(row["growth_bytes"] >= 0 and "census" in row for row in rows)  # L=48 is the largest
    assert "| RetroMAE enhanced, token visibility |" in output.with_suffix(".md").read_text()
    names = [row["name"] for row in report["analytic"]["rows"]]
    assert any("visibility (B, 1, L, L) bool" in name for name in names)


@pytest.mark.experiment
def test_benchmark_script_runs_as_a_command(tmp_path):
    output = tmp_path / "long_inputs_memory.json"
    done = subprocess.run(
        [sys.executable, "benchmarks/long_inputs_memory.py", "--tiny", "--variants", "hf_mlm,retromae", "--output",
         str(output)], cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(output.read_text())["runs"]["current"]["rows"]
    assert {row["status"] for row in rows} == {"ok"} and len(rows) == 4  # 2 variants x L = 64, 128
