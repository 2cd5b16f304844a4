"""`retromae pretrain` never deletes what it must not: export targets, finished runs, concurrent runs, another run's
checkpoints, output paths that are files."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from retromae.trainers.cli import main
from retromae.trainers.commands import pretrain as pretrain_command
from retromae.trainers.inputs.pretrain_options import pretrain_arguments
from retromae.trainers.training import lock as lock_module
from retromae.trainers.training.lock import LOCK_NAME, folder_lock
from retromae.trainers.training.trainer import RetroMAETrainer
from safetensors.torch import load_file

from ..builders import SENTENCES, pretrain_args, write_beir, write_lines


@pytest.fixture(scope="module")
def finished_run(tiny_bert, corpus, tmp_path_factory) -> Path:
    """A finished 4-step run: checkpoint-2, checkpoint-4, the final save at the root and the export in encoder/."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(pretrain_args(tiny_bert, corpus, out)) == 0
    return out


def copy_of(run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run, tmp_path / "run"))


def resume(out: Path, checkpoint: str = "last") -> list[str]:
    return ["pretrain", "--output-dir", str(out), "--resume-from-checkpoint", checkpoint]


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def dead_pid() -> int:
    """The pid of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---- the export target ----------------------------------------------------------------------------------------------


def test_a_non_empty_export_dir_needs_overwrite_export(tiny_bert, corpus, tmp_path, capsys):
    target, out = tmp_path / "exported", tmp_path / "run"
    target.mkdir()
    # an earlier export; a folder of other files is kept even with the flag (test_pretrain_refusals.py)
    (target / "modules.json").write_text("[]")
    (target / "notes.txt").write_text("mine")
    assert main(pretrain_args(tiny_bert, corpus, out, "--export-dir", str(target))) == 2
    err = one_line(capsys)
    assert f"--export-dir {target} already exists and is not empty" in err and "--overwrite-export" in err
    assert (target / "notes.txt").read_text() == "mine" and not out.exists(), "refused before training"
    assert main(pretrain_args(tiny_bert, corpus, out, "--export-dir", str(target), "--overwrite-export", "true")) == 0
    assert (target / "modules.json").is_file() and not (target / "notes.txt").exists()
    assert not (out / "encoder").exists()


@pytest.mark.parametrize(
    ("where", "what"),
    [(".", "the working directory"), ("..", "the working directory"), ("out", "the output folder"),
     ("out/run", "the output folder"), ("out/run/checkpoint-4", "a checkpoint of this run"), ("data", "the corpus"),
     ("bert", "the model"), ("beir", "the --eval-beir-folder")],
)
def test_an_export_dir_over_the_run_or_its_inputs_is_refused_even_with_overwrite(
    tiny_bert, tmp_path, monkeypatch, capsys, where, what
):
    work = tmp_path / "work"
    (work / "data").mkdir(parents=True)
    corpus = write_lines(work / "data" / "corpus.txt", SENTENCES * 6)
    model = Path(shutil.copytree(tiny_bert, work / "bert"))
    beir = write_beir(work / "beir")
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    for overwrite in ("false", "true"):
        args = pretrain_args(model, corpus, work / "out" / "run", "--eval-beir-folder", str(beir), "--export-dir", where,
                             "--overwrite-export", overwrite)
        assert main(args if overwrite == "true" else args[:-2]) == 2
        err = one_line(capsys)
        assert f"would delete {what}" in err and "even with --overwrite-export" in err, err
        assert corpus.is_file() and (model / "config.json").is_file() and (work / "notes.txt").read_text() == "mine"
        assert (beir / "corpus.jsonl").is_file()
        assert not (work / "out").exists(), "refused before training"


def test_an_input_inside_the_default_export_dir_is_refused_with_a_fix_that_helps(tiny_bert, corpus, tmp_path, capsys):
    """HEAD suggested the very folder it refused: "choose another --export-dir, e.g. OUT/encoder (the default)"."""
    out = tmp_path / "run"
    beir = write_beir(out / "encoder" / "beir")
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(beir))) == 2
    assert one_line(capsys) == (
        f"retromae pretrain: error: the default --export-dir {out / 'encoder'}: replacing it would delete the "
        f"--eval-beir-folder ({beir}), even with --overwrite-export; move it out of that folder, or pass another "
        "--export-dir (or --no-export)")
    assert sorted(p.name for p in out.iterdir()) == ["encoder"] and (beir / "corpus.jsonl").is_file()


@pytest.mark.parametrize(("flag", "inside", "what"), [("--model", ".", "the model"), ("--model", "checkpoint-2", "the model"),
                                                     ("--corpus", "checkpoint-4/corpus.txt", "the corpus")])
def test_overwrite_output_dir_refuses_to_delete_an_input_in_the_output_dir(finished_run, tiny_bert, corpus, tmp_path,
                                                                          capsys, flag, inside, what):
    out = copy_of(finished_run, tmp_path)
    shutil.copy(corpus, out / "checkpoint-4" / "corpus.txt")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    args = pretrain_args(tiny_bert, corpus, out, flag, str(out / inside), "--overwrite-output-dir", "true")
    assert main(args) == 2
    err = one_line(capsys)
    assert f"--overwrite-output-dir would delete {what} ({out / inside})" in err, err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before, "refused before anything was deleted"


@pytest.mark.parametrize("flags", [["--corpus", "missing.jsonl"], ["--corpus", "bad.jsonl"], ["--method", "nosuch"],
                                   ["--model", "no-model"]])
def test_overwrite_output_dir_keeps_the_earlier_run_when_the_new_one_is_refused(flags, finished_run, tiny_bert, corpus,
                                                                                tmp_path, capsys):
    """HEAD deleted the finished run, then refused the mistyped input: the folder was left empty."""
    out = copy_of(finished_run, tmp_path)
    write_lines(tmp_path / "bad.jsonl", ['{"text": "a passage"}', '{"title": "no text"}'])
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    flags = [flags[0], str(tmp_path / flags[1]) if flags[0] != "--method" else flags[1]]
    assert main(pretrain_args(tiny_bert, corpus, out, *flags, "--overwrite-output-dir", "true")) == 2
    assert "error:" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_overwrite_output_dir_refuses_to_delete_the_config_file_it_reads(finished_run, tiny_bert, corpus, tmp_path,
                                                                         capsys):
    """HEAD deleted OUTPUT_DIR/config.json given as --config (a JSON config kept beside the run): the user's
    settings were replaced by the model's config."""
    out = copy_of(finished_run, tmp_path)
    config = out / "config.json"
    config.write_text(json.dumps({"max_steps": 4}))
    args = pretrain_args(tiny_bert, corpus, out, "--config", str(config), "--overwrite-output-dir", "true")
    assert main(args) == 2
    assert f"--overwrite-output-dir would delete the --config file ({config})" in one_line(capsys)
    assert json.loads(config.read_text()) == {"max_steps": 4}


