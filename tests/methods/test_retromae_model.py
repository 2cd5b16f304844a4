"""RetroMAE config, decoder, losses, checkpoint format and remote-code loading."""

from __future__ import annotations

import json
import logging
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.two_stream import two_stream_layer_forward
from retromae.modeling.visibility import (
    _row_subsets_by_sort,
    _row_subsets_by_topk,
    enhanced_visibility_mask,
    random_row_mask,
)
from retromae.modeling.vocab_losses import linear_cross_entropy
from retromae.trainers.methods import get_method
from retromae.trainers.training.pretraining import load_pretraining_model
from transformers import BertConfig, BertForMaskedLM, BertModel

from ..builders import (
    TINY_VOCAB,
    assert_loads_as_remote_code,
    masked_batch,
    tiny_bert_kwargs,
    tiny_pretraining_config,
)

tiny_config = partial(tiny_pretraining_config, RetroMAEConfig)


# ---- config -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"encoder_mask_ratio": 0.0}, "encoder_mask_ratio"),
        ({"encoder_mask_ratio": 1.0}, "encoder_mask_ratio"),
        ({"decoder_mask_ratio": 1.5}, "decoder_mask_ratio"),
        ({"decoding": "fancy"}, "decoding"),
        ({"num_decoder_layers": 2}, "num_decoder_layers"),
        ({"decoding": "basic", "num_decoder_layers": 4}, "num_decoder_layers"),
        ({"query_stream": "x"}, "query_stream"),
        ({"decoder_init": "x"}, "decoder_init"),
        ({"decoder_loss_weight": -1.0}, "decoder_loss_weight"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field):
        tiny_config(**kwargs)


@pytest.mark.parametrize("mask_token_id", [10**6, 30522, -1])
def test_a_mask_token_id_outside_the_vocabulary_is_refused(tiny_bert, mask_token_id):
    """HEAD built the model; basic decoding then failed inside torch's embedding ("index out of range in self")."""
    with pytest.raises((ValueError, StrictDataclassError), match=rf"mask_token_id={mask_token_id} is no id of the "
                                                                 r"vocabulary \(0 to 30521, vocab_size=30522\)"):
        RetroMAEForPretraining.from_encoder_checkpoint(str(tiny_bert), mask_token_id=mask_token_id, decoding="basic")
    assert tiny_config(mask_token_id=TINY_VOCAB - 1).mask_token_id == TINY_VOCAB - 1  # the last id is one


def test_whole_numbers_are_accepted_for_weights_and_ratios_of_every_method():
    """HEAD refused `bow_loss_weight=1` ("expected float, got int"), which --method-options and config.json give."""
    from retromae.modeling.configuration_bow import BoWConfig
    from retromae.modeling.configuration_sentmae import SentMAEConfig

    assert tiny_config(decoder_loss_weight=2).decoder_loss_weight == 2
    assert BoWConfig(**tiny_bert_kwargs(), bow_loss_weight=1).bow_loss_weight == 1
    assert SentMAEConfig(**tiny_bert_kwargs(), contrastive_loss_weight=0).contrastive_loss_weight == 0


def test_from_encoder_checkpoint_names_a_missing_folder_and_a_misspelt_option(tmp_path):
    """HEAD: transformers' "Repo id must be in the form ..." for a missing folder, and a misspelt option kept as a
    stray attribute while the run used the default."""
    for missing, problem in [(tmp_path / "nope", "does not exist"), (tmp_path, "has no config.json")]:
        with pytest.raises(ValueError, match=rf"model folder {missing} {problem}; give a saved model's folder"):
            RetroMAEForPretraining.from_encoder_checkpoint(missing)
    with pytest.raises(ValueError, match="must be a folder or a Hub id, got None"):
        RetroMAEForPretraining.from_encoder_checkpoint(None)
    folder = tmp_path / "bert"
    BertForMaskedLM(BertConfig(**tiny_bert_kwargs())).save_pretrained(folder)
    with pytest.raises(ValueError, match=r"unknown RetroMAEConfig option\(s\) \['encoder_mask_ratoi'\]"):
        RetroMAEForPretraining.from_encoder_checkpoint(folder, encoder_mask_ratoi=0.1)
    assert RetroMAEForPretraining.from_encoder_checkpoint(folder, encoder_mask_ratio=0.2).config.encoder_mask_ratio == 0.2


