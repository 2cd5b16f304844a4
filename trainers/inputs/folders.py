"""Model folders on disk and model names: refuse incomplete folders, tell local paths from Hub ids.

* `check_model_folder(path, purpose=...)`: every command that reads a local model folder calls it first. A run killed
  mid-save leaves weights without a tokenizer vocabulary; transformers then silently loads a 5-token tokenizer
  (every word becomes [UNK]), so such a folder must be refused, not loaded. Hub ids pass through.
* `is_local_path`, `is_hub_id`, `model_location`, `public_name`: what a name means and how results and cards name it.
* `hub_id_of_model(path_or_id)`: what a model card may call a starting model: a Hub id, never a local path.
* `COMMAND_INPUTS`, `INTERRUPTED_HINT`: what the running command reads, and what Ctrl-C says.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from types import MappingProxyType

from huggingface_hub import ModelCard
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .errors import UserError

logger = logging.getLogger(__name__)


# Files that carry a tokenizer's vocabulary. `tokenizer_config.json` alone is not enough: without one of these,
# AutoTokenizer falls back to a tokenizer with only the special tokens.
TOKENIZER_VOCAB_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
)


# file names, never Hub ids (`data/corpus.jsonl` looks like `owner/name` otherwise)
FILE_SUFFIXES = (".jsonl", ".json", ".tsv", ".csv", ".txt", ".parquet", ".arrow", ".safetensors", ".bin", ".pt")
TRAINER_CHECKPOINT = re.compile(r"^checkpoint-\d+$")
TRAINER_STATE_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")
KILLED_SAVE_HINT = (
    "it was probably written by a run killed mid-save; use another checkpoint (e.g. the previous checkpoint-N) "
    "or save it again"
)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name


# what only a path looks like: absolute (/x, ~/x, C:\x), explicitly relative (./x, ../x), backslashes, /./ or /../
LOCAL_PATH = re.compile(r"^(/|~|\.{1,2}[/\\]|[A-Za-z]:[/\\])|\\|/\.{1,2}(/|$)")
_HF_CACHE_REPO = re.compile(r"^models--(?P<id>[\w.-]+(--[\w.-]+)?)$")  # huggingface_hub's cache folder names


# what the running command reads besides its options' inputs (its `--config` file, set by `inputs.arguments.parse`;
# `cli.main` runs each command in a context of its own): no output may replace it, whatever the flags
COMMAND_INPUTS: ContextVar[Mapping[str, str]] = ContextVar("command_inputs", default=MappingProxyType({}))


# what `cli.main` says when Ctrl-C stops the running command (set by `pretrain` once its output folder is known:
# where the run continues)
INTERRUPTED_HINT: ContextVar[Callable[[], str] | None] = ContextVar("interrupted_hint", default=None)


def is_local_path(value: str | os.PathLike, *, beside: Path | None = None) -> bool:
    """Whether a name means something on this machine rather than a Hub id (`owner/name`) or a URL.

    Always local: what only a path looks like (absolute `/x`, `~/x`, `C:\\x`, explicitly relative `./x`, `../x`,
    backslashes) and data or weight file names (`corpus.jsonl`). Never local: URLs and multi-line text.

    Args:
        value: the name.
        beside: None for a name given as a model or a path (local when it exists, or has more than one slash, which no
            Hub id has). For a name read from a document in the folder `beside` (e.g. model-card metadata): prose and
            plain names are not paths, and `owner/name` is local only when it exists from the working directory or
            beside that folder.
    """
    text = os.fspath(value).strip()
    if not text or "://" in text or "\n" in text:
        return False
    if LOCAL_PATH.search(text) or text.lower().endswith(FILE_SUFFIXES):
        return True
    if beside is None:
        return _exists(Path(text)) or text.count("/") > 1
    if " " in text or "/" not in text:
        return False
    return text.count("/") > 1 or any(_exists(base / text) for base in (Path.cwd(), beside))


def _exists(path: Path) -> bool:
    """`path.exists()`, False where the file system refuses to look the name up (a name too long for it, a
    component without search permission): such a name is no existing path."""
    try:
        return path.exists()
    except OSError:
        return False


def missing_model_files(folder: Path, *, tokenizer: bool = True, weights: bool = True) -> list[str]:
    """The files (or alternatives, joined by ' or ') a complete model folder has and `folder` lacks; `weights`:
    require the weights (not for a model built from its config)."""
    missing: list[str] = []
    model_dir = _transformer_dir(folder, missing)
    if not (model_dir / "config.json").is_file():
        missing.append(_rel(model_dir / "config.json", folder))
    if weights:
        missing += _missing_weights(model_dir, folder)
    # a tokenizer_config.json without a vocabulary is half a tokenizer save, required or not
    started = (model_dir / "tokenizer_config.json").is_file()
    if (tokenizer or started) and not any((model_dir / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        missing.append(_rel(model_dir / "tokenizer.json", folder) + " (or another tokenizer vocabulary: "
                       + ", ".join(TOKENIZER_VOCAB_FILES[1:]) + ")")
    if is_trainer_checkpoint(folder) and not (folder / "trainer_state.json").is_file():
        missing.append("trainer_state.json (the Trainer writes it last: the save did not finish)")
    return missing


def is_trainer_checkpoint(folder: Path) -> bool:
    """A Trainer's `checkpoint-N` with its training state (the Trainer writes trainer_state.json after these)."""
    return bool(TRAINER_CHECKPOINT.match(folder.name)) and any(
        (folder / name).is_file() for name in TRAINER_STATE_FILES
    )