# ---- a finished run -------------------------------------------------------------------------------------------------


def test_resuming_a_finished_run_trains_nothing_and_writes_only_what_is_missing(finished_run, tmp_path, capsys):
    out = copy_of(finished_run, tmp_path)
    shutil.rmtree(out / "encoder")
    (out / "config.json").unlink()  # as a kill during the final save leaves it
    assert main(resume(out)) == 0
    summary = capsys.readouterr().out
    assert f"had already finished at step 4 ({out / 'checkpoint-4'}); nothing was trained" in summary
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"], "no checkpoint-5"
    final, last = load_file(str(out / "model.safetensors")), load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert final.keys() == last.keys() and all(final[k].equal(last[k]) for k in final)
    assert json.loads((out / "retromae_run.json").read_text())["global_step"] == 4
    assert (out / "config.json").is_file() and (out / "encoder" / "modules.json").is_file()

    written = {p: p.stat().st_mtime_ns for p in (out / "model.safetensors", out / "encoder" / "modules.json")}
    assert main(resume(out)) == 0
    assert {p: p.stat().st_mtime_ns for p in written} == written, "nothing missing: nothing written"


def test_the_same_command_again_on_a_finished_run_says_it_finished(finished_run, tiny_bert, corpus, tmp_path, capsys):
    """What a second `make demo` meets: the command that finished, run again, stops in one line and writes nothing."""
    out = copy_of(finished_run, tmp_path)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(pretrain_args(tiny_bert, corpus, out)) == 2
    assert "that run finished at step 4 (checkpoint-4); choose another --output-dir" in one_line(capsys)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_resuming_after_the_corpus_changed_is_refused(tiny_bert, tmp_path, capsys, caplog):
    corpus = write_lines(tmp_path / "corpus.txt", SENTENCES * 6)
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--no-export", "true")) == 0
    capsys.readouterr()
    checkpoint = out / "checkpoint-2"  # resumed, it trains steps 3 and 4 again
    assert list(json.loads((checkpoint / "retromae_resume.json").read_text())["text_files"]["corpus"]) == ["."]
    original = corpus.read_bytes()
    write_lines(corpus, ["Completely different text about cooking pasta."] * 6)
    assert main(resume(out, str(checkpoint))) == 2
    err = one_line(capsys)
    assert f"--corpus file {corpus} changed size ({len(original)} -> " in err, err
    corpus.write_bytes(original)  # the same text, a new modification time (a copy): a warning, and the run resumes
    assert main(resume(out, str(checkpoint))) == 0
    assert f"--corpus file {corpus} was modified since the run being resumed" in caplog.text


