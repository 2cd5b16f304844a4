"""The trainer of a fine-tuning stage, and its batches drawn for all processes at once: where in-batch negatives are
gathered from every process, the batch that must hold no duplicate text (`--batch-sampler no_duplicates`) is the
global one, not each process's."""

from __future__ import annotations

from collections.abc import Iterator

from sentence_transformers import SentenceTransformerTrainer
from torch.utils.data import BatchSampler

from .atomic_checkpoints import AtomicCheckpoints


class GlobalBatchShares(BatchSampler):
    """Each batch of `global_sampler` (drawn at `processes` times the per-process size) as `processes` consecutive
    shares of near-equal size, in rank order: accelerate hands process r every `processes`-th batch from the r-th,
    so process r trains share r of each global batch. A global batch with fewer rows than processes is dropped.

    `batch_size` and `drop_last` are the per-process ones accelerate reads; `set_epoch` reaches `global_sampler`.
    """

    def __init__(self, global_sampler: BatchSampler, processes: int):  # BatchSampler's would want an index sampler
        self.global_sampler = global_sampler
        self.processes = processes
        self.batch_size = global_sampler.batch_size // processes
        self.drop_last = global_sampler.drop_last

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.global_sampler:
            if len(batch) < self.processes:
                continue
            share, extra = divmod(len(batch), self.processes)
            start = 0
            for rank in range(self.processes):
                end = start + share + (rank < extra)
                yield batch[start:end]
                start = end

    def __len__(self) -> int:
        return len(self.global_sampler) * self.processes

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.global_sampler, "set_epoch"):
            self.global_sampler.set_epoch(epoch)


class StageTrainer(AtomicCheckpoints, SentenceTransformerTrainer):
    """The trainer of a fine-tuning stage: sentence-transformers' own, with checkpoints that appear only complete.
    Where the loss gathers in-batch negatives from every process, the batch sampler draws the global batch and each
    process trains its share (`GlobalBatchShares`): `no_duplicates` then keeps duplicates out of the batch that
    scores them."""

    def get_batch_sampler(self, dataset, batch_size, *args, **kwargs):
        gathers = any(getattr(module, "gather_across_devices", False) for module in self.loss.modules())
        processes = self.args.world_size if gathers else 1
        if processes == 1:
            return super().get_batch_sampler(dataset, batch_size, *args, **kwargs)
        sampler = super().get_batch_sampler(dataset, batch_size * processes, *args, **kwargs)
        return None if sampler is None else GlobalBatchShares(sampler, processes)
