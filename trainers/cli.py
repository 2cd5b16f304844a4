"""The `retromae` command line: the table of commands and `main()`. Each command is a driver's function
`(argv) -> exit status`, imported only when the command runs (`retromae pretrain` lives in
`commands/pretrain.py`, ...).

A refusal (`inputs.errors.is_refusal`: a `UserError`, a config field's validator, or a `ValueError` / `TypeError`
raised by the package's own code) and a write
that the disk refused (ENOSPC, EDQUOT, EFBIG, torch.save's write failure, a read-only file system or a folder
without write permission) are printed as one line with exit status 2; Ctrl-C is one line with exit status 130 (for
`pretrain`: the command that resumes the run), SIGTERM (a scheduler's preemption, `kill`) the same with 143; any
other exception is a bug and keeps its traceback
(`RETROMAE_DEBUG=1` shows it for those too). SIGTERM gets its line from the program's first moment (the imports take
seconds), and once the command has returned it no longer changes the exit status.
"""

from __future__ import annotations

import contextvars
import errno
import importlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from importlib.metadata import PackageNotFoundError, version

OTHER_RANKS_PAUSE = 3.0  # seconds; torchrun's agent checks its processes every 0.1 s by default
# name -> ("module:function" under retromae.trainers, one-line summary); imported only when the command runs
COMMANDS: dict[str, tuple[str, str]] = {
    "pretrain": ("commands.pretrain:pretrain", "pre-train an encoder (default: a short demo run)"),
    "export": ("commands.export:export_command", "export a checkpoint's encoder as a sentence-transformers model"),
    "methods": ("methods:list_methods", "list the pre-training methods"),
    "index": ("commands.index:index_command", "build an exact DupMAE hybrid (dense + sparse) index of a corpus"),
    "search": ("commands.index:search_command", "search a hybrid index with one or more queries"),
    "finetune": ("commands.finetune:finetune_command", "fine-tune a retrieval bi-encoder (in-batch, hard negatives, distillation)"),
    "evaluate": ("commands.evaluate:evaluate_command", "MTEB retrieval evaluation on local BEIR folders / registered tasks"),
    "publish": ("commands.publish:publish_command", "validate a model folder, then upload it to the Hugging Face Hub"),
    "coverage": ("commands.coverage:coverage_command", "input-token coverage of [CLS] embeddings (did pre-training work?)"),
    "import-official": ("commands.import_official:import_official_command", "convert an official RetroMAE (staoxiao) checkpoint to continue it"),
}


def _terminated_while_loading(signum: int, frame: object) -> None:
    """SIGTERM during this module's own imports, before `main` can take it: the same line and status. Nothing has
    started, and `os._exit` cannot be swallowed by an import's `except:` as an exception could."""
    name = f" {sys.argv[1]}" if len(sys.argv) > 1 and sys.argv[1] in COMMANDS else ""
    print(f"retromae{name}: interrupted", file=sys.stderr, flush=True)
    os._exit(143)


# The imports below take half a second (huggingface_hub) before the `retromae` script reaches `main`: SIGTERM gets
# its line from the first moment. Only over the default handler (a program importing this module keeps its own),
# which is back once they are done.
_LOADING = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
if _LOADING:
    signal.signal(signal.SIGTERM, _terminated_while_loading)
try:
    from .inputs.errors import NOT_WRITABLE, is_refusal, one_line_message
    from .inputs.folders import INTERRUPTED_HINT
finally:
    if _LOADING:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # tokenizers warns when DataLoader workers fork

# what a full disk, a used-up quota or a file-size limit raises, as the line names it
DISK_FULL = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EFBIG: "file too large for the file system or the file-size limit (ulimit -f)",
}
# each command's option for where it writes, the fix a refused write names
OUTPUT_OPTION = {"pretrain": "--output-dir", "export": "OUTPUT_DIR", "index": "--output-dir", "search": "--output",
                 "finetune": "--output-dir (or --work-dir)", "evaluate": "--output-dir", "coverage": "--output-dir"}
