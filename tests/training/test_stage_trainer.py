"""Fine-tuning batches with in-batch negatives gathered from every process: the no-duplicates sampler keeps duplicate
text out of the global batch, which accelerate then shares among the processes."""

from __future__ import annotations

import datasets
import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from retromae.trainers.training.finetune_losses import contrastive_loss
from retromae.trainers.training.stage_trainer import GlobalBatchShares, StageTrainer
from sentence_transformers import SentenceTransformerTrainingArguments
from sentence_transformers.base.sampler import NoDuplicatesBatchSampler
from sentence_transformers.training_args import BatchSamplers
from transformers import TrainingArguments

PROCESSES, BATCH = 2, 4
# 16 queries, 8 documents: each document is the positive of two queries
PAIRS = datasets.Dataset.from_dict({"query": [f"query {i}" for i in range(16)],
                                    "positive": [f"document {i % 8}" for i in range(16)]})


def global_steps(batch_sampler) -> list[list[int]]:
    """The rows of each step of a 2-process run, both processes' batches together, as accelerate hands them out
    (each process iterates its own copy of the sampler: seeded, as the trainer's, they draw alike)."""
    shards = [list(BatchSamplerShard(batch_sampler, num_processes=PROCESSES, process_index=rank))
              for rank in range(PROCESSES)]
    assert len({len(shard) for shard in shards}) == 1
    return [sum(step, []) for step in zip(*shards, strict=True)]


def duplicated_documents(steps: list[list[int]]) -> int:
    return sum(len(step) - len({PAIRS[i]["positive"] for i in step}) for step in steps)


def test_the_shares_of_global_batches_hold_no_duplicate_across_processes():
    per_process = NoDuplicatesBatchSampler(PAIRS, batch_size=BATCH, drop_last=False, generator=torch.Generator(), seed=3)
    assert duplicated_documents(global_steps(per_process)) > 0  # what each process's own sampler gives
    shares = GlobalBatchShares(NoDuplicatesBatchSampler(PAIRS, batch_size=BATCH * PROCESSES, drop_last=False,
                                                        generator=torch.Generator(), seed=3), PROCESSES)
    steps = global_steps(shares)
    assert duplicated_documents(steps) == 0
    assert sorted(sum(steps, [])) == list(range(16))  # every row once per epoch
    assert len(shares) == len(list(shares)) and shares.batch_size == BATCH


def test_set_epoch_reaches_the_global_sampler():
    shares = GlobalBatchShares(NoDuplicatesBatchSampler(PAIRS, batch_size=8, drop_last=False,
                                                        generator=torch.Generator(), seed=3), PROCESSES)
    first = list(shares)
    shares.set_epoch(1)
    assert list(shares) != first


@pytest.mark.parametrize("gather", [True, False])
def test_the_stage_trainer_draws_global_batches_where_negatives_are_gathered(gather, spread_cls_bert, tmp_path,
                                                                             monkeypatch):
    """HEAD: each process drew its own no-duplicates batch, so under DDP two processes could train one document as
    the positive of their own query and, gathered, as a negative of the other's (probe 77 B-001)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(spread_cls_bert), device="cpu")
    args = SentenceTransformerTrainingArguments(str(tmp_path), use_cpu=True, report_to="none", seed=3,
                                                batch_sampler=BatchSamplers.NO_DUPLICATES)
    trainer = StageTrainer(model=model, args=args, train_dataset=PAIRS,
                           loss=contrastive_loss(model, None, gather_across_devices=gather))
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: PROCESSES))
    sampler = trainer.get_batch_sampler(PAIRS, BATCH, drop_last=False, generator=torch.Generator(), seed=3)
    if gather:
        assert isinstance(sampler, GlobalBatchShares) and duplicated_documents(global_steps(sampler)) == 0
    else:  # each process's batch is its own: nothing is gathered
        assert isinstance(sampler, NoDuplicatesBatchSampler) and sampler.batch_size == BATCH
