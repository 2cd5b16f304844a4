"""`RetroMAETrainer` driven from Python, as README's "Python" section does (no `retromae pretrain` around it): the
output folder is guarded as the command line guards it, a resume continues its run (run id, rotation, `last`),
refusals name the Python arguments, and `evaluate()` repeats (probe 73: B-001, B-002, B-007, B-008)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pytest
import torch
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.data.collator import PretrainingCollator
from retromae.trainers.data.tokenize import tokenize_corpus
from retromae.trainers.training import run_folder
from retromae.trainers.training.resume import RESUME_FILE, run_id_of
from retromae.trainers.training.trainer import RetroMAETrainer
from transformers import TrainerCallback, TrainingArguments

from ..builders import SENTENCES, tiny_bert_kwargs

pytestmark = pytest.mark.usefixtures("datasets_cache", "one_torch_thread")


@pytest.fixture(scope="module")
def rows(tokenizer) -> datasets.Dataset:
    return tokenize_corpus(datasets.Dataset.from_dict({"text": SENTENCES * 2}), tokenizer, max_seq_length=32)


def training_args(output: Path, **overrides) -> TrainingArguments:
    settings = dict(output_dir=str(output), per_device_train_batch_size=2, max_steps=2, save_steps=2, learning_rate=1e-3,
                    logging_steps=1, seed=7, report_to="none", use_cpu=True, disable_tqdm=True)
    return TrainingArguments(**{**settings, **overrides})


def make_trainer(tokenizer, rows, args: TrainingArguments, **kwargs) -> RetroMAETrainer:
    torch.manual_seed(0)
    model = RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs()))
    return RetroMAETrainer(model=model, args=args, train_dataset=rows, data_collator=PretrainingCollator(tokenizer),
                           processing_class=tokenizer, **kwargs)


@pytest.fixture(scope="module")
def first_run(tokenizer, rows, tmp_path_factory) -> Path:
    """A finished 2-step run from Python: its output folder holds checkpoint-2."""
    out = tmp_path_factory.mktemp("first") / "run"
    make_trainer(tokenizer, rows, training_args(out)).train()
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def checkpoint_files(checkpoint: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(checkpoint.iterdir())}


def checkpoint_names(out: Path) -> list[str]:
    return sorted(path.name for path in out.glob("checkpoint-*"))


# ---- B-001: a new run never replaces another run's checkpoint ------------------------------------------------------


def test_a_new_run_into_a_folder_with_another_runs_checkpoint_is_refused_before_training(tokenizer, rows, first_run,
                                                                                        tmp_path):
    """HEAD: the second run's checkpoint-2 silently replaced the first run's (other weights, other run id)."""
    out = copy_of(first_run, tmp_path)
    before = checkpoint_files(out / "checkpoint-2")
    second = make_trainer(tokenizer, rows, training_args(out, seed=8))
    with pytest.raises(ValueError) as refused:
        second.train()
    assert str(refused.value) == (
        f"output_dir {out} holds checkpoints of another run (checkpoint-2), which this run's saves could replace; "
        "continue that run with train(resume_from_checkpoint=True) (--resume-from-checkpoint last), or choose another "
        "output_dir, or delete those checkpoints")
    assert second.state.global_step == 0, "refused before training"
    assert checkpoint_files(out / "checkpoint-2") == before


def test_a_new_run_whose_saves_replace_nothing_may_share_the_folder(tokenizer, rows, first_run, tmp_path):
    """A run that saves no checkpoint, or none up to the other run's, replaces nothing: it is not refused."""
    out = copy_of(first_run, tmp_path)
    make_trainer(tokenizer, rows, training_args(out, max_steps=1, save_steps=1)).train()
    make_trainer(tokenizer, rows, training_args(out, save_strategy="no", seed=8)).train()
    assert checkpoint_names(out) == ["checkpoint-1", "checkpoint-2"]


def test_a_checkpoint_save_never_replaces_another_runs_checkpoint(tokenizer, rows, first_run, tmp_path, monkeypatch):
    """The guard behind the refusal above, for a run that got past it (here: the check is skipped)."""
    out = copy_of(first_run, tmp_path)
    before = checkpoint_files(out / "checkpoint-2")
    monkeypatch.setattr(run_folder, "check_no_checkpoint_collision", lambda *args: None)
    with pytest.raises(ValueError) as refused:
        make_trainer(tokenizer, rows, training_args(out, seed=8)).train()
    assert str(refused.value).startswith(f"{out / 'checkpoint-2'} holds a checkpoint of another run "
                                         f"({run_id_of(out / 'checkpoint-2')}), which this save would replace; "
                                         "nothing was saved")
    assert checkpoint_files(out / "checkpoint-2") == before
    assert [path.name for path in out.iterdir() if path.name.startswith(".")] == [], "no build folder left"


