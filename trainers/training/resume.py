"""What `retromae pretrain --resume-from-checkpoint` restores: the settings of the run that wrote the checkpoint.

Every `checkpoint-N` holds `retromae_resume.json`: the run's id and the value of every `retromae pretrain` option as
that run parsed it (flags, `--config` file, demo defaults). It is read only here, when resuming. It may hold local
paths (model, corpus, tokenizer, pairs, output folders, made absolute) and is therefore kept apart from
`retromae_run.json`, which feeds the model card and must stay free of them; the exporter never copies it, and the
final save at the output root does not write it. Secrets (`--hub-token`) are never recorded.

On resume the recorded values are the defaults, so `--output-dir X --resume-from-checkpoint last` alone continues
the same run. A flag given again with the recorded value is fine; one that changes what is trained (model, corpus,
method and its options, lengths, batch, steps, schedule, seed, ...) is refused with one line. Options in
`MAY_CHANGE` (where and how often the run logs and saves, the device, precision, workers, export) may change.
The size and modification time of every corpus / pairs file are recorded too, and of the validation folder's files
for a run that keeps its best checkpoint: a run whose files changed size since is not resumed (a modification of the
same size is a warning).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from ..inputs.io import read_json_or_empty

logger = logging.getLogger(__name__)

RESUME_FILE = "retromae_resume.json"
FORMAT_VERSION = 1

# Never recorded: how this invocation starts, not what the run is (and a secret).
NOT_RECORDED = frozenset({
    "help", "resume_from_checkpoint", "overwrite_output_dir", "overwrite_export", "local_rank", "hub_token",
})
# Options naming local files or folders: recorded as absolute paths (inputs when they exist; outputs always, as
# they may not exist yet), compared as resolved paths.
OUTPUT_OPTIONS = frozenset({"output_dir", "export_dir", "logging_dir"})
PATH_OPTIONS = frozenset({"model", "tokenizer", "corpus", "pairs", "eval_beir_folder"}) | OUTPUT_OPTIONS
# Options a resumed run may set to another value: reporting, saving, device, precision, workers and the export.
MAY_CHANGE = frozenset({
    "output_dir", "export_dir", "no_export", "corpus_name", "base_model_name",
    "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
    "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "report_to", "run_name",
    "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "eval_on_start",
    "save_strategy", "save_steps", "save_on_each_node", "save_total_limit", "save_only_model", "enable_jit_checkpoint",
    "push_to_hub", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "use_cpu", "bf16", "fp16", "tf32", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "activation_checkpointing", "activation_checkpointing_kwargs", "torch_compile",
    "compile_layers", "compile_loss", "pad_loss_vocab", "loss_kernel", "stream_resume", "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps",
    "ddp_find_unused_parameters",
    "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "ddp_static_graph", "ddp_backend", "ddp_timeout",
    "accelerator_config", "debug", "skip_memory_metrics", "attn_implementation",
    "eval_beir_folder", "eval_split", "eval_max_queries", "eval_coverage",
})
BEST_MODEL_DATA = frozenset({"eval_beir_folder", "eval_split", "eval_max_queries"})


# The training text: a resumed run must read what the run read (its data order is replayed), so its files' sizes and
# modification times are recorded (cheap: no reading) and compared; so are the validation data's of a run that
# keeps its best checkpoint (its scores are compared with the recorded best's). Option -> what a change would do.
TEXT_OPTIONS = {"corpus": "it would continue on other text", "pairs": "it would continue on other text"}
BEST_MODEL_FILES = {"eval_beir_folder": "its scores would be compared with the recorded best's, from other data"}


def new_run_id() -> str:
    return uuid.uuid4().hex


def record_settings(values: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The content of `retromae_resume.json` for a run whose parsed options are `values` (option name -> value)."""
    settings = {}
    for name, value in values.items():
        if name in NOT_RECORDED or not _json_safe(value):
            continue
        if name in PATH_OPTIONS and isinstance(value, str) and (name in OUTPUT_OPTIONS or os.path.exists(value)):
            value = os.path.abspath(value)
        settings[name] = value
    return {"format": FORMAT_VERSION, "run_id": run_id, "settings": settings, "text_files": text_file_stamps(values)}


def text_file_stamps(values: dict[str, Any]) -> dict[str, dict[str, list[int]]]:
    """For each local training-text option in `values` (`TEXT_OPTIONS`): `[size, mtime_ns]` of its file, or of
    every file below its folder (hidden ones skipped, as the corpus reader does), by path relative to it."""
    stamps = {}
    for name in _stamped(values):
        value = values.get(name)
        if not isinstance(value, str) or not os.path.exists(value):  # unset, the built-in corpus or a Hub name
            continue
        root = Path(value)
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )
        stamps[name] = {file.relative_to(root).as_posix(): [file.stat().st_size, file.stat().st_mtime_ns]
                        for file in files}
    return stamps


def _stamped(values: dict[str, Any]) -> dict[str, str]:
    """The options whose files a run records (`TEXT_OPTIONS`, and `BEST_MODEL_FILES` when it keeps its best)."""
    return {**TEXT_OPTIONS, **(BEST_MODEL_FILES if values.get("metric_for_best_model") else {})}


