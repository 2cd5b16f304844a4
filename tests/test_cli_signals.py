"""The edges of a command (`cli.main`): SIGTERM during the imports before it runs and after it has returned, a
Ctrl-C or SIGTERM line printed while a progress bar is open and once per torchrun run, and the process group a
torchrun command leaves."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest
from retromae.trainers import cli
from tqdm import tqdm

# A fresh `retromae export ckpt out` that sends itself SIGTERM when MODULE is first looked up: mid-import, at a
# known moment rather than after a guessed sleep.
SIGTERM_ON_IMPORT = textwrap.dedent("""
    import os, runpy, signal, sys

    class SigtermOnImport:
        def find_spec(self, name, path=None, target=None):
            if name == MODULE and self in sys.meta_path:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), signal.SIGTERM)
            return None

    sys.meta_path.insert(0, SigtermOnImport())
    sys.argv = ["retromae", "export", "ckpt", "out"]
    runpy.run_module("retromae.trainers.cli", run_name="__main__", alter_sys=True)
""")

# A fresh `retromae export ckpt out` whose command finishes (prints its result, or is refused), then gets SIGTERM
# while the interpreter shuts down.
SIGTERM_AFTER_RETURN = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from retromae.trainers import cli
    from retromae.trainers.inputs.errors import UserError

    def finished(argv):
        if REFUSED:
            raise UserError("refused")
        print("retromae: exported ckpt -> out", flush=True)
        return 0

    def sigterm_at_exit():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)

    cli._command = lambda name: finished
    atexit.register(sigterm_at_exit)
    sys.argv = ["retromae", "export", "ckpt", "out"]
    sys.exit(cli.main())
""")

# A fresh `retromae pretrain` whose command joins a one-process gloo group (as the Trainer does under torchrun) and
# returns STATUS; at exit it reports whether the group is still alive.
GROUP_AT_EXIT = textwrap.dedent("""
    import atexit, os, sys
    import torch.distributed as dist
    from retromae.trainers import cli

    def trained(argv):
        dist.init_process_group("gloo", init_method="file://" + os.path.abspath("group"), rank=0, world_size=1)
        return STATUS

    atexit.register(lambda: print("group alive at exit:", dist.is_initialized()))
    cli._command = lambda name: trained
    sys.argv = ["retromae", "pretrain"]
    sys.exit(cli.main())
""")

# A fresh `retromae export` whose command imports DeepSpeed, as accelerate does in every model save.
DEEPSPEED_IMPORTED = textwrap.dedent("""
    import sys
    from retromae.trainers import cli

    def saved(argv):
        import deepspeed
        print("saved")
        return 0

    cli._command = lambda name: saved
    sys.argv = ["retromae", "export"]
    sys.exit(cli.main())
""")


def _run(code: str, tmp_path, **names: object) -> subprocess.CompletedProcess:
    prelude = "".join(f"{name} = {value!r}\n" for name, value in names.items())
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("module", ["huggingface_hub", "retromae.trainers.commands.export"],
                         ids=["cli-imports", "command-imports"])
def test_sigterm_while_the_program_imports_is_one_line_and_143(module, tmp_path):
    """HEAD took SIGTERM only once the command's module (torch, transformers: seconds) was imported: before that the
    process died at once, without its line (cli's own imports: huggingface_hub, half a second)."""
    done = _run(SIGTERM_ON_IMPORT, tmp_path, MODULE=module)
    assert (done.returncode, done.stderr) == (143, "retromae export: interrupted\n")


@pytest.mark.parametrize(("refused", "status", "stdout", "stderr"), [
    (False, 0, "retromae: exported ckpt -> out\n", ""),
    (True, 2, "", "retromae export: error: refused\n"),
], ids=["exported", "refused"])
def test_sigterm_after_the_command_returned_leaves_its_status(refused, status, stdout, stderr, tmp_path):
    """HEAD gave the default handler back when the command returned, so a SIGTERM while the interpreter shut down
    (with torch loaded, that takes a while) killed it: status 143 after `exported ...` was printed."""
    done = _run(SIGTERM_AFTER_RETURN, tmp_path, REFUSED=refused)
    assert (done.returncode, done.stdout, done.stderr) == (status, stdout, stderr)


def test_the_interrupted_line_is_not_glued_to_an_open_progress_bar(monkeypatch, capsys):
    """HEAD printed the line right after the bar, whose line has no newline until the bar closes: `... 3/10 [...]
    retromae pretrain: interrupted after checkpoint-2; ...` on one line."""
    def interrupted(argv):
        bar = tqdm(total=10, file=sys.stderr)
        bar.update(3)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_command", lambda name: interrupted)
    try:
        status = cli.main(["index"])
    except KeyboardInterrupt:  # not to pytest: it would end the session
        pytest.fail("KeyboardInterrupt escaped main")
    stderr = capsys.readouterr().err
    assert status == 130
    assert "3/10" in stderr
    assert [line for line in stderr.splitlines() if "interrupted" in line] == ["retromae index: interrupted"]
    assert stderr.splitlines()[-1] == "retromae index: interrupted"


@pytest.mark.parametrize("rank, lines", [(None, 1), ("0", 1), ("1", 0)])
def test_a_torchrun_run_prints_the_interrupted_line_once(rank, lines, monkeypatch, capsys):
    """HEAD printed it on every rank: the same line once per process."""
    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_command", lambda name: interrupted)
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert cli.main(["index"]) == 130
    assert capsys.readouterr().err.splitlines() == ["retromae index: interrupted"] * lines


@pytest.mark.parametrize("status", [0, 1])
def test_the_program_leaves_no_process_group_to_tear_down_at_exit(status, tmp_path):
    """HEAD left the Trainer's gloo group alive at exit: under torchrun a rank could then abort in teardown (SIGABRT,
    'terminate called without an active exception') after its command had succeeded (a ZeRO-3 test, once in CI)."""
    done = _run(GROUP_AT_EXIT, tmp_path, STATUS=status)
    assert (done.returncode, done.stdout) == (status, "group alive at exit: False\n"), done.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_a_command_that_saves_a_model_prints_no_deepspeed_accelerator_guess(tmp_path):
    """HEAD printed DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to
    detect it." on stdout in every export, finetune and pretrain on a machine without a GPU."""
    done = _run(DEEPSPEED_IMPORTED, tmp_path)
    assert (done.returncode, done.stdout) == (0, "saved\n"), done.stderr[-2000:]
    assert "accelerator" not in done.stderr
