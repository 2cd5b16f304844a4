"""Top-1 accuracy of the cross-entropy terms: measured only while `measure_accuracy` is set (by the Trainer, on the
steps it logs), equal to a direct computation, and without effect on the losses or the gradients."""

import json

import pytest
import torch
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.modeling_bow import BoWForPretraining
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.vocab_losses import linear_argmax_accuracy
from retromae.trainers.cli import main

from ..builders import masked_batch, pretrain_args, tiny_pretraining_config

CLASSES = [RetroMAEForPretraining, SEEDEncoderForPretraining, BoWForPretraining, DupMAEForPretraining]
WITH_DECODER = {RetroMAEForPretraining, SEEDEncoderForPretraining, DupMAEForPretraining}


def _model(klass):
    torch.manual_seed(0)
    fields = {"dense_dim": 16, "doc_top_k": 16} if klass.config_class is DupMAEConfig else {}
    return klass(tiny_pretraining_config(klass.config_class, **fields))


def _forward(model, batch):
    torch.manual_seed(1)  # the decoders sample their masks
    return model(**batch)


def test_chunked_accuracy_equals_a_direct_computation_and_is_nan_without_rows():
    generator = torch.Generator().manual_seed(0)
    hidden, weight, bias = torch.randn(37, 8, generator=generator), torch.randn(50, 8, generator=generator), torch.randn(50)
    labels = (hidden @ weight.T + bias).argmax(-1)
    labels[::3] = (labels[::3] + 1) % 50  # a third of the rows wrong
    expected = ((hidden @ weight.T + bias).argmax(-1) == labels).float().mean()
    assert linear_argmax_accuracy(hidden, weight, bias, labels, chunk_size=5) == pytest.approx(expected.item())
    assert linear_argmax_accuracy(hidden[:0], weight, bias, labels[:0]).isnan()


@pytest.mark.parametrize("klass", CLASSES, ids=lambda k: k.__name__)
def test_accuracies_are_measured_only_when_asked_and_change_nothing_else(klass):
    model, batch = _model(klass), masked_batch()
    plain = _forward(model, batch)
    plain.loss.backward()
    plain_grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    assert plain.encoder_mlm_accuracy is None and plain.decoder_accuracy is None
    model.zero_grad()
    model.measure_accuracy = True
    measured = _forward(model, batch)
    measured.loss.backward()
    losses = [name for name in plain if name.endswith("loss")]
    assert losses == [name for name in measured if name.endswith("loss")]
    for name in losses:
        assert torch.equal(measured[name], plain[name]), name
    for name, p in model.named_parameters():
        if name in plain_grads:
            assert torch.equal(p.grad, plain_grads[name]), name
    with torch.no_grad():
        logits = model.vocab_logits(model.encode(batch["input_ids"], batch["attention_mask"]))
    keep = batch["encoder_labels"] != -100
    expected = (logits[keep].argmax(-1) == batch["encoder_labels"][keep]).float().mean()
    assert measured.encoder_mlm_accuracy.item() == pytest.approx(expected.item())
    assert (measured.decoder_accuracy is not None) == (klass in WITH_DECODER)
    if measured.decoder_accuracy is not None:
        assert 0.0 <= measured.decoder_accuracy.item() <= 1.0


def test_decoder_terms_score_the_decoder_states_with_the_tied_head():
    model = _model(RetroMAEForPretraining)
    model.measure_accuracy = True
    generator = torch.Generator().manual_seed(3)
    states = torch.randn(2, 6, 32, generator=generator)
    with torch.no_grad():
        top = model.vocab_logits(states).argmax(-1)  # (2, 6)
    targets = top.clone()
    targets[0, :3] = (targets[0, :3] + 1) % model.config.vocab_size  # 3 of 10 labelled positions wrong
    targets[1, 4:] = -100
    terms = model.decoder_terms(states, targets)
    assert set(terms) == {"decoder_loss", "decoder_accuracy"}
    assert terms["decoder_accuracy"].item() == pytest.approx(0.7)


def test_pretraining_logs_accuracies_on_the_logged_steps_only(tiny_bert, corpus, tmp_path, monkeypatch, capsys):
    """4 steps, logging every 2 and the first: steps 1, 2 and 4 measure (two terms each); step 3 does not."""
    calls = []
    original = RetroMAEForPretraining.mlm_accuracy

    def counted(self, hidden, labels):
        calls.append(labels.shape)
        return original(self, hidden, labels)

    monkeypatch.setattr(RetroMAEForPretraining, "mlm_accuracy", counted)
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--logging-steps", "2", "--no-export", "true")) == 0
    assert len(calls) == 3 * 2
    assert "top-1 accuracies (step 1 -> step 4): decoder_accuracy " in capsys.readouterr().out
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    logged = {entry["step"]: entry for entry in state["log_history"] if "loss" in entry}
    assert sorted(logged) == [1, 2, 4]
    for entry in logged.values():
        assert 0.0 <= entry["encoder_mlm_accuracy"] <= 1.0 and 0.0 <= entry["decoder_accuracy"] <= 1.0
