"""Resuming restores the run's recorded settings; saves are atomic; nothing of another run is deleted."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from retromae.trainers.cli import main
from retromae.trainers.commands import pretrain as pretrain_command
from retromae.trainers.training.lock import LOCK_NAME

README = Path(__file__).resolve().parents[2] / "README.md"
README_RESUME_LINE = "retromae pretrain --output-dir out/retromae --resume-from-checkpoint last"
WORDS = ["retrieval", "encoder", "decoder", "masked", "passage", "query", "vector", "index", "sparse", "dense",
         "token", "corpus"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Not the built-in corpus: 60 passages of 12 words."""
    path = tmp_path_factory.mktemp("corpus") / "my-corpus.txt"
    lines = [" ".join(WORDS[(i + k) % len(WORDS)] for k in range(12)) for i in range(60)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_args(model: Path, corpus: Path, output: Path | str, *extra: str, steps: int = 24) -> list[str]:
    """Every setting off its default (corpus, length 32, batch 2, steps, seed 3)."""
    return ["pretrain", "--model", str(model), "--corpus", str(corpus), "--output-dir", str(output),
            "--max-seq-length", "32", "--per-device-train-batch-size", "2", "--max-steps", str(steps), "--save-steps", "4",
            "--save-total-limit", "2", "--logging-steps", "1", "--seed", "3", "--use-cpu", "true",
            "--disable-tqdm", "true", *extra]


def retromae_script() -> str:
    return str(Path(sys.executable).parent / "retromae")


@pytest.mark.long
def test_readme_resume_line_after_sigkill_restores_the_run(tiny_bert, corpus, tmp_path):
    assert README_RESUME_LINE in README.read_text(encoding="utf-8"), "the README's resume line changed"
    out = tmp_path / "out" / "retromae"
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen([retromae_script(), *run_args(tiny_bert, corpus, "out/retromae", "--no-export", "true")],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not (out / "checkpoint-4").is_dir():
        assert first.poll() is None, first.stderr.read().decode()[-2000:]
        assert time.time() < deadline, "no checkpoint written in time"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert not (out / "retromae_run.json").exists(), "killed before the end"
    assert (out / LOCK_NAME).is_file(), "a SIGKILL leaves the lock; the resume takes it over"
    # a checkpoint another run left in the folder: `last` is ambiguous, and rotation must not delete it
    foreign = out / "checkpoint-1"
    shutil.copytree(out / "checkpoint-4", foreign)
    resume_file = foreign / "retromae_resume.json"
    resume_file.write_text(json.dumps({**json.loads(resume_file.read_text()), "run_id": "another-run"}))
    refused = subprocess.run([retromae_script(), *shlex.split(README_RESUME_LINE)[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "holds checkpoints of 2 runs" in refused.stderr, refused.stderr[-3000:]
    assert "out/retromae/checkpoint-1 (run another-run)" in refused.stderr

    own = max(set(out.glob("checkpoint-*")) - {foreign}, key=lambda path: int(path.name.split("-")[1]))
    explicit = README_RESUME_LINE.replace(" last", f" {own.relative_to(tmp_path)}")
    resumed = subprocess.run([retromae_script(), *shlex.split(explicit)[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (out / LOCK_NAME).exists()
    info = json.loads((out / "retromae_run.json").read_text())
    assert info["global_step"] == 24 and info["max_seq_length"] == 32 and info["corpus"] == "my-corpus.txt"
    assert info["base_model"] == tiny_bert.name
    assert info["training"]["per_device_train_batch_size"] == 2 and info["training"]["seed"] == 3
    state = json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == 2 and state["max_steps"] == 24
    steps = [entry["step"] for entry in state["log_history"] if "loss" in entry]
    assert steps[:4] == [1, 2, 3, 4] and steps[-1] == 24, "history of the killed run is kept"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-20", "checkpoint-24"]
    assert not (out / "encoder").exists(), "--no-export true was restored too"


def test_resume_refuses_another_corpus_and_accepts_repeated_flags(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = run_args(tiny_bert, corpus, out, "--no-export", "true", steps=4)
    assert main(args) == 0
    capsys.readouterr()
    other = tmp_path / "other.txt"
    other.write_text("another corpus\n" * 20)
    resume = ["pretrain", "--output-dir", str(out), "--resume-from-checkpoint", "last"]
    for flag, value, saved in (("--corpus", str(other), str(corpus)), ("--max-seq-length", "64", "32"),
                               ("--method", "bow", "retromae"), ("--per-device-train-batch-size", "8", "2")):
        assert main([*resume, flag, value]) == 2
        err = capsys.readouterr().err.strip()
        assert f"{flag} {value} contradicts the run being resumed" in err and f"which used {flag} {saved}" in err
        assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (out / "checkpoint-4").is_dir(), "a refused resume deletes nothing"
    # the same values again (and a changed logging interval) are fine
    assert main([*resume, "--max-seq-length", "32", "--corpus", str(corpus), "--logging-steps", "5"]) == 0


def test_interrupted_checkpoint_save_leaves_no_checkpoint_and_a_kill_leftover_is_cleaned(
    tiny_bert, corpus, tmp_path, monkeypatch
):
    """A save that dies half-way leaves no `checkpoint-N` (it is built aside and renamed when complete); the build
    folder a SIGKILL would leave behind is removed by the next start."""
    from transformers import Trainer

    out = tmp_path / "run"
    calls = []
    save_rng_state = Trainer._save_rng_state

    def dies_at_second_save(self, output_dir):
        calls.append(output_dir)
        if len(calls) == 2:
            raise RuntimeError("killed while saving")
        save_rng_state(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_rng_state", dies_at_second_save)
    with pytest.raises(RuntimeError, match="killed while saving"):
        main(run_args(tiny_bert, corpus, out, "--no-export", "true", steps=8))
    monkeypatch.undo()
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-4"], "no half-written checkpoint-8, no build folder"

    killed_build = out / ".checkpoint-8.tmp-999999-0123abcd"  # what a SIGKILL mid-save leaves (pid long gone)
    killed_build.mkdir()
    (killed_build / "model.safetensors").write_bytes(b"half")
    (out / ".retromae-final").mkdir()
    assert main(["pretrain", "--output-dir", str(out), "--resume-from-checkpoint", "last"]) == 0
    assert not killed_build.exists() and not (out / ".retromae-final").exists()
    assert (out / "checkpoint-8" / "trainer_state.json").is_file() and (out / "config.json").is_file()


def test_final_save_replaces_the_previous_files_with_config_last(tmp_path, monkeypatch):
    from retromae.trainers.training.run_folder import install_files

    root, build = tmp_path / "out", tmp_path / "out" / ".retromae-final"
    build.mkdir(parents=True)
    for name, text in (("config.json", "old"), ("model-00001-of-00002.safetensors", "old shard"),
                       ("modeling_dupmae.py", "old code"), ("notes.txt", "mine")):
        (root / name).write_text(text)
    for name in ("config.json", "model.safetensors", "retromae_run.json"):
        (build / name).write_text("new")
    order, real_replace = [], os.replace

    def recording_replace(src, dst):
        order.append(Path(dst).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    install_files(build, root)
    monkeypatch.undo()
    assert sorted(p.name for p in root.iterdir()) == ["config.json", "model.safetensors", "notes.txt",
                                                      "retromae_run.json"]
    assert all((root / n).read_text() == "new" for n in ("config.json", "model.safetensors"))
    assert order[-1] == "config.json", "config.json arrives last: a root without it is refused by readers"


def test_resume_refuses_another_number_of_processes(tiny_bert, corpus, tmp_path, capsys):
    """HEAD recorded no process count: a 2-process run's checkpoint resumed in 1 process went on at half the global
    batch, its other process's random state unread, and its card then said world_size 1 for the whole run."""
    assert main(run_args(tiny_bert, corpus, tmp_path / "run", "--no-export", "true", steps=8)) == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "run" / "checkpoint-4", resumed / "checkpoint-4")
    record = resumed / "checkpoint-4" / "retromae_resume.json"
    settings = json.loads(record.read_text())
    assert settings["world_size"] == 1
    record.write_text(json.dumps({**settings, "world_size": 2}))  # as a torchrun run with 2 processes writes it
    capsys.readouterr()
    assert main(["pretrain", "--output-dir", str(resumed), "--resume-from-checkpoint", "last"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"retromae pretrain: error: {resumed / 'checkpoint-4'} was trained on 2 processes and this run has "
                   "1: the global batch, data order and random state depend on it; resume as the run was launched "
                   "(torchrun --nproc_per_node 2 -m retromae.trainers.cli pretrain ...), or start a new run in "
                   "another --output-dir (--model CHECKPOINT continues its weights)")
    assert not (resumed / "checkpoint-8").exists()


@pytest.mark.parametrize(("world", "local", "launch"), [
    (None, None, "retromae pretrain"),
    ("2", "2", "torchrun --nproc_per_node 2 -m retromae.trainers.cli pretrain"),
    ("8", "4", "torchrun --nnodes 2 --nproc_per_node 4 -m retromae.trainers.cli pretrain"),
])
def test_the_interrupted_line_resumes_with_the_launcher_of_the_run(world, local, launch, tmp_path, monkeypatch):
    """HEAD printed `retromae pretrain ...` on every rank of a torchrun run: run as printed, it went on in 1 process."""
    for name, value in (("WORLD_SIZE", world), ("LOCAL_WORLD_SIZE", local)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(pretrain_command, "last_complete_checkpoint", lambda folder: Path(folder) / "checkpoint-10")
    assert pretrain_command.resume_hint(str(tmp_path)) == (
        f"interrupted after checkpoint-10; resume with: {launch} --output-dir {tmp_path} --resume-from-checkpoint last")
