"""`AtomicCheckpoints`: a Trainer mixin whose `checkpoint-N` folders appear only complete."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from accelerate.utils import broadcast_object_list
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..inputs.outputs import atomic_folder
from .run_folder import TRAINER_STATE_NAME


class AtomicCheckpoints:
    """Mix in before a `transformers.Trainer` class. Every process writes a checkpoint into one hidden sibling of
    `checkpoint-N` (`inputs.outputs.atomic_folder`), which the main process renames once all are done: an exception
    or Ctrl-C during a save removes the sibling, a kill leaves it to `run_folder.clean_killed_saves`.

    Subclasses add their files in `_save_checkpoint_files` and may change how the weights are written
    (`_save_model_files`), which existing `checkpoint-N` a save may replace (`_check_replaceable`) and which
    checkpoints rotation deletes (`_rotate_checkpoints_in`).
    """

    def _save_checkpoint(self, model, trial) -> None:
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = Path(self._get_output_dir(trial=trial))
        target = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self._check_replaceable(target)  # on every process, before any writes: all refuse alike
        if self.state.best_global_step:
            best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.best_global_step}"
            if best == target or best.is_dir():  # recorded before the trainer state is written, as the Trainer does
                self.state.best_model_checkpoint = str(best)
        with self._atomic_save(target) as build:
            self._save_model_files(build)
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(str(build))
                self._save_scaler(str(build))
                self._save_rng_state(str(build))
            self._save_checkpoint_files(build)
            if self.args.should_save:
                self._save_trainer_state(build)
        if self.args.push_to_hub:
            self._push_from_checkpoint(str(target))
        if self.args.should_save:
            self._rotate_checkpoints_in(run_dir)

    def _check_replaceable(self, target: Path) -> None:
        """Raise if the save must not replace an existing `target` (default: any may be replaced)."""

    def _save_model_files(self, folder: Path) -> None:
        self.save_model(str(folder), _internal_call=True)

    def _save_checkpoint_files(self, folder: Path) -> None:
        """Files of the subclass, written before the trainer state."""

    def _rotate_checkpoints_in(self, run_dir: Path) -> None:
        rotate_checkpoints(output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                           best_model_checkpoint=self.state.best_model_checkpoint)

    def _save_trainer_state(self, folder: Path) -> None:
        """`trainer_state.json` with the state of the callbacks that export one (as `Trainer._save_checkpoint`)."""
        for callback in [*self.callback_handler.callbacks, self.control]:
            if isinstance(callback, ExportableState):
                name, state = type(callback).__name__, callback.state()
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(state)
                else:
                    self.state.stateful_callbacks[name] = state
        self.state.save_to_json(str(folder / TRAINER_STATE_NAME))

    @contextmanager
    def _atomic_save(self, target: Path):
        """Yield one temporary folder that every process writes into; the main process renames it to `target`
        once all processes are done, and nobody goes on before that."""
        if self.args.should_save:
            with atomic_folder(target, overwrite=True) as build:
                yield self._shared_path(build)
                self.accelerator.wait_for_everyone()  # every process's files are in
        else:
            yield self._shared_path(None)
            self.accelerator.wait_for_everyone()
        self.accelerator.wait_for_everyone()  # the folder has its final name

    def _shared_path(self, path: Path | None) -> Path:
        """The main process's `path`, on every process."""
        if self.args.world_size > 1:
            path = Path(broadcast_object_list([str(path) if path else None], from_process=0)[0])
        return path


__all__ = ["AtomicCheckpoints"]