def test_choice_fields_name_the_field_and_its_choices_also_on_assignment():
    """Choice fields are `Literal`s: @strict names the field and the allowed values, and checks assignments too."""
    with pytest.raises(StrictDataclassError, match=r"'decoding' expected one of \('enhanced', 'basic'\), got fancy"):
        tiny_config(decoding="fancy")
    config = tiny_config()
    with pytest.raises(StrictDataclassError, match=r"'query_stream' expected one of \('position', 'embeddings'\)"):
        config.query_stream = "x"


def test_shared_forward_runs_a_methods_hook_and_weights_its_losses():
    """A method is its `method_losses` + `loss_weights`: the shared forward encodes, scores the encoder MLM loss,
    restores the masked ids for the hook and sums the weighted terms into `PretrainingOutput`."""
    from retromae.modeling.pretraining_base import PretrainingBase

    seen = {}

    class ConstantDecoderLoss(PretrainingBase):
        config_class = RetroMAEConfig
        method_input_names = ("marker",)

        def __init__(self, config):
            super().__init__(config)
            self.post_init()

        def method_losses(self, hidden, sentence_embedding, batch):
            seen.update(original_ids=batch.original_ids, extra=batch.method_inputs)
            return {"decoder_loss": sentence_embedding.sum() * 0 + 2.0}

        def loss_weights(self):
            return {"encoder_mlm_loss": 0.5, "decoder_loss": 3.0}

    torch.manual_seed(0)
    model = ConstantDecoderLoss(tiny_config()).eval()
    batch = masked_batch()
    out = model(**batch, marker=7)
    assert torch.allclose(out.loss, 0.5 * out.encoder_mlm_loss + 3.0 * 2.0)  # weights applied, terms summed
    assert out.decoder_loss.item() == 2.0 and out.bow_loss is None and out.sentence_embedding.shape == (3, 32)
    unmasked = torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["input_ids"])
    assert torch.equal(seen["original_ids"], unmasked) and seen["extra"] == {"marker": 7}
    assert model(batch["input_ids"]).loss is None  # without labels: the sentence embedding only
    # an unknown batch key is an error that names what the model takes, not silently ignored
    with pytest.raises(TypeError, match=r"unexpected inputs \['word_starts'\].*takes \['marker'\]"):
        model(**batch, word_starts=batch["input_ids"])


def test_forward_refuses_inputs_that_would_fail_deep_inside():
    """Bad inputs get one message naming the argument (HEAD: an unpacking error in transformers, an IndexError in the
    MLM loss; one label tensor alone returned loss=None without a word)."""
    model = RetroMAEForPretraining(tiny_config()).eval()
    batch = masked_batch()
    ids = batch["input_ids"]
    with pytest.raises(TypeError, match="input_ids must be a \\(batch_size, seq_len\\) integer tensor, got 1-D"):
        model(input_ids=ids[0])
    with pytest.raises(TypeError, match="got list"):
        model(input_ids=ids.tolist())
    with pytest.raises(ValueError, match=r"attention_mask must have input_ids' shape \(3, \d+\), got \(2, \d+\)"):
        model(input_ids=ids, attention_mask=batch["attention_mask"][:2])
    with pytest.raises(ValueError, match="encoder_labels must have input_ids' shape"):
        model(**{**batch, "encoder_labels": batch["encoder_labels"][:, 1:]})
    with pytest.raises(ValueError, match="pass both encoder_labels and decoder_labels"):
        model(input_ids=ids, attention_mask=batch["attention_mask"], encoder_labels=batch["encoder_labels"])
    assert model(**batch).loss is not None


def test_config_round_trip(tmp_path):
    config = tiny_config(decoding="basic", num_decoder_layers=3, decoder_mask_ratio=0.7, query_stream="embeddings")
    config.save_pretrained(tmp_path)
    loaded = RetroMAEConfig.from_pretrained(tmp_path)
    assert (loaded.decoding, loaded.num_decoder_layers, loaded.decoder_mask_ratio, loaded.query_stream) == (
        "basic", 3, 0.7, "embeddings")
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "retromae"


