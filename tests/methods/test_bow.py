"""BoW prediction: targets, loss, schedule under gradient accumulation, checkpoint format, remote code."""

from __future__ import annotations

import logging
import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from retromae.modeling.configuration_bow import BoWConfig
from retromae.modeling.modeling_bow import (
    BoWForPretraining,
    bag_of_words_loss,
    bag_of_words_targets,
    bow_weight_factor,
)
from retromae.trainers.training.schedules import BoWScheduleCallback, schedule_callbacks
from transformers import BertModel

from ..builders import (
    assert_loads_as_remote_code,
    masked_batch,
    tiny_bert_kwargs,
    tiny_pretraining_config,
)

tiny_config = partial(tiny_pretraining_config, BoWConfig)


# ---- config -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"bow_weight_schedule": "linear"}, "bow_weight_schedule"),
        ({"bow_loss_weight": -1.0}, "bow_loss_weight"),
        ({"bow_weight_final": -0.1}, "bow_weight_final"),
        ({"encoder_mask_ratio": 1.0}, "encoder_mask_ratio"),
    ],
)
def test_invalid_config_names_the_field(kwargs, field):
    with pytest.raises((ValueError, StrictDataclassError), match=field):
        tiny_config(**kwargs)


# ---- targets and loss ---------------------------------------------------------------------------------------------


def test_targets_are_uniform_over_unique_labelled_tokens():
    labels = torch.tensor([[-100, 5, 7, 5, -100, -100], [-100, -100, -100, -100, -100, -100]])
    targets = bag_of_words_targets(labels, vocab_size=10)
    expected = torch.zeros(2, 10)
    expected[0, [5, 7]] = 0.5  # {5, 7}: the repeated 5 counts once -> 1/|S| = 1/2 each
    assert torch.equal(targets, expected)  # a row without labels is all zeros


def test_bow_loss_by_hand():
    # softmax(log([1, 2, 3, 4])) = [0.1, 0.2, 0.3, 0.4]
    logits = torch.log(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).expand(3, 4)
    targets = torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # row 0: -(ln 0.2 + ln 0.4) / 2 = 1.262864; row 1: no targets, ignored; row 2: -ln 0.1 = 2.302585
    expected = (-(math.log(0.2) + math.log(0.4)) / 2 - math.log(0.1)) / 2  # 1.782725
    assert bag_of_words_loss(logits, targets).item() == pytest.approx(expected, abs=1e-6)
    empty = bag_of_words_loss(logits.clone().requires_grad_(), torch.zeros(3, 4))
    assert empty.item() == 0.0 and empty.requires_grad


def test_special_tokens_excluded_for_a_roberta_id_layout():
    """RoBERTa ids: <s>=0, <pad>=1, </s>=2; ordinary tokens can have tiny ids ("."=4, "the"=5). The bag is taken from
    the collator's decoder_labels, so specials drop out by the tokenizer's ids and no `id <= 998` rule removes
    frequent BPE tokens (the reference's BERT-only threshold would drop 4 and 5 here)."""
    vocab = 400
    config = BoWConfig(**tiny_bert_kwargs(vocab_size=vocab, max_position_embeddings=64, pad_token_id=1))
    model = BoWForPretraining(config).eval()
    input_ids = torch.tensor([[0, 5, 4, 321, 5, 2, 1, 1]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0]])
    special = torch.tensor([[1, 0, 0, 0, 0, 1, 1, 1]]).bool()  # tokenizer special_tokens_mask (+ padding)
    decoder_labels = input_ids.masked_fill(special | (attention_mask == 0), -100)
    targets = bag_of_words_targets(decoder_labels, vocab)
    assert targets[0].nonzero().flatten().tolist() == [4, 5, 321]
    assert torch.allclose(targets[0, [4, 5, 321]], torch.full((3,), 1 / 3))
    encoder_labels = torch.full_like(input_ids, -100)
    encoder_labels[0, 3] = 321
    masked = input_ids.clone()
    masked[0, 3] = 3  # any id standing for <mask>
    out = model(masked, attention_mask, encoder_labels, decoder_labels)
    with torch.no_grad():
        h = model.bert(masked, attention_mask=attention_mask).last_hidden_state[:, 0]  # [CLS] of the MASKED input
        log_p = F.log_softmax(model.cls(h), dim=-1)[0]  # full MLM head: transform + tied decoder + bias
    assert out.bow_loss.item() == pytest.approx(-(log_p[4] + log_p[5] + log_p[321]).item() / 3, abs=1e-5)


# ---- model --------------------------------------------------------------------------------------------------------


def test_forward_backward_and_loss_composition():
    torch.manual_seed(0)
    model = BoWForPretraining(tiny_config(bow_loss_weight=0.5, bow_weight_schedule="cosine", bow_weight_final=0.1))
    batch = masked_batch()
    out = model(**batch)
    assert out.sentence_embedding.shape == (3, 32)
    assert out.decoder_loss is None and out.bow_loss.ndim == 0
    assert torch.allclose(out.loss, out.encoder_mlm_loss + 0.5 * 1.0 * out.bow_loss)  # factor 1 before any step
    out.loss.backward()
    assert model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.cls.predictions.transform.dense.weight.grad.abs().sum() > 0
    assert model.set_training_progress(0.5) == pytest.approx(0.55)  # 0.1 + 0.9 * (1 + cos(pi/2)) / 2
    out = model(**batch)
    assert torch.allclose(out.loss, out.encoder_mlm_loss + 0.5 * 0.55 * out.bow_loss)
    assert model(input_ids=batch["input_ids"]).loss is None