# ---- another run's checkpoints ----------------------------------------------------------------------------------------


def test_last_refuses_a_folder_with_checkpoints_of_two_runs(finished_run, tmp_path, capsys):
    out = copy_of(finished_run, tmp_path)
    own_id = json.loads((out / "checkpoint-4" / "retromae_resume.json").read_text())["run_id"]
    foreign = Path(shutil.copytree(out / "checkpoint-2", out / "checkpoint-6"))
    recorded = json.loads((foreign / "retromae_resume.json").read_text())
    (foreign / "retromae_resume.json").write_text(json.dumps({**recorded, "run_id": "other-run"}))
    assert main(resume(out)) == 2
    err = one_line(capsys)
    assert f"{foreign} (run other-run); {out / 'checkpoint-4'} (run {own_id})" in err
    assert f"e.g. --resume-from-checkpoint {foreign}" in err
    assert main(resume(out, str(out / "checkpoint-4"))) == 0, "the checkpoint named explicitly continues"
    assert not (out / "checkpoint-7").exists() and not (out / "checkpoint-5").exists()


def test_resuming_a_checkpoint_refuses_to_replace_another_runs_checkpoints(finished_run, tmp_path, capsys):
    """HEAD resumed checkpoint-2 into a folder holding another run's checkpoint-4, replaced it with its own step 4
    and rotated it away, exit 0."""
    out = copy_of(finished_run, tmp_path)
    foreign = out / "checkpoint-4"
    recorded = json.loads((foreign / "retromae_resume.json").read_text())
    (foreign / "retromae_resume.json").write_text(json.dumps({**recorded, "run_id": "other-run"}))
    before = (foreign / "model.safetensors").read_bytes()
    assert main(resume(out, str(out / "checkpoint-2"))) == 2
    err = one_line(capsys)
    assert f"{out} holds checkpoints of another run after step 2 (checkpoint-4), which this run's saves" in err, err
    assert (foreign / "model.safetensors").read_bytes() == before


# ---- one run per output folder ------------------------------------------------------------------------------------