def test_loading_says_nothing_about_tensor_parallel_sharding(tmp_path):
    """HEAD printed "The following layers were not sharded: <every weight>" on every load of a checkpoint (the
    load-report hold raised transformers' log level, which turns on its check of the empty tensor-parallel plan)."""
    from retromae.modeling.loading import held_load_report
    from retromae.modeling.modeling_retromae import RetroMAEModel

    RetroMAEForPretraining(tiny_config()).save_pretrained(tmp_path)
    BertModel(BertConfig(**tiny_bert_kwargs())).save_pretrained(tmp_path / "bert")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    tp_logger = logging.getLogger("transformers.distributed.tensor_parallel")
    level = tp_logger.level
    tp_logger.addHandler(handler)
    tp_logger.setLevel(logging.WARNING)  # transformers' default verbosity, whatever other tests left
    try:
        RetroMAEForPretraining.from_pretrained(tmp_path)
        RetroMAEModel.from_pretrained(tmp_path)
        with held_load_report(tmp_path):  # as sentence_models holds a folder's load: our class inside, then BERT's
            RetroMAEModel.from_pretrained(tmp_path)
            BertModel.from_pretrained(tmp_path / "bert")
    finally:
        tp_logger.removeHandler(handler)
        tp_logger.setLevel(level)
    assert not [message for message in seen if "not sharded" in message]


# ---- building blocks ----------------------------------------------------------------------------------------------


def test_linear_cross_entropy_matches_plain_cross_entropy_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(50, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (37,))
    fused = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8)  # 5 chunks, last one partial
    fused_grads = torch.autograd.grad(fused * 3.0, (hidden, weight, bias))
    plain = F.cross_entropy(hidden @ weight.T + bias, labels)
    plain_grads = torch.autograd.grad(plain * 3.0, (hidden, weight, bias))
    assert torch.allclose(fused, plain, atol=1e-10)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-10)


