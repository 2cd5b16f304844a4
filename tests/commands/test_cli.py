"""The command wiring: user errors are one line with exit status 2, anything else is a bug and keeps its traceback."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from retromae.trainers import cli
from retromae.trainers.commands import finetune as finetune_command_module
from retromae.trainers.commands.evaluate import EvaluateArguments
from retromae.trainers.commands.finetune import finetune_command, given_option_names
from retromae.trainers.commands.import_official import ImportOfficialArguments
from retromae.trainers.commands.index import IndexArguments, SearchArguments
from retromae.trainers.inputs.arguments import start_command
from retromae.trainers.inputs.errors import UserError
from retromae.trainers.inputs.folders import is_local_path
from retromae.trainers.training import finetuning as finetune_module
from retromae.trainers.training import lock as lock_module

from ..builders import pretrain_args

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


def test_a_library_refusal_is_one_line_and_a_value_error_from_another_library_keeps_its_traceback(
        tmp_path, monkeypatch, capsys):
    """The libraries raise ValueError (not UserError): one raised by the package's own code is a refusal, printed as
    one line; one raised inside another library (here json) is a bug and keeps its traceback."""
    from retromae.trainers.data.reading import read_corpus

    missing = tmp_path / "missing.txt"
    monkeypatch.setattr(cli, "_command", lambda name: lambda argv: read_corpus(missing))
    assert cli.main(["pretrain"]) == 2
    assert capsys.readouterr().err.startswith(f"retromae pretrain: error: corpus path {str(missing)!r} does not exist")
    monkeypatch.setattr(cli, "_command", lambda name: lambda argv: json.loads("{"))
    with pytest.raises(json.JSONDecodeError):
        cli.main(["pretrain"])


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
    monkeypatch.setattr(finetune_command_module, "run_finetune", parsed)
    with pytest.raises(_Parsed):
        finetune_module.finetune("model", "data", "out", contrastive_weight=0.3, stages="distill",
                                 teacher_scores="scores.tsv")  # loss weights without distill are refused
    with pytest.raises(_Parsed):
        finetune_command(["model", "data", "--output-dir", "out", "--contrastive-weight", "0.2",
                          "--distill_weight=2", "--stages", "distill", "--teacher-scores", "scores.tsv"])
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
    (["export", "--conf", "c.yaml", "ckpt", "out"], "--conf: write --config in full"),  # HEAD: too many values to unpack
])
def test_a_usage_error_is_one_line(argv, message, capsys):
    """argparse printed its whole usage text above the error."""
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"retromae {argv[0]}: error: {message}\n"


def test_an_abbreviation_of_one_option_is_that_option():
    """`--output` matches only --output_dir and --output-dir, the two spellings of one option: argparse called it
    ambiguous. Two options still are."""
    from retromae.trainers.commands.export import ExportArguments
    from retromae.trainers.inputs.arguments import start_command

    (args,) = start_command(["ckpt", "--output", "out", "--overw", "true"], ExportArguments, prog="retromae export",
                            description=None, positional=["checkpoint"])
    assert (args.output_dir, args.overwrite) == ("out", True)
    with pytest.raises(UserError, match="ambiguous option: --o could match --output-dir, --overwrite"):
        start_command(["ckpt", "--o", "out"], ExportArguments, prog="retromae export", description=None,
                      positional=["checkpoint"])



@pytest.mark.parametrize(("argv", "overwrite"), [
    (["--decoder", "dec.bin", "ckpt", "out"], False),
    (["ckpt", "--overwrite", "out", "--decoder=dec.bin"], True),
    (["--overwrite", "ckpt", "--decoder", "dec.bin", "out"], True),
    (["--overwrite", "false", "ckpt", "out", "--decoder", "dec.bin"], False),
])
def test_positional_values_may_follow_options(argv, overwrite):
    """`import-official --decoder FILE CKPT OUT` was refused: positional values were read only before the first
    option. A yes/no option takes the next value only when it is yes or no."""
    (args,) = start_command(argv, ImportOfficialArguments, prog="retromae import-official", description=None,
                            positional=["checkpoint", "output_dir"])
    assert (args.checkpoint, args.output_dir, args.decoder, args.overwrite) == ("ckpt", "out", "dec.bin", overwrite)


def test_a_positional_value_given_by_its_flag_too_is_refused_naming_both():
    """HEAD said "--checkpoint is given 2 times" to a user who typed the flag once (probe 75)."""
    with pytest.raises(UserError, match="^--checkpoint is given twice: by its flag and as the value ckpt; give it once"):
        start_command(["ckpt", "out", "--checkpoint", "x"], ImportOfficialArguments, prog="retromae import-official",
                      description=None, positional=["checkpoint", "output_dir"])


def test_a_value_past_the_positional_ones_is_refused_naming_the_value_before_it():
    with pytest.raises(UserError, match="^--output-dir takes one value, and extra follows its value out;"):
        start_command(["--decoder", "dec.bin", "ckpt", "out", "extra"], ImportOfficialArguments,
                      prog="retromae import-official", description=None, positional=["checkpoint", "output_dir"])


@pytest.mark.parametrize(("argv", "expected"), [
    (["--encoder-mask-ratio", "-1", "ckpt", "out"], ("ckpt", "out")),  # a negative number is a value (probe 75)
    (["--", "-ckpt", "out"], ("-ckpt", "out")),  # after --, values even if they start with a dash
])
def test_positional_values_after_a_negative_number_or_a_double_dash(argv, expected):
    (args,) = start_command(argv, ImportOfficialArguments, prog="retromae import-official", description=None,
                            positional=["checkpoint", "output_dir"])
    assert (args.checkpoint, args.output_dir) == expected


@pytest.mark.parametrize(("argv", "folders", "model"), [
    (["--beir-folder", "a", "m"], ["a"], "m"),
    (["--beir-folder", "a", "b", "m", "--split", "dev"], ["a", "b"], "m"),
    (["--beir-folder", "a", "b", "--split", "dev", "m"], ["a", "b"], "m"),
    (["--model", "m", "--beir-folder", "a", "b"], ["a", "b"], "m"),
])
def test_a_list_option_leaves_its_last_values_to_the_positional_ones(argv, folders, model):
    """HEAD: `evaluate --beir-folder a MODEL` took MODEL as a folder and said --model was missing (probe 75)."""
    (args,) = start_command(argv, EvaluateArguments, prog="retromae evaluate", description=None, positional=["model"])
    assert (args.beir_folder, args.model) == (folders, model)


def test_an_unknown_option_before_the_positional_values_is_named():
    """HEAD: `export --bogus CKPT OUT` said the checkpoint was missing, not that --bogus is unknown (probe 75)."""
    with pytest.raises(UserError, match=r"^unknown option\(s\): --bogus "):
        start_command(["--bogus", "ckpt", "out"], ImportOfficialArguments, prog="retromae import-official",
                      description=None, positional=["checkpoint", "output_dir"])


def test_finetune_reads_its_positional_values_after_options():
    assert {"model", "train_data", "output_dir", "max_steps"} <= given_option_names(
        ["--output-dir", "o", "--max-steps", "-1", "m", "data.jsonl"])

# ---- output paths: `~`, folders that cannot be written, symlink loops, long names (a user probe) --------------------


@pytest.fixture(scope="module")
def run(tiny_bert, corpus, tmp_path_factory) -> Path:
    """A finished 2-step pre-training run, its encoder exported to encoder/."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert cli.main(pretrain_args(tiny_bert, corpus, out, "--max-steps", "2", "--save-steps", "2")) == 0
    return out


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """HOME under tmp_path, which is also the working directory: an unexpanded `~` would show as a folder `./~`."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.chdir(tmp_path)
    return folder


def test_a_tilde_in_a_path_is_the_home_folder_on_the_command_line_and_in_a_config_file(run, corpus, home, tmp_path):
    """HEAD wrote `export RUN "~/enc"`, and coverage and index, into a folder named `~` in the working directory."""
    assert cli.main(["export", str(run), "~/enc"]) == 0
    assert (home / "enc" / "modules.json").is_file()
    shutil.copy(corpus, home / "corpus.txt")
    (home / "coverage.yaml").write_text(f"model: ['{run / 'encoder'}']\ncorpus: ~/corpus.txt\noutput_dir: ~/cov\n"
                                        "max_texts: 4\n")
    assert cli.main(["coverage", "--config", "~/coverage.yaml", "--no-progress"]) == 0
    assert (home / "cov" / "coverage.json").is_file()
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize(("arguments", "argv", "expected"), [
    (IndexArguments, ["--model", "~/m", "--corpus", "~/c.txt", "--output-dir", "~/index"],
     {"model": "{home}/m", "corpus": "{home}/c.txt", "output_dir": "{home}/index"}),
    (SearchArguments, ["--index", "~", "--model", "m", "--query", "~/not a path", "--output", "~/hits.jsonl"],
     {"index": "{home}", "query": ["~/not a path"], "output": "{home}/hits.jsonl"}),  # a query is text
    (EvaluateArguments, ["--model", "m", "--beir-folder", "~/a", "~/b", "--output-dir", "~/eval", "--model-name",
                         "~/name"],
     {"beir_folder": ["{home}/a", "{home}/b"], "output_dir": "{home}/eval", "model_name": "~/name"}),
], ids=["index", "search", "evaluate"])
def test_every_path_option_expands_a_tilde_and_a_text_option_keeps_it(arguments, argv, expected, home, tmp_path):
    """On the command line and in a `--config` file alike."""
    want = {name: [v.format(home=home) for v in value] if isinstance(value, list) else value.format(home=home)
            for name, value in expected.items()}
    (args,) = start_command(argv, arguments, prog="retromae x", description=None)
    assert {name: getattr(args, name) for name in expected} == want
    values: dict[str, list[str]] = {}
    for arg in argv:  # the same settings as a config file
        if arg.startswith("--"):
            name = arg[2:].replace("-", "_")
            values[name] = []
        else:
            values[name].append(arg)
    config = tmp_path / "settings.yaml"
    config.write_text(yaml.safe_dump({k: v if k in {"beir_folder", "query"} else v[0] for k, v in values.items()}))
    (args,) = start_command(["--config", str(config)], arguments, prog="retromae x", description=None)
    assert {name: getattr(args, name) for name in expected} == want


@pytest.mark.parametrize(("command", "error", "expected"), [
    ("export", OSError(errno.EROFS, "Read-only file system", "/mnt/models/.enc.tmp-42-1a2b3c4d"),
     "cannot write in /mnt/models: read-only file system; make it writable, or choose another OUTPUT_DIR"),
    ("search", OSError(errno.EACCES, "Permission denied", "/srv/shared/hits.jsonl"),
     "cannot write in /srv/shared: permission denied; make it writable, or choose another --output"),
    ("pretrain", OSError(errno.EROFS, "Read-only file system", "/mnt/runs/run/.retromae.lock"),
     "cannot write in /mnt/runs/run: read-only file system; make it writable, or choose another --output-dir"),
    ("evaluate", PermissionError(errno.EPERM, "Operation not permitted", "eval-results/m"),
     "cannot write in eval-results: permission denied; make it writable, or choose another --output-dir"),
], ids=["export-read-only", "search-permission", "pretrain-lock", "evaluate-default-folder"])
def test_a_write_refused_by_a_read_only_or_forbidden_folder_is_one_line(command, error, expected, monkeypatch,
                                                                         capsys):
    """HEAD printed `OSError: [Errno 30]` / `[Errno 13]` with its traceback (the disk-full line's mechanism)."""
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(error))
    assert cli.main([command]) == 2
    assert capsys.readouterr().err == f"retromae {command}: error: {expected}\n"


