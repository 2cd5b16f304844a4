"""The fused vocabulary cross-entropy (`linear_cross_entropy`): evaluation builds no gradient buffers, training
gradients stay those of plain cross-entropy, and a second backward through a retained graph is refused."""

import pytest
import torch
import torch.nn.functional as F
from retromae.modeling.layers_retromae import linear_cross_entropy
from torch.utils._python_dispatch import TorchDispatchMode

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


def _loss_and_gradients(compiled: bool, autocast: bool) -> list[torch.Tensor]:
    hidden, weight, bias, labels = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, compiled=compiled)
    loss.backward()
    return [loss.detach(), hidden.grad, weight.grad, bias.grad]


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_compiled_softmax_gives_the_eager_loss_and_gradients(autocast):
    """`compiled=True` (`--compile-loss`): each chunk's softmax and gradient in one inductor kernel (C++ on CPU, a
    few seconds cold); the chunks of 8 rows and the last one of 5 share it (dynamic shapes). Against plain
    cross-entropy too, so that a kernel wrong in the same way as the eager path would not pass."""
    eager, compiled = _loss_and_gradients(False, autocast), _loss_and_gradients(True, autocast)
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if autocast else {"atol": 1e-5, "rtol": 1e-5}
    for got, want in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, want, **tolerance)
    hidden, weight, bias, labels = _inputs()
    reference = F.cross_entropy(F.linear(hidden, weight, bias), labels)
    reference.backward()
    if not autocast:
        for got, want in zip(compiled, [reference.detach(), hidden.grad, weight.grad, bias.grad], strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
