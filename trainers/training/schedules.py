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


def logs_at_step(args, state, step: int) -> bool:
    """Whether optimizer step `step` ends with a loss log: transformers' DefaultFlowCallback rule (the first step
    with `logging_first_step`, every `logging_steps`) and `LogLastStepCallback`'s last step."""
    if step == 1 and args.logging_first_step:
        return True
    return args.logging_strategy == "steps" and (step % state.logging_steps == 0 or step >= state.max_steps > 0)


class LogLastStepCallback(TrainerCallback):
    """Log at the last step too: a run shorter than `logging_steps` would otherwise log only its first step, and
    its summary would show that step's losses as both first and last."""

    def on_step_end(self, args, state, control, **kwargs):
        if logs_at_step(args, state, state.global_step):  # DefaultFlowCallback has set the others already
            control.should_log = True
        return control


__all__ = ["BoWScheduleCallback", "LogLastStepCallback", "schedule_callbacks"]


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
