"""Streamed training data under DDP: a DataLoader per process over its own part of the stream."""

from __future__ import annotations

import logging
from typing import Any

import torch
from accelerate.data_loader import prepare_data_loader

from ..data.tokenize import rank_stream

logger = logging.getLogger(__name__)


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
