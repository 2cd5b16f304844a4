"""The cut-cross-entropy kernels of the vocabulary losses (`linear_cross_entropy(kernel="cce")`, `--loss-kernel`):
the bias rides on an extra hidden column, and the losses and gradients are the chunked kernel's.

The package's Triton kernels run on CUDA only (the device call's path check compares them with eager mode). Here a
stand-in module with the package's call signature computes plain cross-entropy, so that these tests check our side
of the call (bias column, dtypes, gradients, which implementation and filter are asked for) on any machine; the last
test runs the real package where it is installed (its torch.compile implementation on CPU)."""

import importlib.machinery
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from retromae.modeling.vocab_losses import linear_cross_entropy
from retromae.trainers.cli import main
from retromae.trainers.training.fast_paths import set_loss_kernel

from ..builders import pretrain_args
from .test_fused_loss import PRETRAINING_MODELS, _inputs, _model_losses_and_gradients, loss_and_gradients


@pytest.fixture
def calls(monkeypatch) -> list[dict]:
    """Installs a stand-in `cut_cross_entropy` and returns the keyword arguments of each call to it."""
    recorded: list[dict] = []

    def stand_in(e, c, targets, reduction="mean", filter_eps="high", impl="cce"):
        recorded.append({"shapes": (tuple(e.shape), tuple(c.shape)), "dtype": e.dtype, "filter_eps": filter_eps,
                         "impl": impl, "reduction": reduction})
        return F.cross_entropy((e @ c.t()).float(), targets, reduction=reduction)

    module = types.ModuleType("cut_cross_entropy")
    module.__spec__ = importlib.machinery.ModuleSpec("cut_cross_entropy", None)
    module.linear_cross_entropy = stand_in
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", module)
    return recorded


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["cce", "cce_filtered"])
def test_cce_gives_the_chunked_loss_and_gradients(calls, kernel, autocast):
    """The hidden size 6 goes to 16 columns (the bias and 9 zeros), in the autocast dtype; the loss is float32 and
    the gradients of hidden, weight and bias are the chunked kernel's. Off CUDA the package's torch.compile version
    is asked for, which has no filter."""
    chunked, cce = loss_and_gradients(autocast), loss_and_gradients(autocast, kernel=kernel)
    assert calls == [{"shapes": ((37, 16), (50, 16)), "dtype": torch.bfloat16 if autocast else torch.float32,
                      "filter_eps": None, "impl": "torch_compile", "reduction": "mean"}]
    tolerance = {"atol": 1e-2, "rtol": 1e-2} if autocast else {"atol": 1e-6, "rtol": 1e-5}
    for got, want in zip(cce, chunked, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, **tolerance)


def test_cce_without_gradient_gives_the_loss(calls):
    hidden, weight, bias, labels = _inputs(requires_grad=False)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, bias, labels, kernel="cce")
    torch.testing.assert_close(loss, F.cross_entropy(F.linear(hidden, weight, bias), labels))
    assert not loss.requires_grad


def test_unknown_kernel_and_missing_package_are_refused(monkeypatch):
    hidden, weight, bias, labels = _inputs()
    with pytest.raises(ValueError, match="kernel='fast': choose one of chunked, cce, cce_filtered"):
        linear_cross_entropy(hidden, weight, bias, labels, kernel="fast")
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)  # import fails as if not installed
    with pytest.raises(ImportError, match="pip install cut-cross-entropy"):
        linear_cross_entropy(hidden, weight, bias, labels, kernel="cce")


@pytest.mark.parametrize("method", list(PRETRAINING_MODELS))
def test_set_loss_kernel_gives_the_chunked_losses_and_gradients(calls, method):
    """Every vocabulary loss of a pre-training model goes through the kernel set, with the same losses and
    gradients within float32 rounding."""
    torch.manual_seed(0)
    model = PRETRAINING_MODELS[method]().eval()
    chunked, chunked_grads, _ = _model_losses_and_gradients(model)
    assert set_loss_kernel(model, "cce") and model.loss_kernel == "cce"
    cce, cce_grads, _ = _model_losses_and_gradients(model)
    assert calls  # the kernel was used
    assert cce.keys() == chunked.keys() and cce_grads.keys() == chunked_grads.keys()
    for name, loss in chunked.items():
        torch.testing.assert_close(cce[name], loss, atol=1e-6, rtol=1e-6, msg=name)
    for name, grad in chunked_grads.items():
        torch.testing.assert_close(cce_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert not set_loss_kernel(torch.nn.Linear(2, 2), "cce")  # no vocabulary losses to set


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_real_package_gives_the_chunked_loss_and_gradients(device):
    """The installed cut-cross-entropy: its torch.compile implementation on CPU, its exact Triton kernels on CUDA."""
    pytest.importorskip("cut_cross_entropy", reason="the cut-cross-entropy package is not installed (optional)")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    results = {}
    for kernel in ("chunked", "cce"):
        hidden, weight, bias, labels = (t.to(device).detach().requires_grad_(t.is_floating_point()) for t in _inputs())
        loss = linear_cross_entropy(hidden, weight, bias, labels, chunk_size=8, kernel=kernel)
        loss.backward()
        results[kernel] = [loss.detach(), hidden.grad, weight.grad, bias.grad]
    for got, want in zip(results["cce"], results["chunked"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_pretrain_loss_kernel_flag_trains_through_the_kernel(calls, tiny_bert, corpus, tmp_path):
    """`--loss-kernel cce`: the run's vocabulary losses go through cut-cross-entropy (the stand-in here), and the
    chunked kernel's flags are left alone."""
    run = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, run, "--no-export", "true", "--max-steps", "2",
                              "--loss-kernel", "cce")) == 0
    assert calls and {call["impl"] for call in calls} == {"torch_compile"}
    assert (run / "checkpoint-2").is_dir()


@pytest.mark.parametrize(("flags", "message"), [
    (("--loss-kernel", "cce", "--compile-loss", "true"),
     "--compile-loss tunes the chunked loss kernel; drop it with --loss-kernel cce"),
    (("--loss-kernel", "cce_filtered", "--pad-loss-vocab", "true"),
     "--pad-loss-vocab tunes the chunked loss kernel; drop it with --loss-kernel cce_filtered"),
    (("--loss-kernel", "cce_filtered"), "--loss-kernel cce_filtered filters in cut-cross-entropy's CUDA kernels only; "
                                        "on cpu, use --loss-kernel cce (exact) or chunked"),
    (("--loss-kernel", "fused"), "invalid choice: 'fused' (choose from 'chunked', 'cce', 'cce_filtered')"),
])
def test_pretrain_refuses_loss_kernel_misuse(calls, tiny_bert, corpus, tmp_path, capsys, flags, message):
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--max-steps", "2", *flags)) != 0
    assert message in capsys.readouterr().err
    assert not calls


def test_pretrain_refuses_cce_without_the_package(tiny_bert, corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cut_cross_entropy", None)  # as if not installed
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--loss-kernel", "cce")) != 0
    assert ("--loss-kernel cce needs the cut-cross-entropy package: pip install cut-cross-entropy (or use "
            "--loss-kernel chunked)") in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
