"""The command wiring: user errors are one line with exit status 2, anything else is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import re
import resource
import signal
import subprocess
import sys

import pytest
from retromae.trainers import cli
from retromae.trainers import finetune as finetune_module
from retromae.trainers.core.errors import UserError

# the values a command needs before it looks at the rest of its options
REQUIRED = {"export": ["ckpt", "out"], "finetune": ["model", "data"], "evaluate": ["model"], "publish": ["f", "o/n"],
            "index": ["--model", "m", "--corpus", "c", "--output-dir", "o"], "search": ["--index", "i", "--model", "m"]}


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_an_unknown_option_is_one_line_naming_it(command, capsys):
    assert cli.main([command, *REQUIRED.get(command, []), "--no-such-option", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--no-such-option" in err, err


def _command_raising(error: Exception):
    def command(argv: list[str]) -> int:
        raise error

    return command


def test_user_error_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(UserError("corpus.jsonl:3: no text field")))
    assert cli.main(["export"]) == 2
    assert capsys.readouterr().err == "retromae export: error: corpus.jsonl:3: no text field\n"


@pytest.mark.parametrize("bug", [ValueError("shapes (3, 4) and (5,) differ"), KeyError("decoder"), TypeError("x")])
def test_an_internal_error_keeps_its_traceback(bug, monkeypatch):
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(bug))
    with pytest.raises(type(bug)):
        cli.main(["export"])


def test_debug_variable_shows_the_traceback_of_a_user_error(monkeypatch):
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(UserError("bad flag")))
    monkeypatch.setenv("RETROMAE_DEBUG", "1")
    with pytest.raises(UserError):
        cli.main(["export"])


def test_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)
    assert cli.main(["no-such-command"]) == 2
    assert capsys.readouterr().err.strip().endswith("retromae: error: unknown command 'no-such-command'")


def test_version_names_the_libraries_a_bug_report_needs(capsys):
    from importlib.metadata import version

    assert cli.main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"retromae {version('retromae')} (") and f"transformers {version('transformers')}" in out



@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_a_command_help_states_each_default_once_and_no_none(command, capsys):
    try:
        status = cli.main([command, "--help"])
    except SystemExit as stop:  # argparse's own exit after printing the help
        status = stop.code
    assert status == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in help_text
    assert not re.search(r"\(default[^()]*\) \(default", help_text), help_text


def test_a_missing_model_folder_is_named_before_anything_is_loaded(tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    assert cli.main(["pretrain", "--model", str(missing), "--output-dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"retromae pretrain: error: --model: model folder {missing} does not exist"



class _Parsed(Exception):
    """Stops a command once its options are parsed."""


def test_renamed_finetune_loss_weights_still_read_with_a_warning(monkeypatch, caplog):
    """`--contrastive-weight` / `--distill_weight=` (and the Python options of those names) are the old names of
    `contrastive_loss_weight` / `distill_loss_weight`: read under the new names, with a deprecation warning."""
    loss_arguments = []

    def parsed(*arguments):
        loss_arguments.append(arguments[2])
        raise _Parsed

    monkeypatch.setattr(finetune_module, "run_finetune", parsed)
    with pytest.raises(_Parsed):
        finetune_module.finetune("model", "data", "out", contrastive_weight=0.3)
    with pytest.raises(_Parsed):
        finetune_module.finetune_command(["model", "data", "--output-dir", "out", "--contrastive-weight", "0.2",
                                          "--distill_weight=2"])
    assert loss_arguments[0].contrastive_loss_weight == 0.3
    assert (loss_arguments[1].contrastive_loss_weight, loss_arguments[1].distill_loss_weight) == (0.2, 2.0)
    warned = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert any("`contrastive_weight`" in m and "contrastive_loss_weight" in m for m in warned)
    assert any("--contrastive-weight" in m and "--contrastive-loss-weight" in m for m in warned)
    assert any("--distill_weight" in m and "--distill-loss-weight" in m for m in warned)


# ---- a full disk (issue 31) -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "error", "expected"),
    [
        ("pretrain", OSError(errno.ENOSPC, "No space left on device", "out/checkpoint-6/model.safetensors"),
         "no space left on device while writing out/checkpoint-6/model.safetensors; free space, then run the command "
         "again with --resume-from-checkpoint last if it saved a checkpoint"),
        ("finetune", OSError(errno.EDQUOT, "Disk quota exceeded"),
         "disk quota exceeded while writing; free space, then run the command again with --resume-from-checkpoint "
         "last if it saved a checkpoint"),
        ("export", OSError(errno.ENOSPC, "No space left on device", "out/model.safetensors"),
         "no space left on device while writing out/model.safetensors; free space, then run the command again"),
    ],
    ids=["pretrain", "finetune-quota", "export"],
)
def test_a_full_disk_is_one_line_with_the_fix(command, error, expected, monkeypatch, capsys):
    """HEAD printed the OSError's traceback."""
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(error))
    assert cli.main([command]) == 2
    assert capsys.readouterr().err == f"retromae {command}: error: {expected}\n"