# ---- B-002: a resume from Python continues its run --------------------------------------------------------------


class CrashAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"crash at step {self.step}")


def test_resuming_twice_with_true_continues_one_run_bit_identically(tokenizer, rows, tmp_path):
    """HEAD: the first resume took a fresh run id, so checkpoint-2 was never rotated away (save_total_limit=1) and the
    second `resume_from_checkpoint=True` was refused ("holds checkpoints of 2 runs")."""
    def args(out: Path) -> TrainingArguments:
        return training_args(out, max_steps=6, save_steps=2, save_total_limit=1)

    full = make_trainer(tokenizer, rows, args(tmp_path / "full"))
    full.train()
    out = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="crash at step 3"):
        make_trainer(tokenizer, rows, args(out), callbacks=[CrashAt(3)]).train()
    run_id = run_id_of(out / "checkpoint-2")
    with pytest.raises(RuntimeError, match="crash at step 5"):
        make_trainer(tokenizer, rows, args(out), callbacks=[CrashAt(5)]).train(resume_from_checkpoint=True)
    assert checkpoint_names(out) == ["checkpoint-4"] and run_id_of(out / "checkpoint-4") == run_id
    resumed = make_trainer(tokenizer, rows, args(out))
    resumed.train(resume_from_checkpoint=True)
    assert checkpoint_names(out) == ["checkpoint-6"] and run_id_of(out / "checkpoint-6") == run_id
    weights, resumed_weights = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(weights[name], resumed_weights[name]) for name in weights)


def test_resuming_keeps_the_run_settings_given(tokenizer, rows, first_run, tmp_path):
    """Settings passed by the caller (the command line passes the run's own) are what the checkpoints record."""
    out = copy_of(first_run, tmp_path)
    given = {"format": 1, "run_id": run_id_of(out / "checkpoint-2"), "settings": {"seed": 7}, "text_files": {}}
    trainer = make_trainer(tokenizer, rows, training_args(out, max_steps=4), run_settings=given)
    trainer.train(resume_from_checkpoint=True)
    assert json.loads((out / "checkpoint-4" / RESUME_FILE).read_text())["settings"] == {"seed": 7}


# ---- B-007: refusals name the Python arguments -------------------------------------------------------------------


def test_fp16_on_the_cpu_names_the_python_argument(tokenizer, rows, tmp_path):
    """HEAD: "... pass --fp16 false (a preset may set it), or --bf16 true --use-cpu true ..." only."""
    with pytest.raises(ValueError) as refused:
        make_trainer(tokenizer, rows, training_args(tmp_path, fp16=True))
    message = str(refused.value)
    assert "pass --fp16 false (Python: fp16=False; a preset may set it)" in message, message
    assert "(Python: bf16=True, use_cpu=True)" in message and "\n" not in message


def test_resume_true_over_two_runs_names_the_python_argument(tokenizer, rows, first_run, tmp_path):
    """HEAD: "--resume-from-checkpoint last: ... e.g. --resume-from-checkpoint ..." only."""
    out = copy_of(first_run, tmp_path)
    other = Path(shutil.copytree(out / "checkpoint-2", out / "checkpoint-4"))
    record = json.loads((other / RESUME_FILE).read_text())
    (other / RESUME_FILE).write_text(json.dumps({**record, "run_id": "another-run"}))
    with pytest.raises(ValueError) as refused:
        make_trainer(tokenizer, rows, training_args(out, max_steps=4)).train(resume_from_checkpoint=True)
    message = str(refused.value)
    assert message.startswith(f"--resume-from-checkpoint last (Python: resume_from_checkpoint=True): {out} holds "
                              "checkpoints of 2 runs"), message
    assert message.endswith(f"e.g. --resume-from-checkpoint {other} (Python: resume_from_checkpoint='{other}')")


# ---- B-008: evaluations repeat ----------------------------------------------------------------------------------


def test_evaluate_repeats_and_leaves_the_global_rng_as_it_was(tokenizer, rows, tmp_path):
    """HEAD: the decoder's visibility drew from torch's global RNG, so each call gave another eval_loss (and moved
    training's random stream on)."""
    trainer = make_trainer(tokenizer, rows, training_args(tmp_path), eval_dataset=rows)
    state = torch.get_rng_state()
    first, second = trainer.evaluate()["eval_loss"], trainer.evaluate()["eval_loss"]
    assert first == second
    assert torch.equal(torch.get_rng_state(), state), "training after an evaluation draws what it would without"