def test_a_second_run_into_a_folder_being_written_is_refused(tiny_bert, corpus, tmp_path, monkeypatch, capsys):
    """A second run starts while the first one holds the folder (called from the first one, which is alive): it is
    refused. The first run holds the lock from preparing the folder to the end of training."""
    from retromae.trainers.commands import pretrain
    from retromae.trainers.training.trainer import RetroMAETrainer

    out, second, holders = tmp_path / "run", [], []
    prepare, train = pretrain.prepare_output_dir, RetroMAETrainer.train

    def second_run_first(*args, **kwargs):
        if not second:  # the second run must not get here: it is refused before preparing the folder
            second.append(main(pretrain_args(tiny_bert, corpus, out, "--overwrite-output-dir", "true")))
        return prepare(*args, **kwargs)

    def note_holder(self, *args, **kwargs):
        holders.append(json.loads((out / LOCK_NAME).read_text())["pid"])
        return train(self, *args, **kwargs)

    monkeypatch.setattr(pretrain, "prepare_output_dir", second_run_first)
    monkeypatch.setattr(RetroMAETrainer, "train", note_holder)
    assert main(pretrain_args(tiny_bert, corpus, out, "--no-export", "true")) == 0
    assert second == [2] and holders == [os.getpid()]
    (err,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]  # beside the first run's
    assert f"is being written by another run (pid {os.getpid()} on {socket.gethostname()}" in err
    assert f"delete {out / LOCK_NAME}" in err
    assert not (out / LOCK_NAME).exists(), "released at the end"
    assert json.loads((out / "retromae_run.json").read_text())["global_step"] == 4, "the first run was untouched"


def test_a_stale_lock_is_taken_over_with_a_warning(finished_run, tmp_path, caplog):
    out = copy_of(finished_run, tmp_path)
    (out / LOCK_NAME).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "started": "then"}))
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.lock"):
        assert main(resume(out)) == 0
    assert any("Taking over" in r.getMessage() and "no longer running" in r.getMessage() for r in caplog.records)
    assert not (out / LOCK_NAME).exists()


def test_the_lock_is_released_on_errors_and_a_live_or_remote_holder_is_refused(tmp_path):
    folder = tmp_path / "out"
    with pytest.raises(RuntimeError), folder_lock(folder) as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        raise RuntimeError("boom")
    assert not folder.exists(), "nothing written: the folder the lock created is gone too"
    folder.mkdir()
    for holder in ({"pid": os.getppid(), "host": socket.gethostname()}, {"pid": dead_pid(), "host": "elsewhere"}):
        (folder / LOCK_NAME).write_text(json.dumps(holder))
        with pytest.raises(ValueError, match=f"pid {holder['pid']} on {holder['host']}"), folder_lock(folder):
            pass
        assert json.loads((folder / LOCK_NAME).read_text()) == holder, "another run's lock stays"
    with folder_lock(folder, enabled=False) as lock:  # a DDP rank that does not save
        assert lock is None


# ---- the output folder ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_dir_that_is_a_file_gets_one_line(tiny_bert, corpus, tmp_path, capsys, below):
    file = tmp_path / "out.txt"
    file.write_text("mine")
    assert main(pretrain_args(tiny_bert, corpus, file / below if below else file)) == 2
    assert f"{file} is a file, not a folder" in one_line(capsys)
    assert file.read_text() == "mine"


# ---- divergence ------------------------------------------------------------------------------------------------------


def test_a_diverged_run_stops_before_saving_nan_weights(tiny_bert, corpus, tmp_path, capsys):
    """A learning rate of 1e12 turns the weights to NaN within a few steps: the run stops with one line at the next
    loss log or save, keeps the checkpoint saved before, and writes no NaN checkpoint, final model or export."""
    out = tmp_path / "run"
    args = pretrain_args(tiny_bert, corpus, out, "--learning-rate", "1e12", "--max-steps", "8", "--logging-steps", "3")
    assert main(args) == 2
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr, stderr
    err = stderr.strip().splitlines()[-1]  # after the data's progress bars
    assert "pre-training diverged at step 3: " in err and "NaN or infinite" in err, err
    assert "nothing was saved after checkpoint-2" in err and "--learning-rate" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2"]
    saved = load_file(out / "checkpoint-2" / "model.safetensors")
    assert all(bool(tensor.float().isfinite().all()) for tensor in saved.values())