def check_model_folder(path_or_id: str | os.PathLike, *, purpose: str, tokenizer: bool = True,
                       weights: bool = True) -> None:
    """Refuse a local model folder that a complete save would not look like (files missing, a safetensors file
    shorter than its header says, a JSON file that does not parse); Hub ids pass through unchecked.

    Args:
        path_or_id: a local folder or a Hub model id.
        purpose: what the folder was given for, for the message (e.g. "--model", "export").
        tokenizer: require a tokenizer vocabulary (False for readers that may take the tokenizer elsewhere; a
            half-saved tokenizer, tokenizer_config.json without a vocabulary, is refused either way).
        weights: require complete weights (False: only the config is read).

    Raises:
        UserError: one line naming the folder, the missing files (or the truncated one) and the fix.
    """
    if not is_local_path(path_or_id):
        return
    folder = Path(path_or_id).expanduser()
    if not folder.exists():
        raise UserError(f"{purpose}: model folder {folder} does not exist")
    if not folder.is_dir():
        raise UserError(f"{purpose}: {folder} is not a folder")
    missing = missing_model_files(folder, tokenizer=tokenizer, weights=weights)
    if missing and not any(f.name in {"config.json", "modules.json"} or f.suffix == ".safetensors"
                           for f in folder.iterdir()):
        raise UserError(f"{purpose}: {folder} is not a model folder: it has no {'; no '.join(missing)}")
    if missing:
        raise UserError(
            f"{purpose}: model folder {folder} is incomplete, it has no {'; no '.join(missing)}; {KILLED_SAVE_HINT}"
        )
    config_file = _transformer_dir(folder, []) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserError(f"{purpose}: {config_file} is not valid JSON ({error}); fix or restore the "
                        "file") from None
    if not isinstance(config, dict):
        raise UserError(f"{purpose}: {config_file} is not a JSON object; fix or restore the file")
    if not weights:
        return
    for file in _module_files(folder, "*.json"):
        try:
            json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            again = ("use an earlier checkpoint-N of the run" if (folder / "trainer_state.json").is_file()
                     else "export the model again" if (folder / "modules.json").is_file() else "save the model again")
            raise UserError(f"{purpose}: {file} is not valid JSON ({error}); restore the file, or {again}") from None
    for file in _module_files(folder, "*.safetensors"):
        problem = safetensors_problem(file)
        if problem:
            raise UserError(f"{purpose}: weights file {file} is incomplete: {problem}; "
                            f"{KILLED_SAVE_HINT} (or download it again)")


def _module_files(folder: Path, pattern: str) -> list[Path]:
    """The files matching `pattern` in a model folder and in every sentence-transformers module folder it lists."""
    folders = {folder, *_module_dirs(folder)}
    return sorted(file for path in folders for file in path.glob(pattern) if file.is_file())


def _module_dirs(folder: Path) -> list[Path]:
    """The existing module folders a sentence-transformers folder's modules.json lists (none for other folders; an
    invalid modules.json is refused by `missing_model_files`)."""
    return [folder / path for _, path in _modules(folder) or [] if path and (folder / path).is_dir()]


def safetensors_problem(file: Path) -> str | None:
    """Why `file` is not a complete safetensors file (a header that cannot be read, or fewer bytes than the header
    describes: a save or download that was killed), or None. Reads the header only, no tensor."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        header_length = int.from_bytes(handle.read(8), "little") if size >= 8 else 0
        if size < 8 or 8 + header_length > size:
            return f"it has {size} bytes, fewer than its header needs"
        try:
            header = json.loads(handle.read(header_length))
            end = max((int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"),
                      default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not readable safetensors JSON"
    if 8 + header_length + end > size:
        return f"it has {size} bytes, its header describes {8 + header_length + end}"
    return None


def _modules(folder: Path) -> list[tuple[str, str]] | None:
    """The (type, path) of each module a sentence-transformers folder's modules.json lists; [] without the file,
    None when it is not a JSON list of modules."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return []
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        return [(str(m.get("type", "")), str(m.get("path", ""))) for m in modules]
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def _transformer_dir(folder: Path, missing: list[str]) -> Path:
    """Where config/weights/tokenizer live: the root, or a sentence-transformers folder's Transformer module path."""
    modules = _modules(folder)
    if modules is None:
        missing.append("valid modules.json (the file is not a JSON list of modules)")
        return folder
    transformer = [p for kind, p in modules if kind.rsplit(".", 1)[-1].endswith("Transformer")]
    return folder / transformer[0] if transformer else folder