# torch.save writes through a C++ stream that loses the errno: these are its texts for a refused write
TORCH_WRITE_FAILED = re.compile(r"PytorchStreamWriter failed writing|inline_container\.cc.*unexpected pos|iostream error")
# the commands that resume from a checkpoint
RESUMABLE = frozenset({"pretrain", "finetune"})


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command runs: it then stops as after Ctrl-C (the folder's lock released, a partial
    checkpoint removed, the resume line printed) instead of dying silently."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


def _command(name: str) -> Callable[[list[str]], int]:
    module, function = COMMANDS[name][0].split(":")
    return getattr(importlib.import_module(f"retromae.trainers.{module}"), function)


def main(argv: list[str] | None = None) -> int:
    """The `retromae` command. `argv` None: the program's own arguments (the `retromae` script, `python -m`), so the
    process ends when `main` returns (see `_sigterm_raises`)."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in {"-V", "--version"}:
        print(version_line())
        return 0
    if not argv or argv[0] in {"-h", "--help"} or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        listing = "\n".join(f"  {name:{width}s}  {summary}" for name, (_, summary) in COMMANDS.items())
        usage = f"usage: retromae COMMAND [options]   (retromae COMMAND --help for its options)\n\ncommands:\n{listing}"
        if not argv or argv[0] in {"-h", "--help"}:
            print(usage)
            return 0
        print(f"{usage}\n\nretromae: error: unknown command {argv[0]!r}", file=sys.stderr)
        return 2
    return _run(argv[0], argv[1:], program)


def _run(name: str, args: list[str], program: bool) -> int:
    """Run command `name`, SIGTERM taken from before its imports (seconds: torch, transformers)."""
    context = contextvars.copy_context()  # what the command sets stays in it (INTERRUPTED_HINT: read after a Ctrl-C)
    if program:
        logging.getLogger("DeepSpeed").addFilter(_no_accelerator_guess)
    try:
        with _sigterm_raises(program):
            status = context.run(_command(name), args)
        if program:
            _leave_process_group()
        return status
    except KeyboardInterrupt as stop:
        if os.environ.get("RETROMAE_DEBUG"):
            raise
        hint = context.get(INTERRUPTED_HINT)
        if os.environ.get("RANK", "0") == "0":  # torchrun stops every rank: one line, from rank 0
            _print_line(f"retromae {name}: {hint() if hint else interrupted_message(name)}")
        return 143 if isinstance(stop, Terminated) else 130  # 128 + the signal, as a shell reports it
    except Exception as error:
        message = one_line_message(error) if is_refusal(error) else refused_write_message(error, name)
        if message is None or os.environ.get("RETROMAE_DEBUG"):
            raise
        if program:
            _let_rank_zero_speak_first()
        _print_line(f"retromae {name}: error: {message}")
        return 2


def _let_rank_zero_speak_first() -> None:
    """On a torchrun process other than the first, pause before printing a refusal. A refusal every process meets
    (the same command) is then printed once: the first process prints it and exits, and torchrun stops the others
    (SIGTERM, here left to end the process) before they print theirs, which may be a consequence of the first's
    (another run's folder lock: "holds files from an earlier run"). A refusal of one process alone still comes."""
    if os.environ.get("RANK", "0") == "0":
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(OTHER_RANKS_PAUSE)


def _no_accelerator_guess(record: logging.LogRecord) -> bool:
    """Drop DeepSpeed's "Setting accelerator to CPU ... unable to detect it", printed on stdout wherever the package
    is installed and a GPU is not: accelerate imports it in every model save, also where DeepSpeed is not used."""
    return not str(record.msg).startswith("Setting accelerator to CPU")


def _leave_process_group() -> None:
    """Destroy the torch.distributed group a finished command leaves (torchrun runs): a process that exits with a
    live gloo group can abort at teardown (SIGABRT, 'terminate called without an active exception')."""
    dist = sys.modules.get("torch.distributed")  # never imported here: a command that used it has
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def _sigterm_raises(program: bool) -> Iterator[None]:
    """SIGTERM raises `Terminated` in the block (in the main thread: where Python takes signal handlers). Then the
    caller's handler is back, or for the program itself SIGTERM is ignored: the command's result is complete, and a
    SIGTERM landing while the line is printed or the interpreter shuts down must not make its status 143."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        restored = signal.SIG_DFL if previous is None else previous  # None: a handler set outside Python
        signal.signal(signal.SIGTERM, signal.SIG_IGN if program else restored)


def _print_line(line: str) -> None:
    """Print `line` on stderr on a line of its own: tqdm bars the command left open (their line has no newline
    until they close) are closed first, innermost first, as leaving their `with` blocks would."""
    std = sys.modules.get("tqdm.std")  # no bar without it; tqdm's subclasses share its registry of open bars
    bars = sorted(std.tqdm._instances, key=lambda bar: -abs(getattr(bar, "pos", 0))) if std is not None else []
    for bar in bars:
        with suppress(OSError, ValueError):  # a bar on a stream closed since writes nothing
            bar.close()
    print(line, file=sys.stderr)


def version_line() -> str:
    """`retromae X (transformers A, sentence-transformers B, torch C)`: what a bug report needs. Read from the
    installed metadata: importing the libraries (`inputs.versions.library_versions`) takes seconds."""

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "unknown"

    libraries = ", ".join(f"{name} {installed(name)}" for name in ("transformers", "sentence-transformers", "torch"))
    return f"retromae {installed('retromae')} ({libraries})"


def refused_write_message(error: BaseException, command: str) -> str | None:
    """One line for a write the disk refused (`DISK_FULL`) or a folder refused (`NOT_WRITABLE`) while `command`
    ran, or None for any other error.

    The error or one it was raised from must be an `OSError` with such an errno, carry the system's text for it
    (safetensors reports a Rust I/O error as text), or be torch.save's write failure, which names no cause.
    Checkpoints are written atomically, so `pretrain` and `finetune` continue from their last complete one.
    """
    then = "run the command again"
    if command in RESUMABLE:
        then += " with --resume-from-checkpoint last if it saved a checkpoint"
    seen: set[int] = set()
    while error is not None and id(error) not in seen:  # the error, then what it was raised from
        seen.add(id(error))
        code = error.errno if isinstance(error, OSError) else None
        # by text too, but not EPERM's: "Operation not permitted" is also other libraries' wording for other things
        code = code or next((c for c in (*DISK_FULL, errno.EROFS, errno.EACCES) if os.strerror(c) in str(error)), None)
        name = getattr(error, "filename", None)
        if code in DISK_FULL:
            return f"{DISK_FULL[code]} while writing{f' {name}' if name else ''}; free space, then {then}"
        if code in NOT_WRITABLE:
            return not_writable_message(code, name, command)
        if TORCH_WRITE_FAILED.search(str(error)):
            return (f"torch.save could not write a file ({one_line_message(error)}): most likely the disk is full or "
                    f"a file-size limit was reached; free space, then {then}")
        error = error.__cause__ or error.__context__
    return None


def not_writable_message(code: int, name: str | os.PathLike | None, command: str) -> str:
    """The line for an `OSError` of `NOT_WRITABLE` on `name`: a file that exists and may not be read was being
    read (an input); anything else was being written, in the folder the line names."""
    if name is not None and os.path.isfile(name) and not os.access(name, os.R_OK):
        return f"cannot read {name}: {NOT_WRITABLE[code]}; make it readable (chmod u+r), or give another file"
    folder = name if name is None or os.path.isdir(name) else os.path.dirname(name) or "."
    where = f" in {os.fspath(folder)}" if folder is not None else ""
    return (f"cannot write{where}: {NOT_WRITABLE[code]}; make it writable, or choose another "
            f"{OUTPUT_OPTION.get(command, 'output folder')}")


def interrupted_message(command: str) -> str:
    """The line for Ctrl-C of a command that set no `INTERRUPTED_HINT`: how a resumable one continues."""
    if command in RESUMABLE:
        return "interrupted; to continue, run the same command again with --resume-from-checkpoint last"
    return "interrupted"


if __name__ == "__main__":
    sys.exit(main())