def test_a_full_disk_behind_another_error_is_recognised(monkeypatch, capsys):
    """A library may wrap the OSError (`raise ... from`), or report it as text only (safetensors' Rust I/O error)."""
    def wrapped(argv):
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "out/checkpoint-6/optimizer.pt")
        except OSError as error:
            raise RuntimeError("saving the checkpoint failed") from error

    monkeypatch.setattr(cli, "_command", lambda name: wrapped)
    assert cli.main(["pretrain"]) == 2
    assert "no space left on device while writing out/checkpoint-6/optimizer.pt" in capsys.readouterr().err
    text_only = RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
                             'left on device" })')
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(text_only))
    assert cli.main(["pretrain"]) == 2
    assert capsys.readouterr().err.startswith("retromae pretrain: error: no space left on device while writing; ")


def test_a_write_that_torch_save_loses_the_errno_of_is_one_line(tiny_bert, corpus, tmp_path):
    """torch.save writes through a C++ stream: a refused write raises a RuntimeError ("unexpected pos") without its
    errno, which HEAD printed as a traceback. A real refusal here: a file-size limit above the model's size and below
    its optimizer state's, so the checkpoint's optimizer.pt is what fails."""
    limit = int((tiny_bert / "model.safetensors").stat().st_size * 1.5)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", "retromae.trainers.cli", "pretrain", "--model", str(tiny_bert), "--corpus",
               str(corpus), "--output-dir", "out", "--max-seq-length", "32", "--per-device-train-batch-size", "2",
               "--max-steps", "2", "--save-steps", "2", "--use-cpu", "true", "--disable-tqdm", "true",
               "--no-export", "true"]
    refused = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             preexec_fn=limit_file_size)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("retromae pretrain: error: torch.save could not write a file ([enforce fail"), line
    assert line.endswith("free space, then run the command again with --resume-from-checkpoint last if it saved a "
                         "checkpoint"), line
    assert not list(tmp_path.glob("out/*checkpoint-2*")), "no half-written checkpoint, no build folder"


def test_other_os_errors_and_debug_keep_the_traceback(monkeypatch):
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(OSError(errno.ENOENT, "No such file", "x")))
    with pytest.raises(FileNotFoundError):
        cli.main(["pretrain"])
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(OSError(errno.ENOSPC, "No space left")))
    monkeypatch.setenv("RETROMAE_DEBUG", "1")
    with pytest.raises(OSError, match="No space left"):
        cli.main(["pretrain"])


@pytest.mark.parametrize(("command", "flag"), [("index", "--batch-size"), ("search", "--top-n"),
                                               ("evaluate", "--batch-size"), ("coverage", "--max-texts"),
                                               ("coverage", "--batch-size")])
def test_a_count_below_one_is_one_line_naming_the_flag(command, flag, capsys):
    """index --batch-size 0 and evaluate --batch-size 0 ended in tracebacks from torch's DataLoader."""
    assert cli.main([command, *REQUIRED.get(command, []), flag, "0"]) == 2
    assert capsys.readouterr().err == f"retromae {command}: error: {flag} 0: give a positive integer\n"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--scale", "0", "--scale 0.0: give a logit scale > 0 (1/temperature), or leave it unset"),
    ("--distill-temperature", "-1", "--distill-temperature -1.0: give a temperature > 0"),
    ("--contrastive-loss-weight", "-0.5", "--contrastive-loss-weight -0.5: give a weight >= 0"),
])
def test_finetune_loss_settings_that_cannot_train_are_one_line(flag, value, message, capsys):
    """A zero scale or temperature divided by zero inside the loss; a negative weight trained away from the target."""
    assert cli.main(["finetune", *REQUIRED["finetune"], flag, value]) == 2
    assert capsys.readouterr().err == f"retromae finetune: error: {message}\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["export", "ckpt", "out", "--pooling", "max"],
     "argument --pooling: invalid choice: 'max' (choose from 'cls', 'mean') (see retromae export --help)"),
    (["finetune", "--model", "m"],
     "the following arguments are required: --train_data/--train-data (see retromae finetune --help)"),
    (["pretrain", "--max-seq-length", "abc"],
     "argument --max_seq_length/--max-seq-length: invalid int value: 'abc' (see retromae pretrain --help)"),
])
def test_a_usage_error_is_one_line(argv, message, capsys):
    """argparse printed its whole usage text above the error."""
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"retromae {argv[0]}: error: {message}\n"


def test_an_abbreviation_of_one_option_is_that_option():
    """`--output` matches only --output_dir and --output-dir, the two spellings of one option: argparse called it
    ambiguous. Two options still are."""
    from retromae.trainers.core.arguments import start_command
    from retromae.trainers.export import ExportArguments

    (args,) = start_command(["ckpt", "--output", "out", "--overw", "true"], ExportArguments, prog="retromae export",
                            description=None, positional=["checkpoint"])
    assert (args.output_dir, args.overwrite) == ("out", True)
    with pytest.raises(UserError, match="ambiguous option: --o could match --output-dir, --overwrite"):
        start_command(["ckpt", "--o", "out"], ExportArguments, prog="retromae export", description=None,
                      positional=["checkpoint"])
