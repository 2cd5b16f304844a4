"""Masking randomness under the Trainer: fresh masks per batch, epoch and rank with DataLoader workers, exact resume,
repeatable evaluation, and a resume that unpickles nothing beyond `torch.load(weights_only=True)`."""

from __future__ import annotations

import pickle
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.data.collator import PretrainingCollator, masking_generator
from retromae.trainers.data.token_rows import ArrowRows
from retromae.trainers.data.tokenize import tokenize_corpus
from retromae.trainers.training.trainer import RetroMAETrainer
from transformers import TrainerCallback, TrainingArguments

from ..builders import tiny_bert_kwargs

SENTENCES = [
    "Dense retrieval encodes queries and passages into vectors and ranks passages by inner product.",
    "The masked auto-encoder reconstructs the original sentence from its embedding and a masked copy.",
    "Whole word masking hides every piece of a word at once, which makes the task harder.",
    "Sparse lexical representations weight vocabulary terms and are stored in inverted indexes.",
]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def same_rows(tokenizer) -> datasets.Dataset:
    """8 copies of one passage: any two batches with equal masks mean a repeated random stream."""
    text = " ".join(SENTENCES[:2])
    return tokenize_corpus(datasets.Dataset.from_dict({"text": [text] * 8}), tokenizer, max_seq_length=64)


@pytest.fixture(scope="module")
def rows(tokenizer) -> datasets.Dataset:
    return tokenize_corpus(datasets.Dataset.from_dict({"text": SENTENCES * 4}), tokenizer, max_seq_length=32)


def tiny_model() -> RetroMAEForPretraining:
    torch.manual_seed(0)
    return RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs()))


def training_args(output: Path, **overrides) -> TrainingArguments:
    settings = dict(
        output_dir=str(output), per_device_train_batch_size=2, num_train_epochs=2, learning_rate=1e-3,
        logging_steps=1, save_strategy="no", seed=7, report_to="none", use_cpu=True, disable_tqdm=True,
        remove_unused_columns=False, dataloader_num_workers=2,
    )
    settings.update(overrides)
    return TrainingArguments(**settings)


def make_trainer(tokenizer, dataset, args, **kwargs) -> RetroMAETrainer:
    # A collator with a generator of its own, as the CLI built it before: the trainer must not depend on it.
    collator = kwargs.pop("collator", None) or PretrainingCollator(tokenizer, generator=torch.Generator().manual_seed(7))
    return RetroMAETrainer(model=tiny_model(), args=args, train_dataset=dataset, data_collator=collator, **kwargs)


def record_masks(trainer: RetroMAETrainer) -> list[torch.Tensor]:
    """The encoder-masked positions of every batch the model sees, in order."""
    seen = []

    def hook(module, args, kwargs):
        seen.append(kwargs["encoder_labels"].ne(-100).cpu())

    trainer.model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_masks_differ_across_batches_and_epochs_with_workers(tokenizer, same_rows, tmp_path):
    trainer = make_trainer(tokenizer, same_rows, training_args(tmp_path))
    masks = record_masks(trainer)
    trainer.train()
    assert len(masks) == 8  # 2 epochs x 4 batches, 2 workers
    distinct = {tuple(mask.flatten().tolist()) for mask in masks}
    assert len(distinct) == 8, "every batch (both workers, both epochs) gets masks of its own"
    assert all(not torch.equal(mask[0], mask[1]) for mask in masks), "rows of one batch differ too"


def test_masks_differ_between_ranks(tokenizer, same_rows, tmp_path, monkeypatch):
    def masks_of_rank(rank: int) -> list[torch.Tensor]:
        monkeypatch.setattr(TrainingArguments, "process_index", property(lambda self: rank))
        args = training_args(tmp_path / f"rank{rank}", max_steps=2, dataloader_num_workers=0)
        trainer = make_trainer(tokenizer, same_rows, args, collator=PretrainingCollator(tokenizer))
        masks = record_masks(trainer)
        trainer.train()
        return masks

    first, second = masks_of_rank(0), masks_of_rank(1)
    assert len(first) == len(second) == 2
    assert all(not torch.equal(a, b) for a, b in zip(first, second, strict=True)), "each rank its own masks"


def test_masking_generator_separates_seed_rank_and_stream():
    seeds = {
        masking_generator(seed, rank, stream).initial_seed()
        for seed in (0, 1) for rank in (0, 1) for stream in ("train", "eval")
    }
    assert len(seeds) == 8  # seed 1 / rank 0 is not seed 0 / rank 1, as seed + rank was
    assert masking_generator(3, 1).initial_seed() == masking_generator(3, 1).initial_seed()


class StopAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def losses_by_step(trainer: RetroMAETrainer) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def test_resumed_run_with_workers_equals_uninterrupted_run(tokenizer, rows, tmp_path, monkeypatch):
    # 8 rows, batch 2, accumulation 2: 2 optimizer steps per epoch; the checkpoint at step 3 is inside epoch 2, so
    # the resumed run skips 2 batches (prefetched by the workers in the uninterrupted run) and goes on from there.
    rows = rows.select(range(8))

    def args(name: str) -> TrainingArguments:
        return training_args(tmp_path / name, gradient_accumulation_steps=2, max_steps=4, save_strategy="steps",
                             save_steps=3)

    full = make_trainer(tokenizer, rows, args("full"))
    full.train()
    killed = make_trainer(tokenizer, rows, args("killed"), callbacks=[StopAt(3)])
    killed.train()
    assert killed.state.global_step == 3 and (tmp_path / "killed" / "checkpoint-3").is_dir()
    resumed = make_trainer(tokenizer, rows, args("killed"))
    warned = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a: warned.append(message % a))
    resumed.train(resume_from_checkpoint=str(tmp_path / "killed" / "checkpoint-3"))
    assert not [m for m in warned if "missing keys" in m], "the tied head weights are not missing (HEAD: warned)"

    expected, got = losses_by_step(full), losses_by_step(resumed)
    assert sorted(got) == [1, 2, 3, 4] and all(got[step] == expected[step] for step in got), (expected, got)
    weights, resumed_weights = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(weights[name], resumed_weights[name]) for name in weights)


def test_evaluation_masks_repeat_and_leave_training_untouched(tokenizer, rows, tmp_path):
    trainer = make_trainer(tokenizer, rows, training_args(tmp_path, dataloader_num_workers=0), eval_dataset=rows)
    state = trainer._train_masking.get_state()
    masks = record_masks(trainer)
    trainer.evaluate()
    first = list(masks)
    trainer.evaluate()
    second = masks[len(first):]
    assert len(first) == len(second) == 2
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True)), "the same masks at every evaluation"
    assert torch.equal(trainer._train_masking.get_state(), state), "evaluation draws from its own generator"


def test_resume_loads_pickles_only_with_weights_only(tokenizer, rows, tmp_path, monkeypatch):
    run = tmp_path / "run"
    args = training_args(run, max_steps=2, save_strategy="steps", save_steps=1, dataloader_num_workers=0)
    make_trainer(tokenizer, rows, args).train()
    loads = []
    original = torch.load

    def recording_load(file, *load_args, **load_kwargs):
        loads.append((Path(file).name, load_kwargs.get("weights_only")))
        return original(file, *load_args, **load_kwargs)

    def no_plain_pickle(*args, **kwargs):
        raise AssertionError("a resume must not call pickle.load / pickle.loads")

    monkeypatch.setattr(torch, "load", recording_load)
    monkeypatch.setattr(pickle, "load", no_plain_pickle)
    monkeypatch.setattr(pickle, "loads", no_plain_pickle)
    resumed = make_trainer(tokenizer, rows, training_args(run, max_steps=2, dataloader_num_workers=0))
    resumed.train(resume_from_checkpoint=str(run / "checkpoint-1"))
    assert resumed.state.global_step == 2
    # Exactly the Trainer's own three files, each through PyTorch's restricted unpickler; training_args.bin unread.
    assert sorted(loads) == [("optimizer.pt", True), ("rng_state.pth", True), ("scheduler.pt", True)]


def test_span_cuts_differ_across_batches_with_workers(tokenizer, same_rows, tmp_path):
    """SentMAE's span positives are cut in the training process too: workers only pad the passages."""
    from retromae.trainers.data.pairs import ContrastiveCollator

    collator = ContrastiveCollator(tokenizer, generator=torch.Generator().manual_seed(7))
    trainer = make_trainer(tokenizer, same_rows, training_args(tmp_path), collator=collator)
    batches = [trainer._mask_inputs(batch, trainer._train_masking) for batch in trainer.get_train_dataloader()]
    assert len(batches) == 4 and all("positive_input_ids" in batch for batch in batches)
    cuts = {tuple(batch[key].flatten().tolist()) for batch in batches for key in ("input_ids", "positive_input_ids")}
    assert len(cuts) == 8, "spans (and masks) of their own for every batch, anchors and positives apart"


def test_a_trainer_without_a_collator_names_the_one_to_pass(tokenizer, rows, tmp_path):
    """HEAD trained with the Trainer's padding collator, masked nothing and failed in transformers on a None loss."""

    with pytest.raises(ValueError, match=r"needs data_collator=PretrainingCollator\(tokenizer, mask_ratio=\.\.\.\)"):
        RetroMAETrainer(model=tiny_model(), args=training_args(tmp_path), train_dataset=rows,
                        processing_class=tokenizer)


def test_the_loader_reads_arrow_batches_and_leaves_the_dataset_as_given(tokenizer, rows, tmp_path):
    """The trainer's DataLoader reads a batch's rows in one Arrow take (`ArrowRows`), giving the same batches as
    the rows one by one, while `train_dataset` keeps the format it was given."""
    trainer = make_trainer(tokenizer, rows, training_args(tmp_path, dataloader_num_workers=0))
    loader = trainer.get_train_dataloader()
    assert isinstance(loader.dataset, ArrowRows) and trainer.train_dataset.format["type"] is None
    ordered = [trainer.masking_collator.pad(list(rows.select(range(i, i + 2)))) for i in range(0, len(rows), 2)]
    sequential = torch.utils.data.DataLoader(loader.dataset, batch_size=2, collate_fn=trainer.data_collator)
    for expected, batch in zip(ordered, sequential, strict=True):
        assert all(torch.equal(expected[key], batch[key]) for key in expected)