def test_a_file_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("text\n")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path) == corpus and mode & os.R_OK
                        else real_access(path, mode, **kw))  # tests run as root, which reads every file
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(
        PermissionError(errno.EACCES, "Permission denied", str(corpus))))
    assert cli.main(["index"]) == 2
    assert capsys.readouterr().err == (f"retromae index: error: cannot read {corpus}: permission denied; make it "
                                       "readable (chmod u+r), or give another file\n")


@pytest.mark.parametrize("command", ["export", "index", "search", "coverage", "evaluate", "finetune"])
def test_an_output_folder_that_cannot_be_written_is_refused_before_any_work(command, run, tmp_path, monkeypatch,
                                                                           capsys):
    """HEAD found out when it wrote (index after encoding the corpus, search after searching, evaluate in its default
    folder beside a read-only working directory). Tests run as root, whom permissions do not stop: `os.access` says
    what it says for a folder on a read-only file system."""
    locked = tmp_path / "read-only"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if Path(path).absolute() == locked and mode &
                        os.W_OK else real_access(path, mode, **kw))
    argv = {
        "export": ["export", str(run), str(locked / "enc")],
        "index": ["index", "--model", "m", "--corpus", "c", "--output-dir", str(locked / "index")],
        "search": ["search", "--index", "i", "--model", "m", "--query", "q", "--output", str(locked / "hits.jsonl")],
        "coverage": ["coverage", "--model", "m", "--output-dir", str(locked / "cov")],
        "evaluate": ["evaluate", "m", "--beir-folder", "b"],  # into eval-results/m in the working directory
        "finetune": ["finetune", "m", "d", "--output-dir", str(locked / "ft")],
    }[command]
    if command == "evaluate":
        monkeypatch.chdir(locked)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    flag = {"search": "--output", "export": "output folder"}.get(command, "--output-dir")
    assert err.startswith(f"retromae {command}: error: {flag} ") and err.count("\n") == 1, err
    assert err.endswith(f": {locked} cannot be written (no write permission); make it writable, or choose another "
                        "folder\n"), err


