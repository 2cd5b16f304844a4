"""A pre-training run's output folder: its checkpoints, which one to resume, and the files of a finished run."""

from __future__ import annotations

import logging
import os
import re
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import retromae.modeling
from transformers import TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, SaveStrategy

from ..inputs.io import read_json_or_empty
from ..inputs.outputs import clean_stale_siblings, sibling_target_name, would_delete
from .lock import LOCK_NAME
from .resume import RESUME_FILE, read_settings, run_id_of

logger = logging.getLogger(__name__)

RUN_INFO_NAME = "retromae_run.json"
TRAINER_STATE_NAME = "trainer_state.json"  # the Trainer writes it last: its presence marks a complete checkpoint
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """`checkpoint-N` folders of `output_dir`, oldest first."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := _CHECKPOINT_RE.match(p.name))]
    return [p for _, p in sorted(found)]


RESUME_LAST = {"last", "auto", "true", "True"}  # --resume-from-checkpoint values meaning the newest checkpoint
_RESUME_LAST_FLAG = "--resume-from-checkpoint last (Python: resume_from_checkpoint=True)"


def last_complete_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest checkpoint whose save finished (a run killed mid-save leaves one without trainer_state.json)."""
    complete = [p for p in list_checkpoints(output_dir) if (p / TRAINER_STATE_NAME).is_file()]
    for partial in set(list_checkpoints(output_dir)) - set(complete):
        logger.warning("Ignoring incomplete checkpoint %s (no %s: the run stopped while saving it)", partial, TRAINER_STATE_NAME)
    return complete[-1] if complete else None


def checkpoint_to_resume(output_dir: str | os.PathLike) -> Path | None:
    """What `--resume-from-checkpoint last` (Python: `train(resume_from_checkpoint=True)`) continues: the newest
    complete checkpoint in `output_dir`.

    Raises:
        ValueError: the complete checkpoints there come from more than one run (`run_id`; none recorded counts as one
            more): which run to continue is the user's choice, so the message names each run's newest checkpoint.
    """
    complete = [p for p in list_checkpoints(output_dir) if (p / TRAINER_STATE_NAME).is_file()]
    for checkpoint in complete:  # a damaged record would read as a checkpoint of another run
        damaged = damaged_record(checkpoint)
        if damaged:
            raise ValueError(f"{_RESUME_LAST_FLAG}: {damaged}")
    newest = {run_id_of(p): p for p in complete}  # oldest first: each run's newest wins
    if len(newest) > 1:
        runs = sorted(newest.items(), key=lambda item: complete.index(item[1]), reverse=True)
        listing = "; ".join(f"{path} (run {run_id or 'without a recorded id'})" for run_id, path in runs)
        raise ValueError(f"{_RESUME_LAST_FLAG}: {output_dir} holds checkpoints of {len(newest)} runs, newest {listing}; "
                         f"pass the checkpoint folder of the run to continue, e.g. --resume-from-checkpoint {runs[0][1]} "
                         f"(Python: resume_from_checkpoint={str(runs[0][1])!r})")
    return last_complete_checkpoint(output_dir)


def resume_target(output_dir: str | os.PathLike, resume: str | bool | None) -> str | None:
    """The checkpoint `Trainer.train(resume_from_checkpoint=resume)` continues: True means the newest complete one in
    `output_dir` (`checkpoint_to_resume`), refused when there is none."""
    if resume is not True:
        return resume or None
    found = checkpoint_to_resume(output_dir)
    if found is None:
        raise ValueError(f"resume_from_checkpoint=True: no complete checkpoint to resume from in {output_dir}; "
                         "train without it to start a new run")
    return str(found)


