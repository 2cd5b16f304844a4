"""`retromae publish`: validate a sentence-transformers folder, then upload it to the Hugging Face Hub.

Validation (`validate_model_folder`), each failure a `ValueError` naming the file and the fix:

* `modules.json` is present and well-formed, every module folder it names exists (a Normalize module has no files,
  so its folder may be absent);
* the Transformer module has `config.json` with a `model_type` transformers knows (or an `auto_map`), weights as
  **safetensors** (`model.safetensors` or a sharded index; pickle `*.bin` / `*.pt` files are refused, in every
  module folder) and tokenizer files;
* remote code: a module type outside `sentence_transformers.*` must be `"<file>.<Class>"` with `<file>.py` at the
  folder root, and so must every file it imports relatively (`from .x import ...`) and every `auto_map` entry of
  config.json; a type naming an installed package (`retromae.modeling...`) is refused, since users do not have it;
* the model card `README.md` exists, its YAML front matter parses (`huggingface_hub.ModelCard`; an error names the
  line), its `model-index` (if any) yields evaluation results, and neither its metadata nor its text holds a local
  path of this machine (`/tmp/...`, `~/...`, `C:\\...`), nor does any JSON file of the folder (vocabularies aside);
* the folder actually loads: `SentenceTransformer(folder, trust_remote_code=<needed>)` (`SparseEncoder` for a
  folder saved as one) and encodes a sentence to a finite vector. A folder that would not load for users is never
  uploaded.

Then `prepare_publish` lists the files the upload would send (`uploading.list_upload`) and refuses a file that looks
like a secret, and files that are no part of a sentence-transformers model unless asked to upload them; then
`uploading.upload_to_hub` (`HfApi().create_repo(repo_id, exist_ok=True)` and `HfApi().upload_folder(...)`; no
network, no login, no write access, a misspelt repo id or a timeout is one `ValueError` line with the fix). The
equivalent without our validation is the Hub CLI (huggingface_hub >= 1.0; `huggingface-cli` no longer exists)::

    hf auth login
    hf upload my-org/my-model ./my-model .
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.utils import HFValidationError, validate_repo_id
from sentence_transformers import SentenceTransformer, SparseEncoder
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from ..inputs.errors import one_line_message, yaml_error_message
from ..inputs.folders import TOKENIZER_VOCAB_FILES, is_hub_id, is_local_path
from ..inputs.parameters import list_parameter
from .cards import find_local_paths
from .uploading import (
    UploadListing,
    exclude_pattern,
    left_out_of_upload,
    list_upload,
    secret_problem,
    upload_to_hub,
)

logger = logging.getLogger(__name__)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import\s", re.MULTILINE)
CARD_FIX = "fix the metadata block (a YAML mapping between the --- lines) at the top of README.md"


@dataclass
class ValidationReport:
    """What `validate_model_folder` found."""

    folder: Path
    needs_remote_code: bool
    remote_code_files: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    embedding_dim: int | None = None
    card_metadata: dict[str, Any] = field(default_factory=dict)
    module_paths: list[str] = field(default_factory=list)  # modules.json's, "" for the folder root
    model_class: str = "SentenceTransformer"  # or "SparseEncoder": the class that loads it
    listing: UploadListing | None = None  # what the upload sends


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{what} is not valid JSON: {error}") from None


def _check_modules(folder: Path) -> list[dict[str, Any]]:
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        raise ValueError(
            f"{folder} has no modules.json: it is not a sentence-transformers folder (without it "
            "sentence-transformers would guess mean pooling); export it with `retromae export` or save it with "
            "SentenceTransformer.save"
        )
    modules = _read_json(modules_file, "modules.json")
    if not isinstance(modules, list) or not modules or not all(
        isinstance(m, dict) and isinstance(m.get("type"), str) and isinstance(m.get("path"), str) for m in modules
    ):
        raise ValueError('modules.json must be a non-empty list of {"idx", "name", "path", "type"} entries')
    for module in modules:
        if not (folder / module["path"]).is_dir() and not _has_no_files(module):
            raise ValueError(f"modules.json names module folder {module['path']!r}, which does not exist")
    return modules


def _has_no_files(module: dict[str, Any]) -> bool:
    """sentence-transformers' Normalize saves nothing: an export may leave its folder out, and the Hub, which
    stores no empty folder, always does; the model loads without it."""
    return module["type"].startswith("sentence_transformers.") and module["type"].endswith(".Normalize")


def _check_weights(folder: Path, modules: list[dict[str, Any]]) -> None:
    for module in modules:
        module_dir = folder / module["path"]
        if not module_dir.is_dir():  # a module without files (`_has_no_files`)
            continue
        pickles = sorted(p.name for p in module_dir.iterdir() if p.suffix in PICKLE_SUFFIXES)
        where = module["path"] or "the folder root"
        if pickles:
            raise ValueError(
                f"{where} holds pickle weights ({', '.join(pickles)}); publish safetensors only "
                "(model.save_pretrained / SentenceTransformer.save write model.safetensors) and remove the pickles"
            )
        if module["type"].endswith("Transformer"):
            if not (module_dir / "config.json").is_file():
                raise ValueError(f"{where} has no config.json for the Transformer module")
            config_name = (Path(module["path"]) / "config.json").as_posix()
            _check_model_type(_read_json(module_dir / "config.json", config_name), config_name)
            index = module_dir / "model.safetensors.index.json"
            if index.is_file():
                shards = set(_read_json(index, "model.safetensors.index.json").get("weight_map", {}).values())
                missing = sorted(s for s in shards if not (module_dir / s).is_file())
                if missing:
                    raise ValueError(f"weight shards listed in model.safetensors.index.json are missing: {missing}")
            elif not (module_dir / "model.safetensors").is_file():
                raise ValueError(f"{where} has no model.safetensors (the Transformer's weights)")
            if not any((module_dir / name).is_file() for name in TOKENIZER_VOCAB_FILES):
                raise ValueError(
                    f"{where} has no tokenizer files ({', '.join(TOKENIZER_VOCAB_FILES[:2])}, ...); save the tokenizer "
                    "next to the weights (tokenizer.save_pretrained)"
                )
            if not (module_dir / "tokenizer_config.json").is_file():
                raise ValueError(f"{where} has no tokenizer_config.json")


def _check_model_type(config: Any, config_name: str) -> None:
    """A Transformer config whose model_type transformers does not know loads only through its own code
    (auto_map)."""
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in CONFIG_MAPPING and not (isinstance(config, dict) and config.get("auto_map")):
        raise ValueError(
            f"{config_name}: model_type {model_type!r} is not one transformers {transformers.__version__} knows "
            f"and the config has no auto_map; give the base's model_type (e.g. 'bert') or ship the model's code"
        )


def _check_remote_code(folder: Path, modules: list[dict[str, Any]]) -> list[str]:
    needed: list[str] = []
    for module in modules:
        type_name = module["type"]
        if type_name.startswith("sentence_transformers."):
            continue
        stem, _, class_name = type_name.rpartition(".")
        if not stem or "." in stem:
            raise ValueError(
                f"modules.json references {type_name!r}, a class of an installed package: users without that package "
                f"cannot load the model. Put the module's file at the folder root and reference it as "
                f"'<file>.<Class>' (for DupMAE: retromae.trainers.export.dupmae.save_dupmae_sentence_transformer)"
            )
        needed.append(f"{stem}.py")
    config_file = folder / "config.json"
    if config_file.is_file():
        auto_map = _read_json(config_file, "config.json").get("auto_map") or {}
        for reference in auto_map.values():
            reference = reference[0] if isinstance(reference, list) else reference
            if isinstance(reference, str) and "--" not in reference:  # "repo--file.Class" lives elsewhere
                needed.append(reference.rsplit(".", 1)[0] + ".py")
    checked: list[str] = []
    queue = list(dict.fromkeys(needed))
    while queue:
        name = queue.pop(0)
        if name in checked:
            continue
        path = folder / name
        if not path.is_file():
            raise ValueError(
                f"remote code file {name} is missing from the folder root (referenced by modules.json / config.json or "
                "imported by another remote-code file); copy it next to modules.json"
            )
        checked.append(name)
        queue += [f"{m}.py" for m in RELATIVE_IMPORT.findall(path.read_text(encoding="utf-8"))]
    return checked


def _check_card(folder: Path) -> dict[str, Any]:
    readme = folder / "README.md"
    if not readme.is_file():
        raise ValueError(f"{folder} has no model card (README.md); `retromae finetune` / `retromae export` write one")
    text = readme.read_text(encoding="utf-8")
    if not text.startswith("---"):
        raise ValueError("README.md has no YAML metadata block (--- ... ---) at the top")
    if not REGEX_YAML_BLOCK.search(text):
        raise ValueError("README.md: the metadata block opened by '---' on line 1 is never closed; add a line '---' "
                         "after its last field")
    card = _parse_card(text)
    metadata = card.data.to_dict()
    if not metadata.get("library_name"):
        raise ValueError("README.md metadata has no library_name (sentence-transformers)")
    if "model-index" in text and not card.data.eval_results:
        raise ValueError("README.md has a model-index block without readable evaluation results")
    _check_metadata_paths(metadata, folder)
    _check_text_paths(text)
    return metadata


def _parse_card(text: str) -> ModelCard:
    """The card of README.md's text; a YAML error names the card's line and the parser's reason."""
    try:
        return ModelCard(text)
    except yaml.YAMLError as error:
        block = REGEX_YAML_BLOCK.search(text)  # the front matter ModelCard parsed: its lines start after `---`
        first_line = text[:block.start(2)].count("\n") + 1 if block else 1
        raise ValueError(f"{yaml_error_message('README.md', error, first_line=first_line)}; {CARD_FIX}") from None
    except Exception as error:  # front matter that is not a mapping, malformed model-index
        raise ValueError(f"README.md metadata does not parse: {one_line_message(error)}; {CARD_FIX}") from None