def test_a_pretraining_output_folder_that_cannot_be_written_is_one_line(tiny_bert, corpus, tmp_path, monkeypatch,
                                                                        capsys):
    out = tmp_path / "run"

    def read_only(lock: Path):
        raise OSError(errno.EROFS, "Read-only file system", str(lock))

    monkeypatch.setattr(lock_module, "_acquire", read_only)
    assert cli.main(pretrain_args(tiny_bert, corpus, out)) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"retromae pretrain: error: cannot write in {out}: read-only file system; make it writable, or choose "
        "another --output-dir")


@pytest.mark.parametrize("command", ["export", "index", "search", "coverage", "evaluate", "finetune", "pretrain"])
def test_a_symlink_loop_as_the_output_is_one_line(command, run, tiny_bert, corpus, tmp_path, capsys):
    """HEAD: `RuntimeError: Symlink loop from ...` with its traceback."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    argv = {
        "export": ["export", str(run), str(loop)],
        "index": ["index", "--model", "m", "--corpus", "c", "--output-dir", str(loop)],
        "search": ["search", "--index", "i", "--model", "m", "--query", "q", "--output", str(loop)],
        "coverage": ["coverage", "--model", "m", "--output-dir", str(loop / "cov")],
        "evaluate": ["evaluate", "m", "--beir-folder", "b", "--output-dir", str(loop)],
        "finetune": ["finetune", "m", "d", "--output-dir", str(loop)],
        "pretrain": pretrain_args(tiny_bert, corpus, tmp_path / "out", "--export-dir", str(loop)),
    }[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"retromae {command}: error: ") and err.endswith(
        f"{loop} is a symbolic link that leads back to itself (a loop); remove it, or choose another folder"), err


def test_a_very_long_model_name_is_a_name_not_a_path(run, tmp_path, capsys):
    """HEAD: `OSError: File name too long`, from asking the file system whether the name is a path; then it wrote
    the name into the card, though the Hub takes at most 96 characters."""
    name = "my-org/" + "x" * 300
    assert not is_local_path(name) and not is_local_path("x" * 5000)
    assert cli.main(["export", str(run), str(tmp_path / "enc"), "--model-name", name]) == 2
    assert "cannot name a Hub repository: the name has 300 characters; the Hub takes at most 96" in (
        capsys.readouterr().err)


def test_a_value_that_starts_with_a_dash_is_named(capsys):
    """argparse said only `argument --model-name: expected one argument`."""
    assert cli.main(["export", "ckpt", "out", "--model-name", "-x"]) == 2
    assert capsys.readouterr().err == (
        "retromae export: error: --model-name -x: a value that starts with '-' reads as an option; if -x is the "
        "value, write --model-name=-x\n")


def test_ctrl_c_is_one_line_and_exit_status_130(monkeypatch, capsys):
    """HEAD printed KeyboardInterrupt's traceback (`pretrain` names its folder: test_pretrain_safety.py)."""
    monkeypatch.setattr(cli, "_command", lambda name: _command_raising(KeyboardInterrupt()))
    try:
        statuses = [cli.main(["index"]), capsys.readouterr().err, cli.main(["finetune"])]
    except KeyboardInterrupt:  # not to pytest: it would end the session
        pytest.fail("KeyboardInterrupt escaped with its traceback")
    assert statuses == [130, "retromae index: interrupted\n", 130]
    assert capsys.readouterr().err == ("retromae finetune: interrupted; to continue, run the same command again with "
                                       "--resume-from-checkpoint last\n")


