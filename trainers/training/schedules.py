"""Loss-weight schedules driven by the Trainer's optimizer-step counter.

BoW prediction's reference code (bowdpr `trainer.py`) decays the BoW weight on a cosine keyed on accelerate's
micro-batch counter while the horizon is in optimizer steps, so under gradient accumulation 4 the weight reaches its
floor after a quarter of training, and it sets the factor after the forward pass (one step late). Here the model owns
the schedule math (`set_training_progress(progress)`) and `BoWScheduleCallback` feeds it
`state.global_step / state.max_steps` at `on_step_begin`, which the Trainer fires once per optimizer step, before the
first micro-batch of the accumulation window; `global_step` counts optimizer steps and is restored on resume.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

__all__ = ["BoWScheduleCallback", "schedule_callbacks"]


def _unwrap(model):
    """The innermost module of DDP / DeepSpeed / torch.compile wrappers."""
    while True:
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


class BoWScheduleCallback(TrainerCallback):
    """Sets a model's training-progress-dependent loss weights (e.g. `BoWForPretraining.bow_schedule_factor`) from
    the optimizer step at the start of every optimizer step.

    Works for any model with a `set_training_progress(progress: float)` method; progress is
    `state.global_step / state.max_steps` (0 at the first step, (max_steps - 1) / max_steps at the last).
    """

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._update(state, model)

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self._update(state, model)

    @staticmethod
    def _update(state, model) -> None:
        if model is None:
            return
        target = _unwrap(model)
        if not hasattr(target, "set_training_progress"):
            return
        if not state.max_steps or state.max_steps <= 0:
            logger.warning("max_steps is unknown; the loss-weight schedule stays at its current value")
            return
        target.set_training_progress(state.global_step / state.max_steps)


def schedule_callbacks(model) -> list[TrainerCallback]:
    """The schedule callbacks a pre-training model needs (empty for methods without a schedule)."""
    return [BoWScheduleCallback()] if hasattr(_unwrap(model), "set_training_progress") else []