def _check_text_paths(text: str) -> None:
    """Refuse an absolute local path anywhere in the card: the card is public, and the path (a corpus file, a
    checkpoint) means nothing to a reader and discloses this machine's layout."""
    found = find_local_paths(text)
    if found:
        line, path = found[0]
        raise ValueError(
            f"README.md line {line} contains a local path of this machine ({path}); edit README.md to name it by a "
            "Hub id or a plain name, or re-export with public names (`retromae pretrain --corpus-name NAME`, "
            "`retromae export --model-name OWNER/NAME`)"
        )


def _check_metadata_paths(metadata: Any, folder: Path, field_name: str = "") -> None:
    """Refuse a local path in any metadata field (base_model, datasets, model-index names, ...): on the Hub it
    would be a link to a page that does not exist, and it discloses this machine's layout."""
    if isinstance(metadata, dict):
        for key, value in metadata.items():
            _check_metadata_paths(value, folder, f"{field_name}.{key}" if field_name else str(key))
    elif isinstance(metadata, list):
        for i, value in enumerate(metadata):
            _check_metadata_paths(value, folder, f"{field_name}[{i}]")
    elif isinstance(metadata, str) and is_local_path(metadata, beside=folder.resolve().parent):
        raise ValueError(
            f"README.md metadata field {field_name!r} is a local path ({metadata!r}); use a Hub id (owner/name) or "
            "remove the field (a local base model is described in the card text, not in the metadata)"
        )


