"""Regional compilation: each layer of a repeated stack compiled on its own, so one compiled graph serves every
layer of the stack (compile time of one layer, not of the model) and the mask samplers stay eager outside them;
and the vocabulary losses' per-chunk softmax as one compiled kernel."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def fast_path_wanted(flag: bool | None, device: torch.device) -> bool:
    """A fast-path flag's value; unset (None) means on for CUDA, where each path was measured faster for every
    method (`benchmarks/results/pretrain_throughput_h100_bf16_b64.json`), and off elsewhere (not timed there;
    compiling costs start-up)."""
    return device.type == "cuda" if flag is None else flag


def repeated_layers(model: nn.Module) -> list[nn.Module]:
    """The entries of every `nn.ModuleList` in `model` whose entries share one class (the encoder's layers, a
    decoder's layers), in module order."""
    layers = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) and len({type(entry) for entry in module}) == 1:
            layers.extend(module)
    return layers


def compile_layers(model: nn.Module, **compile_options: Any) -> int:
    """Compiles every repeated layer of `model` in place (`nn.Module.compile`: weights and state-dict names are
    unchanged, so checkpoints load either way) with `torch.compile`'s `compile_options`; returns how many."""
    layers = repeated_layers(model)
    for layer in layers:
        layer.compile(**compile_options)
    return len(layers)


def compile_loss(model: nn.Module) -> bool:
    """Turns on the compiled softmax of `model`'s vocabulary losses (`linear_cross_entropy(compiled=True)`);
    False for a model without them (e.g. a plain transformers model)."""
    if not hasattr(model, "compile_loss"):
        return False
    model.compile_loss = True
    return True


def set_loss_kernel(model: nn.Module, kernel: str) -> bool:
    """Sets the kernel of `model`'s vocabulary losses (`linear_cross_entropy(kernel=...)`, one of `LOSS_KERNELS`);
    False for a model without them (e.g. a plain transformers model)."""
    if not hasattr(model, "loss_kernel"):
        return False
    model.loss_kernel = kernel
    return True


def pad_loss_vocab(model: nn.Module, multiple: int = 64) -> bool:
    """Pads the vocabulary dimension of `model`'s vocabulary losses to a multiple of `multiple` inside the loss
    (`linear_cross_entropy(vocab_multiple=...)`: aligned GEMMs, the same losses and gradients within rounding);
    False for a model without them (e.g. a plain transformers model)."""
    if not hasattr(model, "loss_vocab_multiple"):
        return False
    model.loss_vocab_multiple = multiple
    return True
