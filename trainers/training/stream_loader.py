"""Streamed training data: under DDP, a DataLoader per process over its own part of the stream; in one process, the
stream's position saved in each checkpoint, so that a resumed run continues there instead of replaying the stream."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import datasets
import torch
from accelerate.data_loader import prepare_data_loader
from transformers import TrainerCallback

from ..data.tokenize import rank_stream

logger = logging.getLogger(__name__)

STREAM_STATE_FILE = "stream_state_{rank}.pt"


def rank_stream_loader(trainer: Any) -> Any:
    """The training DataLoader of a `Trainer` whose train dataset is a stream, under DDP: each process reads its own
    shards (or, with fewer shards than processes, keeps its own share of the rows) of `rank_stream`, prepared by
    accelerate as one process (`dispatch_batches=False`: the stream is split already)."""
    args, dataset = trainer.args, trainer.train_dataset
    whole_shards = dataset.num_shards % args.world_size == 0
    logger.info("Streaming on %d processes: process %d reads its own part of the stream (%s)", args.world_size,
                args.process_index, f"{dataset.num_shards // args.world_size} of its {dataset.num_shards} shards"
                if whole_shards else f"every {args.world_size}th row of its {dataset.num_shards} shard(s)")
    loader = torch.utils.data.DataLoader(
        rank_stream(dataset, args.process_index, args.world_size), batch_size=trainer._train_batch_size,
        collate_fn=trainer._get_collator_with_removed_columns(trainer.data_collator, description="Training"),
        num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
        persistent_workers=args.dataloader_persistent_workers,
        multiprocessing_context=args.dataloader_multiprocessing_context,
        prefetch_factor=args.dataloader_prefetch_factor, in_order=args.dataloader_in_order,
        drop_last=args.dataloader_drop_last,
    )
    accelerator = trainer.accelerator
    prepared = prepare_data_loader(  # as Accelerator.prepare, but as one process: the stream is split already
        loader, accelerator.device, num_processes=1, process_index=0, put_on_device=accelerator.device_placement,
        rng_types=accelerator.rng_types.copy(), dispatch_batches=False, non_blocking=accelerator.non_blocking,
        use_stateful_dataloader=accelerator.use_stateful_dataloader,
    )
    accelerator._dataloaders.append(prepared)
    return prepared


def keep_stream_position(args: Any, dataset: Any) -> bool:
    """Whether a run on `dataset` records its stream position in its checkpoints (and resumes from it): a stream
    (`datasets.IterableDataset`) in one process, with `stream_resume` "state" (the default) and torchdata's stateful
    DataLoader installed (the trainer then turns it on in its accelerator). Under DDP (accelerate corrects a stateful
    loader's position for batches dispatched from one process, which ours are not) and with
    `stream_resume="replay"`, a resumed run replays the stream as the Trainer does."""
    if not isinstance(dataset, datasets.IterableDataset) or getattr(args, "stream_resume", "state") != "state":
        return False
    if args.world_size > 1:
        return False
    if importlib.util.find_spec("torchdata") is None:
        logger.warning("torchdata is not installed: a resumed streamed run replays the stream up to its checkpoint "
                       "(pip install torchdata continues from the checkpoint's position instead)")
        return False
    return True


def stream_pass_position(epoch: float, max_steps: int, accumulation_steps: int) -> tuple[int, int]:
    """Where the checkpoint of a streamed run stands, from its Trainer state's `epoch` and `max_steps`: the passes over
    the stream it completed and the batches it read of the current one. The Trainer counts a stream's epochs by
    passes (each ends when the stream does; its `epoch` is the pass plus batches / (max_steps * accumulation_steps)),
    but resumes it from epoch `global_step // max_steps`, always 0: the stream's first pass, not the checkpoint's."""
    passes = int(epoch)
    return passes, round((epoch - passes) * max_steps * accumulation_steps)


def pass_ended(position: dict[str, Any] | None) -> bool:
    """Whether a saved stream `position` is the end of its pass: the unbroken run went on with the next pass."""
    return bool(position and position.get("_iterator_finished"))


class ResumedPassEpoch(TrainerCallback):
    """A stream resumed at its saved position skips no batch, so the Trainer counts the resumed pass's batches from 0:
    `epoch` (logged, and saved in each checkpoint) adds the `batches` the checkpoint had read of pass `pass_index`,
    as the unbroken run counts them."""

    def __init__(self, pass_index: int, batches: int) -> None:
        self.pass_index, self.batches = pass_index, batches

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.epoch is None or int(state.epoch) != self.pass_index:
            return
        in_pass = args.gradient_accumulation_steps * state.max_steps  # the Trainer's batches a pass of a stream
        counted = round((state.epoch - self.pass_index) * in_pass)
        state.epoch = self.pass_index + (counted + self.batches) / in_pass  # as the Trainer computes it


def save_stream_position(loader: Any, folder: Path, rank: int) -> None:
    """Writes `loader`'s position in the stream (its state_dict) into checkpoint `folder`."""
    torch.save(loader.state_dict(), folder / STREAM_STATE_FILE.format(rank=rank))


def saved_stream_position(checkpoint: str | Path, rank: int) -> dict[str, Any] | None:
    """The stream position saved in `checkpoint` for process `rank`, or None (a checkpoint of a replaying run)."""
    path = Path(checkpoint) / STREAM_STATE_FILE.format(rank=rank)
    if not path.is_file():
        return None
    return torch.load(path, weights_only=True)


__all__ = ["STREAM_STATE_FILE", "ResumedPassEpoch", "keep_stream_position", "pass_ended", "rank_stream_loader", "save_stream_position",
           "saved_stream_position", "stream_pass_position"]