def _divergence_seen_by(rank: int, world_size: int, port: int, results) -> None:
    """Rank 1 holds the only NaN weight, as one FSDP shard can."""
    import torch
    from retromae.trainers.training.divergence import divergence_on_any_process

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world_size)
    try:
        shard = torch.nn.Linear(2, 2)
        if rank == 1:
            shard.weight.data[0, 0] = float("nan")
        results[rank] = divergence_on_any_process(shard, [])
    finally:
        torch.distributed.destroy_process_group()


def test_every_process_stops_when_one_shard_diverged():
    """HEAD checked each process's own weights: with sharded weights (FSDP, ZeRO-3) only the process holding the NaN
    stopped, and the others waited in their next collective for ever."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_divergence_seen_by, args=(2, port, results), nprocs=2, join=True)
        seen = dict(results)
    assert seen == {0: "the weights of 1 other process(es) are NaN or infinite",
                    1: "1 weight tensor(s) are NaN or infinite"}


# ---- a user probe: `~` in a config file, a read-only finished run, Ctrl-C, the summary --------------------------------


def test_a_config_file_output_dir_under_the_home_folder_is_resumed(finished_run, tmp_path, monkeypatch):
    """HEAD looked for `--resume-from-checkpoint last` in a folder literally named `~/run` (the checkpoint is located
    before the full parse, from the file's raw values)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path / "..")
    copy_of(finished_run, tmp_path)
    config = tmp_path / "resume.yaml"
    config.write_text("output_dir: ~/run\nresume_from_checkpoint: last\n")
    run = pretrain_arguments(["--config", str(config)])
    assert (run.resume, run.training.output_dir) == (str(tmp_path / "run" / "checkpoint-4"), str(tmp_path / "run"))


def test_resuming_a_finished_run_in_a_read_only_folder_exits_0(finished_run, tmp_path, monkeypatch, capsys):
    """The README: a finished run resumed writes only what is missing and exits 0. HEAD took the folder's lock even
    with nothing to write, which fails in a read-only folder (tests run as root: the lock's creation stands for it)."""
    out = copy_of(finished_run, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}

    def read_only(lock: Path):
        raise OSError(errno.EROFS, "Read-only file system", str(lock))

    monkeypatch.setattr(lock_module, "_acquire", read_only)
    assert main(resume(out)) == 0
    assert "had already finished at step 4" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def _interrupt_at(step: int, sigterm: bool = False):
    """RetroMAETrainer.training_step with Ctrl-C pressed (or, with `sigterm`, the process sent SIGTERM) when step
    `step + 1` starts."""
    real_step = RetroMAETrainer.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step == step:
            if not sigterm:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, *args, **kwargs)

    return training_step


def _main_interrupted(argv: list[str]) -> int:
    try:
        return main(argv)
    except KeyboardInterrupt:  # not to pytest: it would end the session
        pytest.fail("KeyboardInterrupt escaped with its traceback")


@pytest.mark.parametrize(("sigterm", "status"), [(False, 130), (True, 143)])
def test_ctrl_c_names_the_command_that_resumes_and_exits_130(sigterm, status, tiny_bert, corpus, tmp_path, monkeypatch,
                                                             capsys):
    """HEAD printed KeyboardInterrupt's traceback; its lock, checkpoint and resume were right, and still are.
    SIGTERM (a scheduler's preemption) stops the same way; HEAD died silently, its lock left behind."""
    monkeypatch.setattr(RetroMAETrainer, "training_step", _interrupt_at(3, sigterm))
    out = tmp_path / "run"
    assert _main_interrupted(pretrain_args(tiny_bert, corpus, out)) == status
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1] == (f"retromae pretrain: interrupted after checkpoint-2; resume with: retromae "
                                       f"pretrain --output-dir {out} --resume-from-checkpoint last")
    assert not (out / LOCK_NAME).exists()
    monkeypatch.undo()
    assert main(resume(out)) == 0 and (out / "checkpoint-4").is_dir()