def test_bow_only_adds_no_parameters():
    model = BoWForPretraining(tiny_config())
    assert {k.split(".")[0] for k in model.state_dict()} == {"bert", "cls"}
    assert "bow_schedule_factor" not in model.state_dict()  # non-persistent: not in checkpoints
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


def test_weight_factor_schedules():
    assert bow_weight_factor(0.7, "constant", 0.1) == 1.0
    assert bow_weight_factor(0.0, "cosine", 0.1) == 1.0
    assert bow_weight_factor(1.0, "cosine", 0.1) == pytest.approx(0.1)
    assert bow_weight_factor(0.25, "cosine", 0.1) == pytest.approx(0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2)
    assert bow_weight_factor(3.0, "cosine", 0.1) == pytest.approx(0.1)  # clamped beyond the end


def test_schedule_follows_optimizer_steps_under_gradient_accumulation(tmp_path):
    """With gradient_accumulation_steps=4 the factor seen by forward is cosine(global_step / max_steps) and constant
    within each accumulation window (the reference keys it on micro-steps: 4x too fast)."""
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = BoWForPretraining(tiny_config(bow_weight_schedule="cosine", bow_weight_final=0.1))
    seen: list[float] = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.bow_schedule_factor.item()))
    batch = masked_batch(batch_size=12, seq_len=8)
    dataset = [{k: v[i] for k, v in batch.items()} for i in range(12)]
    max_steps, accumulation = 3, 4
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=1,
        gradient_accumulation_steps=accumulation, learning_rate=1e-4, use_cpu=True, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=schedule_callbacks(model))
    assert any(isinstance(c, BoWScheduleCallback) for c in trainer.callback_handler.callbacks)
    trainer.train()
    expected = [bow_weight_factor(step / max_steps, "cosine", 0.1) for step in range(max_steps) for _ in range(accumulation)]
    assert seen == pytest.approx(expected, abs=1e-6)  # [1.0]*4 + [0.775]*4 + [0.325]*4


def test_schedule_callbacks_only_for_models_with_a_schedule():
    assert schedule_callbacks(BertModel(tiny_config(), add_pooling_layer=False)) == []


# ---- checkpoints --------------------------------------------------------------------------------------------------


def test_from_encoder_checkpoint_minilm_reports_only_the_mlm_head_new(minilm_dir, caplog):
    caplog.set_level(logging.INFO, logger="retromae.modeling.pretraining_base")
    model = BoWForPretraining.from_encoder_checkpoint(minilm_dir, bow_weight_schedule="cosine")
    assert model.config.bow_weight_schedule == "cosine" and model.config.hidden_size == 384
    new = [r.args[1] for r in caplog.records if r.getMessage().startswith("Initialised from scratch")]
    assert new == [["cls.predictions"]]  # MiniLM is a bare BertModel: only the MLM head (transform, bias) is new
    reference = BertModel.from_pretrained(minilm_dir, add_pooling_layer=False)
    assert torch.equal(model.bert.encoder.layer[-1].output.dense.weight, reference.encoder.layer[-1].output.dense.weight)
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()


@pytest.mark.parametrize("build", ["from_encoder_checkpoint", "from_encoder_config"])
def test_mask_token_id_of_the_readme_example_is_ignored_with_its_reason(build, minilm_dir, caplog):
    """The README's RetroMAE call passes `mask_token_id` (RetroMAE's basic decoding reads it); BoWConfig has no such
    field, as BoW's model reads no mask token (the collator masks the encoder input), so it is dropped with a
    warning that says why, not refused."""
    caplog.set_level(logging.WARNING, logger="retromae.modeling.pretraining_base")
    model = getattr(BoWForPretraining, build)(minilm_dir, mask_token_id=103, bow_weight_schedule="cosine")
    assert model.config.bow_weight_schedule == "cosine" and "mask_token_id" not in model.config.to_dict()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [m for m in warnings if m.startswith("mask_token_id=103 ignored: BoWConfig has no mask_token_id")]
    with pytest.raises(ValueError, match=r"unknown BoWConfig option\(s\) \['mask_token'\]"):  # a typo still fails
        getattr(BoWForPretraining, build)(minilm_dir, mask_token=103)


@pytest.mark.long
def test_checkpoint_loads_as_remote_code_in_a_fresh_process(run_without_retromae, tmp_path):
    torch.manual_seed(0)
    model = BoWForPretraining(tiny_config(bow_weight_schedule="cosine")).eval()
    checkpoint, saved, got = assert_loads_as_remote_code(run_without_retromae, model, tmp_path, "bow",
                                                         ("BoWConfig", "BoWModel", "BoWForPretraining"))
    assert saved["model_type"] == "bow_prediction"
    assert {"modeling_bow.py", "configuration_bow.py", "pretraining_base.py", "vocab_losses.py", "loading.py"} <= {
        p.name for p in checkpoint.iterdir()}
    assert got["config"]["bow_weight_schedule"] == "cosine" and got["tied"]


def test_schedule_callback_unwraps_distributed_wrappers():
    from types import SimpleNamespace

    model = BoWForPretraining(tiny_config(bow_weight_schedule="cosine", bow_weight_final=0.0))
    wrapped = SimpleNamespace(module=SimpleNamespace(_orig_mod=model))  # DDP(torch.compile(model))
    BoWScheduleCallback().on_step_begin(None, SimpleNamespace(global_step=1, max_steps=2), None, model=wrapped)
    assert model.bow_schedule_factor.item() == pytest.approx(0.5)  # (1 + cos(pi / 2)) / 2