def check_no_checkpoint_collision(output_dir: str | os.PathLike, checkpoint: str | os.PathLike | None,
                                  max_steps: int, run_id: str | None = None) -> None:
    """Refuse a run into `output_dir` whose saves could replace another run's `checkpoint-N` there: resuming
    `checkpoint`, one with N after the resumed step; a new run (`checkpoint` None, from Python: the command line
    refuses any earlier run first, `prepare_output_dir`), any. Only N up to `max_steps` count when it is > 0.

    Args:
        run_id: the run's id (`resume.run_id_of`), default `checkpoint`'s.

    Raises:
        ValueError: naming those checkpoints and the way out.
    """
    own = run_id if run_id is not None else run_id_of(checkpoint) if checkpoint else None
    step = read_json_or_empty(Path(checkpoint) / TRAINER_STATE_NAME).get("global_step", 0) if checkpoint else 0
    ahead = [p for p in list_checkpoints(output_dir) if run_id_of(p) != own
             and step < int(_CHECKPOINT_RE.match(p.name).group(1)) <= (max_steps if max_steps > 0 else float("inf"))]
    if not ahead:
        return
    names = ", ".join(p.name for p in ahead)
    if checkpoint is None:
        raise ValueError(f"output_dir {output_dir} holds checkpoints of another run ({names}), which this run's saves "
                         "could replace; continue that run with train(resume_from_checkpoint=True) (--resume-from-"
                         "checkpoint last), or choose another output_dir, or delete those checkpoints")
    raise ValueError(f"--resume-from-checkpoint {checkpoint}: {output_dir} holds checkpoints of another run after "
                     f"step {step} ({names}), which this run's saves could replace; move them out of the folder, or "
                     "resume into another --output-dir (Python: output_dir)")


def check_replaceable(target: Path, run_id: str | None) -> None:
    """Refuse to save a checkpoint over `target` when it holds another run's (`run_id_of` differs from `run_id`):
    the guard behind `check_no_checkpoint_collision`, which refuses such a run before it trains."""
    if target.is_dir() and (theirs := run_id_of(target)) != run_id:
        raise ValueError(f"{target} holds a checkpoint of another run ({theirs or 'without a recorded id'}), which "
                         f"this save would replace; nothing was saved: move it out of {target.parent}, or train into "
                         "another --output-dir (Python: output_dir)")


def claim_checkpoints(args: TrainingArguments, resume: str | None, settings: dict[str, Any],
                      given: bool) -> dict[str, Any]:
    """The run record (`RESUME_FILE`) a `RetroMAETrainer.train` run writes into its checkpoints: `settings`, or when
    resuming without `given` ones, the checkpoint's (its run goes on under its id: rotation and `last` see one run);
    refused when its saves could replace another run's checkpoint (`check_no_checkpoint_collision`)."""
    if resume and not given:
        settings = read_settings(resume) or settings
    if args.save_strategy != SaveStrategy.NO:
        check_no_checkpoint_collision(args.output_dir, resume, args.max_steps, settings.get("run_id"))
    return settings


def finished_step(checkpoint: str | os.PathLike, max_steps: int) -> int | None:
    """The step `checkpoint` was saved at if its run has nothing left to train, else None.

    The Trainer checks `global_step >= max_steps` only after an optimizer step (`DefaultFlowCallback.on_step_end`), so
    resuming a finished run whose last step is not at an epoch boundary would train one step more before stopping.

    Args:
        checkpoint: a complete `checkpoint-N` folder.
        max_steps: the resumed run's `args.max_steps`; <= 0 (training by epochs): the checkpoint's own total.
    """
    state = read_json_or_empty(Path(checkpoint) / TRAINER_STATE_NAME)
    step, total = state.get("global_step", 0), max_steps if max_steps > 0 else state.get("max_steps", 0)
    return step if total > 0 and step >= total else None


FINAL_BUILD_NAME = ".retromae-final"  # the final save is built here, then its files move to the output root
_ROOT_FILE_PATTERNS = (
    "config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
    "model.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt", "chat_template.jinja",
    "training_args.bin", "collator_rng_*.safetensors", RUN_INFO_NAME, "validation.png",
)


def _remote_code_files() -> set[str]:
    """The modeling files `save_pretrained` copies beside a checkpoint's weights (our Hub remote code)."""
    return {path.name for path in Path(retromae.modeling.__file__).parent.glob("*.py") if path.name != "__init__.py"}


