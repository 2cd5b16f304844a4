"""`RetroMAETrainer`: the HF Trainer for every pre-training method of this package.

- logs every loss component of the model output (fields ending in `_loss`), averaged over the logging window
  and across processes;
- periodic checkpoints are full `save_pretrained` folders (decoder included) plus `retromae_run.json` and the
  collator's random state, so `--resume-from-checkpoint` continues exactly where the run stopped (map-style
  datasets with `dataloader_num_workers=0`; with workers or streaming, resuming loses nothing but draws new masks);
- callbacks a method needs (BoW's weight schedule) are registered automatically;
- `save_model()` called by a user exports the encoder as a sentence-transformers folder instead.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .schedules import schedule_callbacks

logger = logging.getLogger(__name__)

RUN_INFO_NAME = "retromae_run.json"
TRAINER_STATE_NAME = "trainer_state.json"  # the Trainer writes it last: its presence marks a complete checkpoint
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_RUN_INFO_TRAINING_KEYS = (
    "learning_rate", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps", "num_train_epochs",
    "warmup_steps", "weight_decay", "seed", "lr_scheduler_type",
)


def write_json_atomic(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders of `output_dir`, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint whose save finished (a run killed mid-save leaves one without trainer_state.json)."""
    complete = [p for p in list_checkpoints(output_dir) if (p / TRAINER_STATE_NAME).is_file()]
    for partial in set(list_checkpoints(output_dir)) - set(complete):
        logger.warning("Ignoring incomplete checkpoint %s (no %s: the run stopped while saving it)", partial, TRAINER_STATE_NAME)
    return complete[-1] if complete else None


class RetroMAETrainer(Trainer):
    """Trainer for `*ForPretraining` models.

    Args:
        run_info: what the run was (method, base model, corpus, lengths); written to every checkpoint as
            `retromae_run.json` and used by the model card. Must not contain local paths.
        Other arguments as `transformers.Trainer`. The data collator may expose a `generator`
        (`torch.Generator`); its state is checkpointed for exact resumption.
    """

    def __init__(self, *args, run_info: dict[str, Any] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_info = dict(run_info or {})
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._loss_steps = 0
        self._batches_consumed = 0  # training micro-batches seen by this process (for the collator's state)
        for callback in schedule_callbacks(self.model):
            self.add_callback(callback)

    # ---- loss components --------------------------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if model.training:
            self._batches_consumed += 1
            for name, value in outputs.items():
                if name.endswith("_loss") and value is not None:
                    self._loss_sums[name] = self._loss_sums.get(name, 0.0) + value.detach().float()
            self._loss_steps += 1
        return (outputs.loss, outputs) if return_outputs else outputs.loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._loss_steps:  # same branch on every rank, so the collective below is safe
            for name, total in sorted(self._loss_sums.items()):
                mean = self.accelerator.reduce(total / self._loss_steps, reduction="mean")
                logs[name] = round(mean.item(), 4)
            self._loss_sums, self._loss_steps = {}, 0
        super().log(logs, start_time)

    # ---- checkpoints --------------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Checkpoints (internal calls) keep the full pre-training model; a user's call exports the encoder."""
        output_dir = output_dir or self.args.output_dir
        if _internal_call:
            super().save_model(output_dir, _internal_call=True)
            self._save_collator_state(output_dir)
            if self.args.should_save:
                write_json_atomic(Path(output_dir) / RUN_INFO_NAME, self.current_run_info())
            return
        if self.args.should_save:
            from .export import export_from_model

            export_from_model(
                self.accelerator.unwrap_model(self.model), self.processing_class, output_dir,
                run_info=self.current_run_info(), overwrite=True,
            )

    def save_pretraining_model(self, output_dir: str | os.PathLike) -> None:
        """Save the full pre-training model (decoder included) + tokenizer + run info, e.g. at the end of training."""
        self.save_model(str(output_dir), _internal_call=True)

    def current_run_info(self) -> dict[str, Any]:
        training = {key: getattr(self.args, key) for key in _RUN_INFO_TRAINING_KEYS}
        training["world_size"] = self.args.world_size
        training["warmup_steps"] = self.args.warmup_steps
        losses = [entry for entry in self.state.log_history if "loss" in entry]
        final = {k: v for k, v in losses[-1].items() if k == "loss" or k.endswith("_loss")} if losses else {}
        first = {k: v for k, v in losses[0].items() if k == "loss" or k.endswith("_loss")} if losses else {}
        return {**self.run_info, "global_step": self.state.global_step, "training": training,
                "first_losses": first, "final_losses": final}

    def _collator_generator(self) -> torch.Generator | None:
        return getattr(self.data_collator, "generator", None)

    def _collator_state_to_save(self) -> torch.Tensor | None:
        collator = self.data_collator
        if hasattr(collator, "generator_state_before"):
            return collator.generator_state_before(self._batches_consumed)
        generator = self._collator_generator()
        return generator.get_state() if generator is not None else None

    def _collator_state_file(self, folder: str | os.PathLike) -> Path:
        return Path(folder) / f"collator_rng_{self.args.process_index}.safetensors"

    def _save_collator_state(self, folder: str) -> None:
        state = self._collator_state_to_save()
        if state is not None:
            os.makedirs(folder, exist_ok=True)
            save_file({"state": state}, str(self._collator_state_file(folder)))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """As `Trainer.train`; restores the collator's random state first (the Trainer restores its own RNG only
        after it has already collated the first resumed batch)."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"no complete checkpoint to resume from in {self.args.output_dir}")
            resume_from_checkpoint = str(resume_from_checkpoint)
        generator = self._collator_generator()
        if resume_from_checkpoint and generator is not None:
            state_file = self._collator_state_file(resume_from_checkpoint)
            if state_file.is_file():
                state = load_file(str(state_file))["state"]
                restart = getattr(self.data_collator, "restart_generator", generator.set_state)
                restart(state)
                self._batches_consumed = 0
            else:
                logger.warning("%s has no collator random state; masks after resuming will differ", resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)


__all__ = ["RUN_INFO_NAME", "RetroMAETrainer", "last_complete_checkpoint", "list_checkpoints", "write_json_atomic"]
