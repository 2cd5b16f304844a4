"""Stopping a run whose loss is no longer finite, on every process at once."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .sharding import local_tensor


def divergence(model: nn.Module, log_history: list[dict[str, Any]]) -> str | None:
    """None while every weight of `model` this process holds is finite; else what diverged, e.g. "37 weight
    tensor(s) are NaN or infinite, the logged losses first at step 3" (the Trainer leaves non-finite losses out of
    the loss it reports, so a diverged run otherwise looks finished). A sharded (FSDP2 `DTensor`) parameter is
    checked on this process's shard only, without communication: `divergence_on_any_process` combines the
    processes."""
    broken = sum(1 for parameter in model.parameters() if not bool(torch.isfinite(local_tensor(parameter)).all()))
    if not broken:
        return None
    first = next((entry.get("step") for entry in log_history
                  if any(isinstance(value, float) and not math.isfinite(value) for key, value in entry.items()
                         if key.endswith("loss") or key == "grad_norm")), None)
    return f"{broken} weight tensor(s) are NaN or infinite" + (
        f", the logged losses first at step {first}" if first is not None else "")


def divergence_on_any_process(model: nn.Module, log_history: list[dict[str, Any]]) -> str | None:
    """`divergence`, agreed on by every process of a distributed run (a collective: call it on all of them).

    FSDP and ZeRO-3 shard the weights, so a NaN may lie in one process's shard only; a process stopping alone would
    leave the others waiting in their next collective. One all-reduce of one flag, whatever the number of parameters
    (each process checks its own shards, `divergence`)."""
    diverged = divergence(model, log_history)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return diverged
    device = local_tensor(next(model.parameters())).device  # nccl: on the GPU
    flag = torch.tensor([int(diverged is not None)], device=device)
    torch.distributed.all_reduce(flag)
    others = int(flag.item()) - int(diverged is not None)
    if diverged is None and others:
        return f"the weights of {others} other process(es) are NaN or infinite"
    return diverged


__all__ = ["divergence", "divergence_on_any_process"]