def test_linear_cross_entropy_without_rows_is_zero_and_differentiable():
    weight = torch.randn(10, 4, requires_grad=True)
    loss = linear_cross_entropy(torch.zeros(0, 4, requires_grad=True), weight, torch.zeros(10), torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(weight.grad) == 0


def test_visibility_mask_follows_the_paper():
    torch.manual_seed(0)
    lengths = [64, 40, 17]
    attention = torch.zeros(3, 64, dtype=torch.long)
    for row, n in enumerate(lengths):
        attention[row, :n] = 1
    visible = enhanced_visibility_mask(attention, mask_ratio=0.5)[:, 0]  # (B, L, L)
    assert visible.shape == (3, 64, 64) and visible.dtype == torch.bool
    eye = torch.eye(64, dtype=torch.bool)
    for row, n in enumerate(lengths):
        real = visible[row, 1:n, :n]
        assert real[:, 0].all(), "position 0 (the sentence embedding) is visible to every row i > 0"
        assert not (visible[row, :n, :n] & eye[:n, :n]).any(), "no token attends to itself"
        assert not visible[row, :, n:].any(), "padding is never visible"
        share = visible[row, 1:n, :n].float().mean().item()
        assert 0.45 < share < 0.6, share  # about half of the row, plus position 0
        assert visible[row, n:, 0].all() and visible[row, n:, 1:].sum() == 0  # padding rows: position 0 only
    # rows are sampled independently, not copies of one pattern
    assert len({tuple(r.tolist()) for r in visible[0, 1:64]}) > 50


def test_random_row_mask_exact_count():
    candidates = torch.zeros(4, 20, dtype=torch.bool)
    candidates[0, 1:11] = True  # 10 candidates -> 7 picked at ratio 0.7
    candidates[1, 1:3] = True  # 2 -> round(1.4) = 1
    candidates[2, 1:20] = True  # 19 -> 13
    candidates[3, 5] = True  # 1 -> at least 1
    picked = random_row_mask(candidates, 0.7)
    assert picked.sum(-1).tolist() == [7, 1, 13, 1]
    assert not (picked & ~candidates).any()


def test_two_stream_layer_equals_bert_layer_when_streams_match():
    from transformers.models.bert.modeling_bert import BertLayer

    layer = BertLayer(BertConfig(**tiny_bert_kwargs(vocab_size=TINY_VOCAB))).eval()
    x = torch.randn(2, 7, 32)
    visible = torch.ones(2, 1, 7, 7, dtype=torch.bool)
    assert torch.allclose(two_stream_layer_forward(layer, x, x, visible), layer(x), atol=1e-5)


# ---- visibility sampling: exact counts, uniform subsets, fast ------------------------------------------------------

SUBSET_SAMPLERS = [_row_subsets_by_topk, _row_subsets_by_sort]


def holey_real_mask() -> torch.Tensor:
    """Right padding, left padding with a hole, a 1-token sequence and an all-padding sequence."""
    real = torch.zeros(5, 12, dtype=torch.bool)
    real[0, :12] = True
    real[1, :7] = True
    real[2, [2, 3, 5, 8, 9, 10]] = True
    real[3, 0] = True
    return real


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "packed"])
@pytest.mark.parametrize("sampler", SUBSET_SAMPLERS, ids=lambda s: s.__name__)
def test_row_subsets_pick_exactly_n_visible_real_columns(sampler, padded):
    torch.manual_seed(0)
    real = holey_real_mask() if padded else torch.ones(3, 13, dtype=torch.bool)  # odd length: int32 keys sliced
    n_visible = torch.tensor([6, 3, 2, 1, 1]) if padded else torch.full((3,), 5)
    for _ in range(20):
        chosen = sampler(real, n_visible)  # (B, L, L)
        assert not (chosen & ~real[:, None, :]).any(), "only real columns"
        assert not (chosen & ~real[:, :, None]).any(), "padding rows choose nothing"
        counts = chosen.sum(-1)  # (B, L)
        assert torch.equal(counts, torch.where(real, n_visible[:, None], 0)), "exactly n_visible per real row"


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "packed"])
@pytest.mark.parametrize("sampler", SUBSET_SAMPLERS, ids=lambda s: s.__name__)
def test_row_subsets_are_uniform_and_rows_independent(sampler, padded):
    """4 real columns (with holes, or no padding at all), 2 visible: each of the C(4,2) = 6 subsets has probability
    1/6, and the subsets of two rows are independent (36 pairs, 1/36 each). Chi-square thresholds at p = 1e-4 (5 and
    35 dof)."""
    torch.manual_seed(0)
    columns = [0, 2, 3, 5] if padded else [0, 1, 2, 3]
    real = torch.zeros(3000, 6 if padded else 4, dtype=torch.bool)
    real[:, columns] = True
    chosen = sampler(real, torch.full((3000,), 2))[:, columns][:, :, columns]  # (B, 4, 4)
    code = (chosen.long() * torch.tensor([1, 2, 4, 8])).sum(-1)  # (B, 4): bit pattern of each row's subset
    subsets = sorted({1 + 2, 1 + 4, 1 + 8, 2 + 4, 2 + 8, 4 + 8})
    assert set(code.unique().tolist()) == set(subsets)
    single = torch.stack([(code == s).sum() for s in subsets]).double()  # 12,000 draws over 6 subsets
    expected = single.sum() / 6
    assert ((single - expected) ** 2 / expected).sum() < 25.7
    pair = torch.tensor([[((code[:, 1] == a) & (code[:, 2] == b)).sum() for b in subsets] for a in subsets]).double()
    expected = pair.sum() / 36
    assert ((pair - expected) ** 2 / expected).sum() < 66.6