def _missing_weights(model_dir: Path, folder: Path) -> list[str]:
    """Nothing when a single weights file is there; else the index's missing shards (or the weights file itself)."""
    for single in ("model.safetensors", "pytorch_model.bin"):
        if (model_dir / single).is_file():
            return []
    index = next((model_dir / f"{single}.index.json" for single in ("model.safetensors", "pytorch_model.bin")
                  if (model_dir / f"{single}.index.json").is_file()), None)
    if index is None:
        return [_rel(model_dir / "model.safetensors", folder) + " (or a model.safetensors.index.json with its shards)"]
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return [f"valid {_rel(index, folder)} (it has no weight_map)"]
    return [f"{_rel(model_dir / shard, folder)} (listed in {index.name})"
            for shard in shards if not (model_dir / shard).is_file()]


def _rel(path: Path, folder: Path) -> str:
    return path.relative_to(folder).as_posix()


def model_location(model: str | os.PathLike) -> str:
    """The absolute path of a local model, else the Hub id: what a results folder records to tell models apart."""
    path = Path(model).expanduser()
    return str(path.resolve()) if _exists(path) else os.fspath(model)


def is_hub_id(name: object) -> bool:
    """`owner/name` as the Hub spells model and dataset ids (our own `local/<name>` labels excluded)."""
    return (isinstance(name, str) and bool(HUB_ID.match(name)) and ".." not in name
            and not name.startswith("local/"))


def check_dataset_ids(flag: str, dataset_ids: list[str] | None) -> None:
    """Refuse an id the Hub would not take as `owner/name` (`validate_repo_id`): the model card's model-index names
    it as a Hub dataset."""
    for dataset_id in dataset_ids or []:
        try:
            validate_repo_id(dataset_id)
            taken = is_hub_id(dataset_id)  # and two parts: no bare name
        except HFValidationError:
            taken = False
        if not taken:
            raise ValueError(f"{flag} {dataset_id!r} is not a Hub dataset id (owner/name: letters, digits, '-', '_' "
                             "and '.', without '--' or '..', at most 96 characters); leave it out for local data")


def hub_id_of_model(path_or_id: str | os.PathLike) -> str | None:
    """The Hub id a model card may name for a starting model, or None.

    A Hub id is returned as is. A local folder is named only by its own Hub id when it records one: a Hugging Face
    cache snapshot (`models--owner--name/snapshots/...`), the `model_name` of its card or run record, or a
    `_name_or_path` in config.json (older transformers wrote it) - never by its path, which would link to a Hub page
    that does not exist. The card's `base_model` is not used: it names the folder's own starting model.
    """
    if not is_local_path(path_or_id):
        return os.fspath(path_or_id) if is_hub_id(os.fspath(path_or_id)) else None
    folder = Path(path_or_id).expanduser().resolve()
    for part in reversed(folder.parts):
        cached = _HF_CACHE_REPO.match(part)
        if cached:
            return cached["id"].replace("--", "/", 1)
    for name in _recorded_names(folder):
        if is_hub_id(name) and not name.startswith("<") and not is_local_path(name):
            return name
    return None


def public_name(path_or_id: str | os.PathLike | None) -> str | None:
    """A Hub id as is; a local path (or anything path-like) reduced to its last component (an existing one resolved
    first, so `.` names its folder)."""
    if not path_or_id:
        return None
    text = os.fspath(path_or_id)
    if is_hub_id(text) and not is_local_path(text) and Path(text).suffix.lower() not in FILE_SUFFIXES:
        return text
    if os.path.exists(text):
        return Path(text).resolve().name or None
    return Path(text.replace("\\", "/")).name or None


def _recorded_names(folder: Path) -> Iterator[str]:
    """Names a folder records for itself: card `model_name`, run-record `model_name`, and config `_name_or_path`
    outside sentence-transformers folders (there it names the transformer's origin, e.g. all-MiniLM-L6-v2's
    nreimers/MiniLM-L6-H384-uncased)."""
    readme = folder / "README.md"
    if readme.is_file():
        yield _card_model_name(readme)
    sources = [("retromae_finetune.json", "model_name")]
    if not (folder / "modules.json").is_file():
        sources.append(("config.json", "_name_or_path"))
    for file, key in sources:
        try:
            yield str(json.loads((folder / file).read_text(encoding="utf-8")).get(key) or "")
        except (OSError, ValueError, AttributeError):
            continue


def _card_model_name(readme: Path) -> str:
    try:
        return str(ModelCard.load(readme).data.to_dict().get("model_name") or "")
    except Exception:  # a hand-written README without (valid) front matter
        return ""


__all__ = [
    "HUB_ID", "TOKENIZER_VOCAB_FILES", "check_dataset_ids", "check_model_folder", "INTERRUPTED_HINT", "hub_id_of_model",
    "is_hub_id",
    "model_location", "public_name", "LOCAL_PATH", "is_local_path", "missing_model_files", "safetensors_problem"
]