def check_text_unchanged(recorded: dict[str, Any], checkpoint: str) -> None:
    """Refuse resuming when a training-text file the run recorded changed size, went or came (the run would continue
    on other text); a file of the same size modified since is a warning (touched or copied, or edited in place). A
    checkpoint that recorded none (an older retromae) passes."""
    before = recorded.get("text_files")
    if not isinstance(before, dict):
        return
    now = text_file_stamps(recorded["settings"])
    consequences = _stamped(recorded["settings"])
    for name, files in before.items():
        current, flag = now.get(name, {}), "--" + name.replace("_", "-")
        for file in sorted(files.keys() | current.keys()):
            old, new = files.get(file), current.get(file)
            if old == new:
                continue
            path = Path(recorded["settings"][name]) / file  # "." for a file: the file itself
            if old is not None and new is not None and old[0] == new[0]:
                logger.warning("%s file %s was modified since the run being resumed from %s started (same size); "
                               "if its content changed, %s", flag, path, checkpoint, consequences[name])
                continue
            change = "is gone" if new is None else "is new" if old is None else f"changed size ({old[0]} -> {new[0]} bytes)"
            raise ValueError(
                f"{flag} file {path} {change} since the run being resumed from {checkpoint} started; "
                f"{consequences[name]}: restore the file, or start a new run in another --output-dir (--model "
                "CHECKPOINT continues its weights)"
            )


def read_settings(checkpoint: str | os.PathLike) -> dict[str, Any] | None:
    """The checkpoint's recorded run (`run_id`, `settings`, `text_files`), or None for a checkpoint written without one."""
    recorded = read_json_or_empty(Path(checkpoint) / RESUME_FILE)
    return recorded if isinstance(recorded.get("settings"), dict) else None


def run_id_of(checkpoint: str | os.PathLike) -> str | None:
    recorded = read_settings(checkpoint)
    return recorded.get("run_id") if recorded else None


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """The options `argv` sets itself (defaults excluded), parsed and typed as the parser would.

    `parser` must be a fresh one (no `set_defaults`): every default is suppressed for this parse."""
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    namespace, _ = parser.parse_known_args(argv)
    return vars(namespace)


def check_given_options(recorded: dict[str, Any], given: dict[str, Any], checkpoint: str) -> None:
    """Refuse the first given option that contradicts the recorded run; options in `MAY_CHANGE` may differ, but
    not the validation data of a run that keeps its best checkpoint (its scores would be compared across sets)."""
    saved = recorded["settings"]
    may_change = MAY_CHANGE - BEST_MODEL_DATA if saved.get("metric_for_best_model") else MAY_CHANGE
    for name, value in given.items():
        if name in may_change or name in NOT_RECORDED or name not in saved or _same(name, value, saved[name]):
            continue
        flag = "--" + name.replace("_", "-")
        raise ValueError(
            f"{flag} {_show(value)} contradicts the run being resumed from {checkpoint}, which used {flag} "
            f"{_show(saved[name])}; drop {flag} to continue that run with its own settings, or start a new run in "
            "another --output-dir (--model CHECKPOINT continues its weights)"
        )


def launch_command(command: str, world_size: int, local_world_size: int | None = None) -> str:
    """How `retromae COMMAND` is started on `world_size` processes (`local_world_size` per machine, default all on
    one): the command itself for 1, torchrun's form for more."""
    if world_size <= 1:
        return f"retromae {command}"
    per_node = local_world_size or world_size
    nodes = f"--nnodes {world_size // per_node} " if per_node != world_size else ""
    return f"torchrun {nodes}--nproc_per_node {per_node} -m retromae.trainers.cli {command}"


def check_same_processes(recorded: dict[str, Any], world_size: int, checkpoint: str) -> None:
    """Refuse to resume on another number of processes than the checkpoint's run trained on (`world_size` in its
    record; older records hold none): the global batch, the data each process reads and its random state would
    change, so the run would no longer be the one resumed."""
    saved = recorded.get("world_size")
    if not isinstance(saved, int) or saved == world_size:
        return
    raise ValueError(
        f"{checkpoint} was trained on {saved} process{'es' if saved > 1 else ''} and this run has {world_size}: "
        "the global batch, data order and random state depend on it; resume as the run was launched "
        f"({launch_command('pretrain', saved)} ...), or start a new run in another --output-dir "
        "(--model CHECKPOINT continues its weights)"
    )


@contextmanager
def seeded_rng(seed: int, device: torch.device, n_gpu: int = 1) -> Iterator[None]:
    """torch's global RNG seeded with `seed` inside, and as it was after (`torch.random.fork_rng`): a draw there
    (e.g. an evaluation's) repeats, and leaves the random stream of what follows, which a resume restores from the
    checkpoint, as it was. Forks the CPU's generator and `device`'s (all `n_gpu` of a DataParallel run) where torch
    has a module with RNG states for its type (cuda, mps, xpu, ...)."""
    forked = device.type != "cpu" and hasattr(getattr(torch, device.type, None), "get_rng_state")
    devices = (list(range(n_gpu)) if n_gpu > 1 else [device]) if forked else []
    with torch.random.fork_rng(devices, device_type=device.type if forked else "cpu"):
        torch.manual_seed(seed)
        yield


def _same(name: str, given: Any, saved: Any) -> bool:
    if given == saved:
        return True
    if name in PATH_OPTIONS and isinstance(given, str) and isinstance(saved, str) and os.path.exists(given):
        return os.path.realpath(given) == os.path.realpath(saved)
    if isinstance(given, str) or isinstance(saved, str):
        return _loose(given) == _loose(saved)  # e.g. a YAML "1e-4" (a string to PyYAML) against 0.0001
    return False


def _loose(value: Any) -> Any:
    text = str(value).strip().lower()
    if text in {"true", "false"}:
        return text == "true"
    try:
        return float(text)
    except ValueError:
        return text


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


__all__ = [
    "MAY_CHANGE", "RESUME_FILE", "TEXT_OPTIONS", "check_given_options", "check_same_processes", "check_text_unchanged",
    "given_options", "launch_command", "new_run_id", "read_settings", "record_settings", "run_id_of", "seeded_rng",
    "text_file_stamps",
]