def test_visibility_mask_columns_equally_likely_and_fixups_exact():
    """Over many draws every real column j != i is visible to row i with the same probability (position 0 always,
    for i > 0); the diagonal, padding columns and padding rows follow the paper's fix-ups exactly."""
    torch.manual_seed(0)
    attention = torch.zeros(400, 24, dtype=torch.long)
    attention[:, 3:20] = 1  # 17 real positions, 3 of them left padding: n_visible = 17 - round(8.5) = 9
    attention[:, 0] = 1  # position 0 real, so 18 real: n_visible = 18 - 9 = 9
    visible = enhanced_visibility_mask(attention, 0.5)[:, 0]  # (B, L, L)
    real = attention[0].bool()
    rows = real.nonzero().squeeze(1)[1:]  # real rows i > 0
    assert visible[:, rows, 0].all()
    assert not visible[:, torch.arange(24), torch.arange(24)][:, 1:].any(), "no row sees itself"
    assert not visible[:, :, ~real].any(), "padding columns are never visible"
    assert visible[:, ~real, 0].all() and visible[:, ~real, 1:].sum() == 0, "padding rows see position 0 only"
    # row i keeps column j != i, j > 0 when j is among its 9 of 18 draws: probability 9/18 = 0.5
    columns = real.nonzero().squeeze(1)[1:]
    share = visible[:, rows][:, :, columns].double().mean(0)  # (17, 17): per (row, column)
    off_diagonal = ~torch.eye(17, dtype=torch.bool)
    sd = (0.25 / 400) ** 0.5
    assert ((share[off_diagonal] - 0.5).abs() < 5 * sd).all()
    # and every row's count is 9 - [i drawn] + [0 not drawn], i.e. within 8..10, with mean 9 - 0.5 + 0.5 = 9
    counts = visible[:, rows].sum(-1).double()
    assert counts.min() >= 8 and counts.max() <= 10 and abs(counts.mean() - 9) < 0.05


def test_visibility_mask_one_token_and_empty_sequences():
    attention = torch.zeros(2, 5, dtype=torch.long)
    attention[0, 0] = 1
    visible = enhanced_visibility_mask(attention, 0.5)[:, 0]
    assert visible[:, :, 0].all() and visible[:, :, 1:].sum() == 0


def test_visibility_sampling_never_sorts_the_full_key_tensor():
    """Sorting all B x L x L keys to find each row's k-th one is slow; the CPU sampler selects with a partial top-k
    instead. Checked on the ops that run (their speed is benchmarks/visibility_sampling.py's job)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class SortRecorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sorted_shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.sort, torch.ops.aten.argsort):
                self.sorted_shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    attention = torch.ones(4, 64, dtype=torch.long)
    attention[-1, 40:] = 0
    with SortRecorder() as recorder:
        visible = enhanced_visibility_mask(attention, 0.5)
    assert visible.shape == (4, 1, 64, 64)
    assert not [shape for shape in recorder.sorted_shapes if shape[-2:] == (64, 64)], recorder.sorted_shapes


# ---- the model ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decoding", ["enhanced", "basic"])
def test_forward_returns_each_loss_and_trains(decoding):
    torch.manual_seed(0)
    layers = 2 if decoding == "basic" else 1
    model = RetroMAEForPretraining(tiny_config(decoding=decoding, num_decoder_layers=layers, mask_token_id=4))
    batch = masked_batch()
    out = model(**batch)
    assert out.sentence_embedding.shape == (3, 32)
    for loss in (out.loss, out.encoder_mlm_loss, out.decoder_loss):
        assert loss.ndim == 0 and torch.isfinite(loss)
    assert torch.allclose(out.loss, out.encoder_mlm_loss + out.decoder_loss)
    out.loss.backward()
    for name in ("decoder.layers.0.attention.self.query.weight", "bert.encoder.layer.0.attention.self.key.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    no_labels = model(batch["input_ids"], batch["attention_mask"])
    assert no_labels.loss is None and no_labels.sentence_embedding.shape == (3, 32)


def test_encoder_loss_scores_masked_positions_only():
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config()).eval()
    batch = masked_batch()
    out = model(**batch)
    hidden = model.bert(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    full_logits = model.cls(hidden)  # what BertForMaskedLM computes: logits at every position
    expected = F.cross_entropy(full_logits.view(-1, TINY_VOCAB), batch["encoder_labels"].view(-1), ignore_index=-100)
    assert torch.allclose(out.encoder_mlm_loss, expected, atol=1e-5)


def test_enhanced_decoder_matches_a_direct_computation_of_eq_4_to_6():
    """Rebuild the decoder from the paper's equations with plain torch ops and a fixed visibility matrix."""
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config()).eval()
    batch = masked_batch(batch_size=2, pad=0)
    ids = torch.where(batch["encoder_labels"] != -100, batch["encoder_labels"], batch["input_ids"])
    h = model.bert(batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state[:, 0]
    torch.manual_seed(1)
    ours = model.decoder(h, ids, batch["attention_mask"], batch["decoder_labels"], model.decoder_embeddings())[0]
    torch.manual_seed(1)
    visible = enhanced_visibility_mask(batch["attention_mask"], 0.5)[:, 0]  # same draw
    emb = model.bert.embeddings
    L = ids.shape[1]
    H1 = h[:, None] + emb.position_embeddings.weight[:L]  # h + p_i
    H2 = torch.cat([h[:, None], emb(input_ids=ids)[:, 1:]], 1)
    layer = model.decoder.layers[0]
    sa = layer.attention.self
    heads, d = sa.num_attention_heads, sa.attention_head_size
    q = sa.query(H1).view(2, L, heads, d).transpose(1, 2)
    k = sa.key(H2).view(2, L, heads, d).transpose(1, 2)
    v = sa.value(H2).view(2, L, heads, d).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / d**0.5 + torch.where(visible[:, None], 0.0, float("-inf"))
    A = (scores.softmax(-1) @ v).transpose(1, 2).reshape(2, L, heads * d)
    expected = layer.feed_forward_chunk(layer.attention.output(A, H1))
    assert torch.allclose(ours, expected, atol=1e-5)


def test_eager_and_sdpa_give_the_same_losses():
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config()).eval()
    batch = masked_batch()
    torch.manual_seed(3)
    sdpa = model(**batch)
    model.set_attn_implementation("eager")
    torch.manual_seed(3)
    eager = model(**batch)
    assert torch.allclose(sdpa.loss, eager.loss, atol=1e-5)