def run_output_files(output_dir: str | os.PathLike) -> list[Path]:
    """What `retromae pretrain` wrote in `output_dir`: the final model's files at the root (weights, config,
    tokenizer, run info, remote code), the `checkpoint-N` folders, the default export `encoder/` (a
    sentence-transformers folder) and folders left by killed saves. Anything else there is the user's."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    code = _remote_code_files()
    return [entry for entry in sorted(folder.iterdir()) if _is_run_file(entry, code) or _is_run_folder(entry)]


def _is_run_file(entry: Path, remote_code: set[str]) -> bool:
    return entry.is_file() and (entry.name in remote_code or any(entry.match(p) for p in _ROOT_FILE_PATTERNS))


def _is_run_folder(entry: Path) -> bool:
    return entry.is_dir() and bool(
        _CHECKPOINT_RE.match(entry.name) or _is_killed_save(entry.name)
        or (entry.name == "encoder" and (entry / "modules.json").is_file())
    )


def _is_killed_save(name: str) -> bool:
    """The final save's build folder, or an `atomic_folder` sibling (`.<name>.tmp-...`/`.old-...`) of a checkpoint
    or of that build folder."""
    target = sibling_target_name(name)
    return name == FINAL_BUILD_NAME or target == FINAL_BUILD_NAME or bool(target and _CHECKPOINT_RE.match(target))


def remove_previous_run(output_dir: str | os.PathLike) -> list[Path]:
    """Delete what an earlier run wrote in `output_dir` (see `run_output_files`); other files stay."""
    removed = run_output_files(output_dir)
    for path in removed:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    logger.info("--overwrite-output-dir: removed %d file(s)/folder(s) of the earlier run in %s", len(removed),
                output_dir)
    return removed


def clean_killed_saves(output_dir: str | os.PathLike) -> None:
    """Remove the build folders of checkpoint and final saves that a killed run left in `output_dir` (a swap cut
    short between its two renames is undone by `clean_stale_siblings`)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == FINAL_BUILD_NAME:
            shutil.rmtree(entry, ignore_errors=True)
        elif _is_killed_save(entry.name) and entry.is_dir():
            clean_stale_siblings(folder / sibling_target_name(entry.name))


def install_files(build: Path, root: Path) -> None:
    """Move the files of a finished final save from `build` into `root`, replacing the previous final save's
    files (and removing those the new save does not have, e.g. shards or another method's code). `config.json` goes
    first and comes back last, so `root` lacks it, and readers refuse it, while the two saves are mixed."""
    # the Trainer's pickle of the run's arguments (local paths included), which nothing reads: the final save is what
    # users upload (checkpoints keep it)
    (build / "training_args.bin").unlink(missing_ok=True)
    incoming = {path.name for path in build.iterdir()}
    (root / "config.json").unlink(missing_ok=True)
    for stale in run_output_files(root):
        if stale.is_file() and stale.name not in incoming:
            stale.unlink()
    for path in sorted(build.iterdir(), key=lambda p: (p.name == "config.json", p.name == RUN_INFO_NAME, p.name)):
        os.replace(path, root / path.name)
    build.rmdir()


def damaged_record(checkpoint: Path) -> str | None:
    """What is wrong with `checkpoint`'s run record (`RESUME_FILE`) when it is there but not a JSON object, or None."""
    record = checkpoint / RESUME_FILE
    if not record.exists() or read_json_or_empty(record):
        return None
    return (f"{record} is damaged (not a JSON object), so the run's settings are unknown; restore it, or resume "
            "from an earlier checkpoint-N")


