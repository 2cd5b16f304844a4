"""Regional compilation: each layer of a repeated stack compiled on its own, so one compiled graph serves every
layer of the stack (compile time of one layer, not of the model) and the mask samplers stay eager outside them;
and the vocabulary losses' per-chunk softmax as one compiled kernel."""

from __future__ import annotations

from typing import Any

from torch import nn


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