def test_decoder_attention_goes_through_the_attention_interface(monkeypatch):
    """`config._attn_implementation` picks the decoder's attention too: with sdpa the registered sdpa function runs in
    the 2 encoder layers and the decoder (3 calls); with eager the decoder uses transformers' eager function."""
    import retromae.modeling.two_stream as layers
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = RetroMAEForPretraining(tiny_config()).eval()
    calls = []
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", lambda *a, **kw: calls.append("sdpa") or sdpa(*a, **kw))
    model(**masked_batch())
    assert calls == ["sdpa"] * 3
    eager = layers.eager_attention_forward
    monkeypatch.setattr(layers, "eager_attention_forward", lambda *a, **kw: calls.append("eager") or eager(*a, **kw))
    model.set_attn_implementation("eager")
    model(**masked_batch())
    assert calls == ["sdpa"] * 3 + ["eager"]


def test_gradient_checkpointing_recomputes_the_decoder_with_equal_gradients():
    """`gradient_checkpointing_enable()` checkpoints the two-stream decoder layer: its forward runs again in the
    backward pass, and the gradients (dropout on) equal those of the plain run."""
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config()).train()
    batch = masked_batch()
    query_calls = []
    model.decoder.layers[0].attention.self.query.register_forward_hook(lambda *_: query_calls.append(1))

    def gradients() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(5)
        loss = model(**batch).loss
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain = gradients()
    assert len(query_calls) == 1
    model.gradient_checkpointing_enable()
    checkpointed_loss, checkpointed = gradients()
    assert len(query_calls) == 3, "the decoder layer is recomputed in the backward pass"
    assert torch.equal(plain_loss, checkpointed_loss) and plain.keys() == checkpointed.keys()
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name


def test_embeddings_query_stream_runs():
    model = RetroMAEForPretraining(tiny_config(query_stream="embeddings"))
    assert torch.isfinite(model(**masked_batch()).decoder_loss)


def test_plain_bert_checkpoint_loads_with_only_the_decoder_new(tmp_path):
    bert = BertForMaskedLM(BertConfig(**tiny_bert_kwargs(vocab_size=TINY_VOCAB, max_position_embeddings=64)))
    bert.save_pretrained(tmp_path / "mlm")
    model, info = RetroMAEForPretraining.from_pretrained(
        tmp_path / "mlm", config=tiny_config(), output_loading_info=True
    )
    assert info["missing_keys"] and all(k.startswith("decoder.") for k in info["missing_keys"])
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    assert torch.equal(model.cls.predictions.transform.dense.weight, bert.cls.predictions.transform.dense.weight)
    copied = RetroMAEForPretraining.from_encoder_checkpoint(tmp_path / "mlm", decoder_init="copy_last_layer")
    assert torch.equal(copied.decoder.layers[0].intermediate.dense.weight, bert.bert.encoder.layer[-1].intermediate.dense.weight)
    BertModel(bert.config, add_pooling_layer=False).save_pretrained(tmp_path / "base")
    from_base = RetroMAEForPretraining.from_encoder_checkpoint(tmp_path / "base")
    assert isinstance(from_base, RetroMAEForPretraining)