def test_sigterm_stops_a_command_as_ctrl_c_does_with_exit_status_143(monkeypatch, capsys):
    """A scheduler's preemption or `kill`: HEAD died at once, without its line (and, for `pretrain`, left its lock
    and a partial checkpoint for the next run to clean up). The handler is the caller's again afterwards."""
    def terminated(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in here
        return 0

    monkeypatch.setattr(cli, "_command", lambda name: terminated)
    before = signal.getsignal(signal.SIGTERM)
    try:
        status = cli.main(["finetune"])
    except KeyboardInterrupt:
        pytest.fail("the SIGTERM escaped main")
    assert status == 143
    assert capsys.readouterr().err == ("retromae finetune: interrupted; to continue, run the same command again with "
                                       "--resume-from-checkpoint last\n")
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.parametrize(("extra", "message"), [
    (["--extend-position-embeddings", "0"],
     "--extend-position-embeddings 0: give the number of positions to grow the table to, at least --max-seq-length "
     "32, or leave the option out"),
    (["--extend-position-embeddings", "150", "--max-seq-length", "200"],
     "--extend-position-embeddings 150 is below --max-seq-length 200, so the grown table would still be too short; "
     "pass --extend-position-embeddings 200 or more"),
], ids=["zero", "below-max-seq-length"])
def test_an_extension_that_cannot_hold_the_sequence_is_refused_naming_the_fix(extra, message, tiny_bert, corpus,
                                                                               tmp_path, capsys):
    """HEAD ignored 0 (and refused -1), and for 150 < 200 named `150, max_position_embeddings` and suggested
    the flag already given."""
    assert cli.main(pretrain_args(tiny_bert, corpus, tmp_path / "run", *extra)) == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"retromae pretrain: error: {message}"
    assert not (tmp_path / "run").exists()


def test_deepspeed_without_its_package_is_one_line(tmp_path, capsys, monkeypatch):
    """HEAD ended in transformers' PackageNotFoundError traceback while parsing the options."""
    installed_version = importlib.metadata.version

    def version(name: str) -> str:  # as if deepspeed were not installed (the dev extra installs it)
        if name == "deepspeed":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    assert cli.main(["pretrain", "--deepspeed", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == ("retromae pretrain: error: --deepspeed needs the deepspeed package, which is not installed: "
                   "pip install deepspeed (or drop the option)\n")