MAX_SCANNED_JSON_BYTES = 1 << 20  # settings and results files; tokenizer.json and vocabularies are larger or skipped


def _check_json_paths(folder: Path, uploaded: Iterable[str]) -> None:
    """Refuse an uploaded JSON file that records a local path of this machine (e.g. the `summary.json` of an
    evaluation written into the folder). Vocabularies are not scanned (their tokens are text)."""
    for relative in uploaded:
        path = folder / relative
        if (path.suffix != ".json" or path.name in ("tokenizer.json", "vocab.json")
                or path.stat().st_size > MAX_SCANNED_JSON_BYTES):
            continue
        found = _local_path_in(_read_json(path, relative))
        if found is not None:
            raise ValueError(f"{relative} records a local path of this machine ({found}) and would be uploaded; remove "
                             f"that file (or the field), or leave it out with --exclude {exclude_pattern(relative)}")


def _local_path_in(value: Any) -> str | None:
    """The first absolute local path among the strings of a parsed JSON value; None when there is none."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list):
        return next((found for item in value if (found := _local_path_in(item)) is not None), None)
    if isinstance(value, str) and "\n" not in value:
        found = find_local_paths(value)
        return found[0][1] if found else None
    return None


def _model_class(folder: Path) -> type[SentenceTransformer]:
    """The class that loads `folder`: SparseEncoder for a folder saved as one (config_sentence_transformers.json
    `model_type`; SentenceTransformer would load it as a dense model, with a warning), else SentenceTransformer."""
    config_file = folder / "config_sentence_transformers.json"
    config = _read_json(config_file, config_file.name) if config_file.is_file() else {}
    is_sparse = isinstance(config, dict) and config.get("model_type") == "SparseEncoder"
    return SparseEncoder if is_sparse else SentenceTransformer


def _check_loads(folder: Path, trust_remote_code: bool) -> tuple[str, int]:
    """The class that loads `folder` and the dimension of its vectors (a SparseEncoder's: its vocabulary size)."""
    model_class = _model_class(folder)
    call = f"{model_class.__name__}({folder.name!r}{', trust_remote_code=True' if trust_remote_code else ''})"
    try:
        model = model_class(str(folder), trust_remote_code=trust_remote_code, device="cpu")
        vector = model.encode_document(["A short test sentence."], convert_to_tensor=True, show_progress_bar=False)[0]
    except Exception as error:  # anything that stops a user from loading it
        message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
        raise ValueError(f"the folder does not load with {call}: {type(error).__name__}: {message}") from None
    vector = vector.to_dense() if vector.is_sparse else vector
    if not bool(vector.float().isfinite().all()):
        raise ValueError(f"{call} loads but encodes a test sentence to non-finite values")
    _check_tokenizer_vocabulary(model, call)
    return model_class.__name__, int(vector.shape[-1])


def _check_tokenizer_vocabulary(model: Any, call: str) -> None:
    """A tokenizer saved from a half-written checkpoint knows only its special tokens: every word becomes [UNK]."""
    tokenizer = getattr(model, "tokenizer", None)
    unk = getattr(tokenizer, "unk_token_id", None)
    if tokenizer is None or unk is None:
        return
    ids = tokenizer("A short test sentence about dense retrieval.", add_special_tokens=False)["input_ids"]
    if ids and all(i == unk for i in ids):
        raise ValueError(
            f"{call} maps every word of a test sentence to {tokenizer.unk_token} (its tokenizer has {len(tokenizer)} "
            "tokens): the tokenizer is incomplete, e.g. exported from a checkpoint killed mid-save; export again "
            "from a complete checkpoint"
        )


def validate_model_folder(folder: str | os.PathLike, *, load: bool = True,
                          exclude: Sequence[str] = ()) -> ValidationReport:
    """Check that `folder` is a complete, loadable sentence-transformers folder with a valid model card, and that no
    file the upload sends (`exclude`: more `upload_folder` ignore patterns) records a local path.

    Args:
        folder: the folder to publish.
        load: also load it (`SentenceTransformer`, or `SparseEncoder` for a folder saved as one) and encode a
            sentence (the final, decisive check).
        exclude: as `prepare_publish`'s.

    Raises:
        ValueError: the first problem found.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    modules = _check_modules(folder)
    _check_weights(folder, modules)
    remote_files = _check_remote_code(folder, modules)
    needs_remote = any(not m["type"].startswith("sentence_transformers.") for m in modules)
    metadata = _check_card(folder)
    module_paths = [m["path"] for m in modules]
    listing = list_upload(folder, exclude, module_paths, remote_files)
    _check_json_paths(folder, listing.files)
    if needs_remote and "custom_code" not in (metadata.get("tags") or []):
        logger.warning("README.md: the model needs trust_remote_code=True; consider the 'custom_code' tag")
    report = ValidationReport(folder, needs_remote, remote_files, [m["type"] for m in modules], None, metadata,
                              module_paths, listing=listing)
    if load:
        report.model_class, report.embedding_dim = _check_loads(folder, needs_remote)
    return report


def prepare_publish(folder: str | os.PathLike, repo_id: str, *, exclude: Sequence[str] = (),
                    allow_extra_files: bool = False) -> tuple[ValidationReport, UploadListing]:
    """Everything `publish` does before uploading: check `repo_id`, validate `folder`, and list what the upload would
    send (`exclude`: more `upload_folder` ignore patterns, e.g. "eval/").

    Raises:
        ValueError: a validation problem; a file of the upload that looks like a secret (`*.env`, a key, a token);
            files that are no part of a sentence-transformers model, unless `allow_extra_files`.
    """
    check_repo_id(repo_id)
    exclude = list_parameter("publish", "exclude", exclude)
    report = validate_model_folder(folder, exclude=exclude)
    folder, listing = Path(folder), report.listing
    left_out = left_out_of_upload(folder, listing, report.module_paths, report.remote_code_files)
    if left_out:
        raise ValueError(f"--exclude {' '.join(exclude)} leaves out {', '.join(left_out[:5])}"
                         f"{' ...' if len(left_out) > 5 else ''}, which loading the model reads: the uploaded model "
                         "would not load; narrow the patterns to the files that are no part of the model")
    secret = secret_problem(folder, list(listing.files))
    if secret is not None:
        path, why = secret
        raise ValueError(f"{folder}/{path} {why} and would be uploaded; move it out of {folder}, or leave it out "
                         f"with --exclude {exclude_pattern(path)}")
    if listing.extra and not allow_extra_files:
        raise ValueError(f"{folder} holds files that are no part of a sentence-transformers model and would be "
                         f"uploaded: {listing.extras_text()}; remove them, leave them out with --exclude PATTERN (a "
                         "folder as NAME/), or upload them too with --allow-extra-files true")
    return report, listing


def publish(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    private: bool | None = None,
    revision: str | None = None,
    commit_message: str | None = None,
    create_pr: bool = False,
    dry_run: bool = False,
    exclude: Sequence[str] = (),
    allow_extra_files: bool = False,
) -> tuple[ValidationReport, Any]:
    """`prepare_publish`, then create the repo (if needed) and upload the folder (`uploading.upload_to_hub`).

    Returns:
        `(report, commit_info)`; `commit_info` is None with `dry_run=True`.
    """
    report, _ = prepare_publish(folder, repo_id, exclude=exclude, allow_extra_files=allow_extra_files)
    if dry_run:
        return report, None
    return report, upload_to_hub(Path(folder), repo_id, exclude=exclude, private=private, revision=revision,
                                 commit_message=commit_message, create_pr=create_pr)


def repo_id_problem(repo_id: str) -> str | None:
    """What makes `repo_id` one the Hub refuses, with the fix (the rules of huggingface_hub's `validate_repo_id`,
    which says only which rule of several broke), or None when it looks like `owner/name`."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        return None  # `check_repo_id` asks for owner/name
    for role, part in zip(("owner", "name"), parts, strict=True):
        others = sorted(set(re.sub(r"[\w.-]", "", part)))
        if others:
            return (f"the {role} {part!r} contains {', '.join(map(repr, others))}; use letters, digits, '-', '_' "
                    "and '.'")
        for end, char in (("starts", part[0]), ("ends", part[-1])):
            if char in "-.":
                return f"the {role} {part!r} {end} with {char!r}; start and end it with a letter or digit"
        pair = next((pair for pair in ("--", "..") if pair in part), None)
        if pair:
            return f"the {role} {part!r} contains {pair!r}, which the Hub refuses; use a single {pair[0]!r}"
        if len(part) > 96:
            return f"the {role} has {len(part)} characters; the Hub takes at most 96"
    if repo_id.endswith(".git"):
        return "the name ends with '.git', which the Hub refuses; drop it"
    return None


def check_repo_id(repo_id: str) -> None:
    """Refuse, in one line naming what is wrong, a repo id the Hub would refuse (or read as another kind of id)."""
    problem = repo_id_problem(repo_id)
    if problem:
        raise ValueError(f"repo id {repo_id!r} is not one the Hub accepts: {problem}")
    if not is_hub_id(repo_id):
        raise ValueError(f"repo id {repo_id!r} must look like 'owner/name' (your user or organisation name first)")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:  # a rule `repo_id_problem` does not know
        raise ValueError(f"repo id {repo_id!r} is not one the Hub accepts: {error}") from None


def check_model_name(name: str, flag: str = "--model-name") -> None:
    """Refuse a card's model name that no Hub repository can have: the card's usage lines load `<your-org>/NAME`
    (or OWNER/NAME as given)."""
    repo_id = name if "/" in name else f"your-org/{name}"
    problem = ("it has more than one '/'; give NAME or OWNER/NAME" if repo_id.count("/") > 1
               else repo_id_problem(repo_id))
    if problem:
        raise ValueError(f"{flag} {name!r} cannot name a Hub repository: {problem}")


__all__ = [
    "ValidationReport", "check_model_name", "check_repo_id", "prepare_publish", "publish", "repo_id_problem",
    "validate_model_folder",
]
