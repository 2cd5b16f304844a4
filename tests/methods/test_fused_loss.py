"""The fused vocabulary cross-entropy (`linear_cross_entropy`): evaluation builds no gradient buffers, training
gradients stay those of plain cross-entropy, a second backward through a retained graph is refused, and padding the
vocabulary (`vocab_multiple`, `pad_loss_vocab`) leaves losses and gradients as they are."""

import pytest
import torch
import torch.nn.functional as F
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.configuration_seed import SEEDConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.modeling.modeling_seed import SEEDEncoderForPretraining
from retromae.modeling.vocab_losses import linear_cross_entropy
from retromae.trainers.training.fast_paths import pad_loss_vocab
from torch.utils._python_dispatch import TorchDispatchMode

from ..builders import TINY_VOCAB, masked_batch, tiny_pretraining_config

VOCAB, HIDDEN, ROWS = 50, 6, 37


class _RecordShapes(TorchDispatchMode):
    """Records the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, tuple | list) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.shapes.append(tuple(tensor.shape))
        return out


def _inputs(requires_grad: bool = True):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(ROWS, HIDDEN, generator=generator).requires_grad_(requires_grad)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator).requires_grad_(requires_grad)
    bias = torch.randn(VOCAB, generator=generator).requires_grad_(requires_grad)
    labels = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    return hidden, weight, bias, labels


def test_no_grad_builds_no_weight_gradient_and_gives_the_training_loss():
    hidden, weight, bias, labels = _inputs()
    training_loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8)
    recorder = _RecordShapes()
    with torch.no_grad(), recorder:
        eval_loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8)
    assert (VOCAB, HIDDEN) not in recorder.shapes  # no (V, H) gradient buffer
    assert (ROWS, HIDDEN) not in recorder.shapes  # no gradient of the hidden states either
    assert not eval_loss.requires_grad
    assert torch.equal(eval_loss, training_loss.detach())  # bit-identical loss
    torch.testing.assert_close(eval_loss, F.cross_entropy(hidden @ weight.t() + bias, labels).detach())


def test_only_the_requested_gradients_are_formed():
    hidden, weight, bias, labels = _inputs()
    frozen_weight, frozen_bias = weight.detach(), bias.detach()
    recorder = _RecordShapes()
    with recorder:
        loss = linear_cross_entropy(hidden, frozen_weight, frozen_bias, labels, chunk_size=8)
    assert (VOCAB, HIDDEN) not in recorder.shapes
    loss.backward()
    reference = hidden.detach().clone().requires_grad_()
    F.cross_entropy(reference @ weight.detach().t() + bias.detach(), labels).backward()
    torch.testing.assert_close(hidden.grad, reference.grad)


def test_retained_graph_first_backward_is_exact_and_second_is_refused():
    hidden, weight, bias, labels = _inputs()
    loss = 2.5 * linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8)
    loss.backward(retain_graph=True)
    reference = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias)]
    (2.5 * F.cross_entropy(reference[0] @ reference[1].t() + reference[2], labels)).backward()
    for ours, theirs in zip((hidden, weight, bias), reference, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)
    with pytest.raises(RuntimeError, match="second backward through the same graph"):
        loss.backward()


def loss_and_gradients(autocast: bool, **options) -> list[torch.Tensor]:
    """Loss and grad of hidden, weight and bias of `linear_cross_entropy(..., chunk_size=8, **options)`."""
    hidden, weight, bias, labels = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, **options)
    loss.backward()
    return [loss.detach(), hidden.grad, weight.grad, bias.grad]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_compiled_softmax_gives_the_eager_loss_and_gradients(autocast):
    """`compiled=True` (`--compile-loss`): each chunk's softmax and gradient in one inductor kernel (C++ on CPU, a
    few seconds cold); the chunks of 8 rows and the last one of 5 share it (dynamic shapes). Against plain
    cross-entropy too, so that a kernel wrong in the same way as the eager path would not pass."""
    eager, compiled = loss_and_gradients(autocast), loss_and_gradients(autocast, compiled=True)
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if autocast else {"atol": 1e-5, "rtol": 1e-5}
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, **tolerance)
    hidden, weight, bias, labels = _inputs()
    reference = F.cross_entropy(F.linear(hidden, weight, bias), labels)
    reference.backward()
    if not autocast:
        for got, want in zip(compiled, [reference.detach(), hidden.grad, weight.grad, bias.grad], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_bf16_gradients_are_those_of_plain_cross_entropy():
    """Under bf16 each chunk's weight and bias gradients are bf16 products summed in fp32: plain cross-entropy's
    gradients within bf16 rounding, in the parameters' fp32."""
    got = loss_and_gradients(autocast=True)[1:]
    hidden, weight, bias, labels = _inputs()
    F.cross_entropy(F.linear(hidden, weight, bias), labels).backward()
    for name, ours, want in zip(("hidden", "weight", "bias"), got, (hidden.grad, weight.grad, bias.grad), strict=True):
        assert ours.dtype == torch.float32 and ours.shape == want.shape, name
        assert float((ours - want).norm() / want.norm()) < 1e-2, name  # measured 2e-3 to 3e-3 (bf16 keeps 8 bits)


