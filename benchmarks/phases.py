"""Where a training step's time goes: marks between its phases, on the device's stream (CUDA events) or the host
clock (CPU, where every op is synchronous), and the device's busy share from torch.profiler.

`instrument(model, clock)` hooks a pre-training model or `BertForMaskedLM` so that one training step leaves marks at
the phase boundaries; `phase_times` turns them into milliseconds per phase:

| phase | from the mark ... to the mark ... |
|---|---|
| encoder forward | the encoder's forward pre-hook, its forward hook |
| decoder forward | the decoder's pre-hook, its hook (RetroMAE, DupMAE, SEED) |
| vocabulary losses | around `mlm_loss`, `vocab_logits`, `ot_embedding` (our fused losses also form their gradients here); HF MLM: its `cls` head (its cross-entropy is in "other forward") |
| other forward | the rest of the forward (masks, samplers, pooling, loss sums) |
| heads backward | backward start to the gradient of the encoder output: decoders, heads, losses |
| encoder backward | to the gradient of the embeddings output |
| rest of backward | to the end of `backward()` (embeddings, tied weights) |
| optimizer | `optimizer.step()` and `zero_grad` |

Nothing here changes what the step computes: hooks only record marks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

VOCAB_METHODS = ("mlm_loss", "vocab_logits", "ot_embedding")
BACKWARD_PHASES = ("heads backward", "encoder backward", "rest of backward")


class PhaseClock:
    """Named marks in stream order; `phase_times` reads them after a synchronize."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.armed: set[str] = set()  # backward phases whose gradient hook is set in this step

    def mark(self, phase_ending: str) -> None:
        """Marks the end of the phase `phase_ending` (the time since the previous mark is charged to it)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((phase_ending, event))
        else:
            self.marks.append((phase_ending, time.perf_counter()))

    def reset(self) -> None:
        self.marks.clear()
        self.armed.clear()

    def phase_times(self) -> dict[str, float]:
        """Milliseconds per phase over the marks so far (the first mark only starts the clock)."""
        times: dict[str, float] = defaultdict(float)
        for (_, start), (phase, end) in zip(self.marks, self.marks[1:], strict=False):
            times[phase] += start.elapsed_time(end) if self.cuda else 1e3 * (end - start)
        return dict(times)


def instrument(model: torch.nn.Module, clock: PhaseClock) -> None:
    """Hooks `model` (a pre-training model of ours, or `BertForMaskedLM`) to leave phase marks on `clock`."""
    encoder = model.base_model
    encoder.register_forward_pre_hook(lambda module, args: clock.mark("other forward"))
    encoder.register_forward_hook(lambda module, args, output: _after_encoder(clock, output))
    embeddings = getattr(encoder, "embeddings", None)
    if embeddings is not None:
        embeddings.register_forward_hook(lambda module, args, output: _on_gradient(output, clock, "encoder backward"))
    decoder = getattr(model, "decoder", None)
    if isinstance(decoder, torch.nn.Module):
        decoder.register_forward_pre_hook(lambda module, args: clock.mark("other forward"))
        decoder.register_forward_hook(lambda module, args, output: clock.mark("decoder forward"))
    head = getattr(model, "cls", None)
    if not any(hasattr(model, name) for name in VOCAB_METHODS) and isinstance(head, torch.nn.Module):
        head.register_forward_pre_hook(lambda module, args: clock.mark("other forward"))
        head.register_forward_hook(lambda module, args, output: clock.mark("vocabulary losses"))
    for name in VOCAB_METHODS:
        if hasattr(model, name):
            setattr(model, name, _marked(getattr(model, name), clock))


def _after_encoder(clock: PhaseClock, output) -> None:
    clock.mark("encoder forward")
    hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
    _on_gradient(hidden, clock, "heads backward")


def _on_gradient(tensor: torch.Tensor, clock: PhaseClock, phase: str) -> None:
    """Marks the end of `phase` when `tensor`'s gradient is formed; only at the first call of a step (a decoder may
    run the embeddings again)."""
    if torch.is_grad_enabled() and tensor.requires_grad and phase not in clock.armed:
        clock.armed.add(phase)
        tensor.register_hook(lambda grad: clock.mark(phase))


def _marked(method, clock: PhaseClock):
    def wrapper(*args, **kwargs):
        clock.mark("other forward")
        result = method(*args, **kwargs)
        clock.mark("vocabulary losses")
        return result

    return wrapper


def busy_share(step, steps: int) -> dict[str, Any]:
    """Runs `step()` `steps` times under torch.profiler: the share of the wall time the device spent in kernels,
    and the ten kernels that took most of it (their names show, e.g., which sdpa backend ran)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_us = 1e6 * (time.perf_counter() - started)
    kernels: dict[str, float] = defaultdict(float)
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] += event.device_time
    busy_us = sum(kernels.values())
    if busy_us <= 0:  # a profiler that reported no device events: no share rather than a false 100% idle
        return {"busy_share": None, "wall_ms_per_step": wall_us / 1e3 / steps, "top_kernels": []}
    top = sorted(kernels.items(), key=lambda item: -item[1])[:10]
    return {"busy_share": busy_us / wall_us, "wall_ms_per_step": wall_us / 1e3 / steps,
            "top_kernels": [{"name": name[:120], "share_of_busy": us / busy_us} for name, us in top]}