def test_copy_last_layer_fills_only_the_decoder_layers_a_checkpoint_lacks(tmp_path, caplog):
    """Continuing a checkpoint with more decoder layers: HEAD copied the encoder's last layer over the trained
    decoder layer too, silently. The new layer is named in a warning (an info line would not show in the CLI)."""
    bert = BertForMaskedLM(BertConfig(**tiny_bert_kwargs(vocab_size=TINY_VOCAB, max_position_embeddings=64)))
    bert.save_pretrained(tmp_path / "mlm")
    stage1 = RetroMAEForPretraining.from_encoder_checkpoint(tmp_path / "mlm", decoding="basic")
    torch.nn.init.normal_(stage1.decoder.layers[0].intermediate.dense.weight)  # as training leaves it
    stage1.save_pretrained(tmp_path / "stage1")
    with caplog.at_level(logging.WARNING):
        more = RetroMAEForPretraining.from_encoder_checkpoint(tmp_path / "stage1", decoding="basic",
                                                              num_decoder_layers=2, decoder_init="copy_last_layer")
    assert "the checkpoint holds part of the decoder; these parts start as copies of the encoder's last layer: " \
           "['decoder.layers.1']" in caplog.text
    trained, last = stage1.decoder.layers[0].state_dict(), stage1.bert.encoder.layer[-1].state_dict()
    assert all(torch.equal(value, trained[k]) for k, value in more.decoder.layers[0].state_dict().items())
    assert all(torch.equal(value, last[k]) for k, value in more.decoder.layers[1].state_dict().items())



def test_continuing_with_fewer_decoder_layers_or_a_decoder_init_says_what_happens(tmp_path, caplog):
    """`retromae pretrain --model CHECKPOINT`: HEAD dropped trained decoder layers, and ignored --decoder-init on a
    trained decoder, without a word."""
    bert = BertForMaskedLM(BertConfig(**tiny_bert_kwargs(vocab_size=TINY_VOCAB, max_position_embeddings=64)))
    bert.save_pretrained(tmp_path / "mlm")
    RetroMAEForPretraining.from_encoder_checkpoint(tmp_path / "mlm", decoding="basic", num_decoder_layers=2
                                                   ).save_pretrained(tmp_path / "two")
    method = get_method("retromae")
    with caplog.at_level(logging.WARNING):
        load_pretraining_model(str(tmp_path / "two"), method, {"num_decoder_layers": 1})
    assert "holds trained decoder parts that this run's decoder lacks (fewer --num-decoder-layers?); they are " \
           "dropped: ['decoder.layers.1']" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_pretraining_model(str(tmp_path / "two"), method, {"decoder_init": "copy_last_layer"})
    assert "--decoder-init copy_last_layer starts new decoder layers only" in caplog.text

def test_encoder_checkpoint_that_is_not_bert_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **tiny_bert_kwargs(vocab_size=TINY_VOCAB)}))
    from safetensors.torch import save_file

    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="not a BERT checkpoint"):
        RetroMAEForPretraining.from_encoder_checkpoint(tmp_path)


def test_checkpoint_loads_as_remote_code_in_a_fresh_process(run_without_retromae, tmp_path):
    torch.manual_seed(0)
    model = RetroMAEForPretraining(tiny_config()).eval()
    checkpoint, _, _ = assert_loads_as_remote_code(run_without_retromae, model, tmp_path, "retromae",
                                                   ("RetroMAEConfig", "RetroMAEModel", "RetroMAEForPretraining"))
    assert {"modeling_retromae.py", "configuration_retromae.py", "vocab_losses.py", "visibility.py", "two_stream.py",
            "pretraining_base.py", "loading.py"} <= {
        p.name for p in checkpoint.iterdir()}
    assert not list(checkpoint.glob("*.bin")), "safetensors only"