def resume_state_problem(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot continue its run exactly, or None: its run record is damaged (`damaged_record`), or,
    in the Trainer's plain format (`optimizer.pt` beside the weights), its optimizer, schedule or RNG state is
    missing or not a complete torch file (the Trainer would stop with torch's traceback, or restart the
    learning-rate schedule without a word)."""
    damaged = damaged_record(checkpoint)
    if damaged:
        return damaged
    if not (checkpoint / "optimizer.pt").exists():  # DeepSpeed and FSDP keep theirs in folders of their own
        return None
    for path in [checkpoint / "optimizer.pt", checkpoint / "scheduler.pt", *sorted(checkpoint.glob("rng_state*.pth"))]:
        problem = "is missing" if not path.is_file() else None if zipfile.is_zipfile(path) else "is damaged"
        if problem:
            return (f"{path} {problem}, so {checkpoint.name} cannot continue its run exactly; resume from an earlier "
                    f"checkpoint-N, or start a new run from its weights with --model {checkpoint}")
    return None


def prepare_output_dir(output_dir: str, resume: str | None, *, overwrite: bool, should_save: bool,
                       inputs: Mapping[str, str | None] | None = None) -> bool:
    """Refuse to write into a folder with an earlier run unless asked (resuming that run is asked), and an
    --overwrite-output-dir that would delete one of `inputs` (`inputs.pretrain_options.run_inputs`). Build folders
    of saves a kill interrupted are removed in any case. Returns whether this process is to delete the earlier run
    (`remove_previous_run`) once the new run's model and data are read: a run refused before then keeps it. The
    main process calls it holding the folder's lock, whose file does not count as an earlier run's."""
    folder = Path(output_dir)
    if should_save:
        clean_killed_saves(folder)
    own_folder = resume is not None and folder.resolve() == Path(resume).resolve().parent
    if own_folder and overwrite:
        raise ValueError(f"--overwrite-output-dir would delete {resume}, which --resume-from-checkpoint continues; "
                        "drop one of the two")
    if own_folder or not (folder.is_dir() and any(not p.name.startswith(LOCK_NAME) for p in folder.iterdir())):
        return False
    if not overwrite and not run_output_files(folder):
        theirs = sorted(p.name for p in folder.iterdir() if not p.name.startswith(LOCK_NAME))
        raise ValueError(f"output folder {folder} holds files no retromae run wrote ({', '.join(theirs[:3])}"
                        f"{' ...' if len(theirs) > 3 else ''}); choose another --output-dir, or pass "
                         "--overwrite-output-dir to write beside them (it deletes none of them)")
    if not overwrite:
        latest = last_complete_checkpoint(folder)
        done = finished_step(latest, 0) if latest else None  # 0: the checkpoint's own max_steps
        if done is not None:  # e.g. a second `make demo`: resuming would only re-export
            hint = f"that run finished at step {done} ({latest.name}); choose another --output-dir"
        elif latest:
            hint = f"resume with --resume-from-checkpoint last (newest: {latest.name})"
        else:
            hint = "choose another --output-dir"
        raise ValueError(
            f"output folder {folder} already holds files from an earlier run; {hint}, or pass --overwrite-output-dir "
            "to start over (it deletes what a run writes there: model files, checkpoint-N/, encoder/; nothing else)"
        )
    _check_overwrite_inputs(folder, inputs or {})  # on every process, before any deletes
    return should_save


def _check_overwrite_inputs(folder: Path, inputs: Mapping[str, str | None]) -> None:
    """Refuse an --overwrite-output-dir that would delete one of `inputs`: one that is the output folder itself (a
    model saved there) or lies in one of the earlier run's files and folders that it removes."""
    itself = next(((what, Path(path)) for what, path in inputs.items()
                   if path and Path(path).exists() and Path(path).resolve() == folder.resolve()), None)
    hit = itself or next(filter(None, (would_delete(entry, inputs) for entry in run_output_files(folder))), None)
    if hit is not None:
        raise ValueError(f"--overwrite-output-dir would delete {hit[0]} ({hit[1]}), which this run reads; choose "
                        f"another --output-dir, or copy it out of {folder} first")


__all__ = [
    "RESUME_LAST", "RUN_INFO_NAME", "check_no_checkpoint_collision", "check_replaceable", "checkpoint_to_resume",
    "claim_checkpoints", "clean_killed_saves", "finished_step", "last_complete_checkpoint", "list_checkpoints",
    "prepare_output_dir", "remove_previous_run", "resume_state_problem", "resume_target", "run_output_files",
]