def test_ctrl_c_before_the_first_checkpoint_says_there_is_nothing_to_resume(tiny_bert, corpus, tmp_path, monkeypatch,
                                                                              capsys):
    monkeypatch.setattr(RetroMAETrainer, "training_step", _interrupt_at(0))
    out = tmp_path / "run"
    assert _main_interrupted(pretrain_args(tiny_bert, corpus, out)) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"retromae pretrain: interrupted before the first checkpoint of {out}; nothing to resume: run the command "
        "again")



def test_ctrl_c_while_saving_a_tokenized_corpus_names_that_folder(tiny_bert, corpus, tmp_path, monkeypatch, capsys):
    """HEAD named the default --output-dir (out/retromae), which --save-tokenized never uses."""
    def interrupted(run):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain_command, "save_tokenized", interrupted)
    folder = tmp_path / "ids"
    assert _main_interrupted(pretrain_args(tiny_bert, corpus, tmp_path / "unused", "--save-tokenized",
                                           str(folder))) == 130
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"retromae pretrain: interrupted while tokenizing into {folder}, which is left as it was: run the command "
        "again")

def test_the_summary_names_what_the_checkpoint_holds_besides_the_encoder(tiny_bert, corpus, tmp_path, capsys):
    """HEAD said `decoder included` for BoW, which has none (its heads: the MLM and bag-of-words predictions)."""
    out = tmp_path / "bow"
    assert main(pretrain_args(tiny_bert, corpus, out, "--method", "bow", "--max-steps", "2", "--no-export",
                              "true")) == 0
    summary = capsys.readouterr().out
    assert f"  pre-training checkpoint (heads included): {out}" in summary and "decoder" not in summary


def test_a_folder_of_the_users_own_files_is_not_called_an_earlier_run(tiny_bert, corpus, tmp_path, capsys):
    """HEAD: "already holds files from an earlier run ... --overwrite-output-dir to start over", which deletes none of
    them. The user's files are named; the folder is untouched."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(pretrain_args(tiny_bert, corpus, out)) == 2
    assert one_line(capsys) == (f"retromae pretrain: error: output folder {out} holds files no retromae run wrote "
                                "(notes.txt); choose another --output-dir, or pass --overwrite-output-dir to "
                                "write beside them (it deletes none of them)")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("how", ["last", "explicit"])
def test_a_damaged_run_record_is_named_not_taken_for_another_run(how, finished_run, tmp_path, capsys):
    """HEAD, `last`: "holds checkpoints of 2 runs ... (run without a recorded id)"; explicit: resumed with the flags
    given now, the recorded settings silently lost."""
    out = copy_of(finished_run, tmp_path)
    record = out / "checkpoint-4" / "retromae_resume.json"
    record.write_text("{trunc")
    assert main(resume(out, "last" if how == "last" else str(out / "checkpoint-4"))) == 2
    err = one_line(capsys)
    assert f"{record} is damaged (not a JSON object), so the run's settings are unknown; restore it, or resume from " \
           "an earlier checkpoint-N" in err, err


def test_a_damaged_trainer_state_is_named_under_the_resume_flag(finished_run, tmp_path, capsys):
    """HEAD: "--model: .../trainer_state.json is not valid JSON ...; restore the file, or export the model again"."""
    out = copy_of(finished_run, tmp_path)
    state = out / "checkpoint-4" / "trainer_state.json"
    state.write_text("{trunc")
    assert main(resume(out, str(out / "checkpoint-4"))) == 2
    err = one_line(capsys)
    assert err.startswith(f"retromae pretrain: error: --resume-from-checkpoint: {state} is not valid JSON"), err
    assert err.endswith("restore the file, or use an earlier checkpoint-N of the run"), err