PADDED_VOCAB = 64  # VOCAB = 50 padded to a multiple of 64


def _padded_loss_and_gradients(vocab_multiple: int, compiled: bool, autocast: bool
                               ) -> tuple[list[torch.Tensor], list[tuple[int, ...]]]:
    """Loss, grad of hidden, weight and bias under `vocab_multiple`, and the shapes of the tensors formed."""
    hidden, weight, bias, labels = _inputs()
    recorder = _RecordShapes()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), recorder:
        loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, compiled=compiled,
                                    vocab_multiple=vocab_multiple)
    loss.backward()
    return [loss.detach(), hidden.grad, weight.grad, bias.grad], recorder.shapes


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_padded_vocabulary_gives_the_unpadded_loss_and_gradients(compiled, autocast):
    """`vocab_multiple=64` on V = 50: the GEMMs run on a (64, H) weight (its 14 extra logits -inf), the loss and the
    gradients, in their unpadded shapes, are those without padding within rounding, and finite."""
    padded, shapes = _padded_loss_and_gradients(PADDED_VOCAB, compiled, autocast)
    unpadded, unpadded_shapes = _padded_loss_and_gradients(1, compiled, autocast)
    assert (PADDED_VOCAB, HIDDEN) in shapes and (PADDED_VOCAB, HIDDEN) not in unpadded_shapes  # it did pad
    tolerance = {"atol": 1e-3, "rtol": 1e-2} if autocast else {"atol": 5e-7, "rtol": 1e-6}
    for got, want in zip(padded, unpadded, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, **tolerance)


def test_a_vocabulary_already_a_multiple_is_left_unpadded():
    padded, shapes = _padded_loss_and_gradients(VOCAB // 2, compiled=False, autocast=False)
    unpadded, unpadded_shapes = _padded_loss_and_gradients(1, compiled=False, autocast=False)
    assert shapes == unpadded_shapes  # no padded copy of the weight
    for got, want in zip(padded, unpadded, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_padded_vocabulary_without_gradient_gives_the_unpadded_loss(compiled):
    """Evaluation (no gradient): the padded loss is the unpadded one, and no gradient of the hidden states is built."""
    hidden, weight, bias, labels = _inputs()
    recorder = _RecordShapes()
    with torch.no_grad(), recorder:
        padded = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, compiled=compiled,
                                      vocab_multiple=PADDED_VOCAB)
    assert (PADDED_VOCAB, HIDDEN) in recorder.shapes and (ROWS, HIDDEN) not in recorder.shapes
    assert not padded.requires_grad and torch.isfinite(padded)
    with torch.no_grad():
        unpadded = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, compiled=compiled)
    torch.testing.assert_close(padded, unpadded, atol=1e-8, rtol=1e-6)
    torch.testing.assert_close(padded, F.cross_entropy(F.linear(hidden, weight, bias), labels), atol=1e-6, rtol=1e-6)


PRETRAINING_MODELS = {
    "retromae": lambda: RetroMAEForPretraining(tiny_pretraining_config(RetroMAEConfig)),
    "dupmae": lambda: DupMAEForPretraining(tiny_pretraining_config(DupMAEConfig, dense_dim=16, doc_top_k=8)),
    "seed": lambda: SEEDEncoderForPretraining(tiny_pretraining_config(SEEDConfig)),
}


def _model_losses_and_gradients(model) -> tuple[dict, dict, list[tuple[int, ...]]]:
    """The output's loss terms (the decoder's visibility drawn from seed 3), the parameters' gradients, and the
    shapes of the tensors formed."""
    torch.manual_seed(3)
    recorder = _RecordShapes()
    with recorder:
        output = model(**masked_batch())
    output.loss.backward()
    losses = {name: value.detach() for name, value in output.items() if name.endswith("loss") and value is not None}
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return losses, grads, recorder.shapes


@pytest.mark.parametrize("method", list(PRETRAINING_MODELS))
def test_pad_loss_vocab_gives_the_unpadded_losses_and_gradients(method):
    """`pad_loss_vocab` (V = 99 padded to 128 inside the vocabulary losses) leaves a pre-training model's losses and
    gradients as they are, within float32 rounding."""
    torch.manual_seed(0)
    model = PRETRAINING_MODELS[method]().eval()
    padded_shape = (-(-TINY_VOCAB // 64) * 64, model.config.hidden_size)
    plain, plain_grads, plain_shapes = _model_losses_and_gradients(model)
    assert pad_loss_vocab(model) and model.loss_vocab_multiple == 64
    padded, padded_grads, padded_shapes = _model_losses_and_gradients(model)
    assert padded_shape in padded_shapes and padded_shape not in plain_shapes  # the losses did pad
    assert padded.keys() == plain.keys() and padded_grads.keys() == plain_grads.keys()
    for name, loss in plain.items():
        torch.testing.assert_close(padded[name], loss, atol=1e-6, rtol=1e-6, msg=name)
    for name, grad in plain_grads.items():
        assert torch.isfinite(padded_grads[name]).all(), name
        torch.testing.assert_close(padded_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert not pad_loss_vocab(torch.nn.Linear(2, 2))  # nothing to pad in a model without our losses
