"""What `retromae publish` uploads, and the upload itself.

* `list_upload`: the files `HfApi.upload_folder` sends (every file of the folder less `IGNORE_PATTERNS`, the user's
  `--exclude` patterns and huggingface_hub's own defaults, filtered as `upload_folder` filters them:
  `huggingface_hub.utils.filter_repo_objects`), with their sizes, and those among them that are no part of a
  sentence-transformers model folder (`extra`);
* `secret_problem`: a file that looks like a secret (`*.env`, a key, a Hugging Face token in its text), which
  publishing refuses whatever the flags;
* `upload_to_hub`: `create_repo` + `upload_folder` with the same patterns; the Hub's failures (offline, not logged
  in, no write access, unknown repository, timeout) are one `ValueError` line with the fix.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

try:  # the HTTP client of huggingface_hub 2; hub 1.x, which transformers 5 accepts (GPU images have it), uses httpx
    from httpx2 import TimeoutException, TransportError
except ImportError:
    from httpx import TimeoutException, TransportError
from huggingface_hub import HfApi, constants
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalTokenNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

from ..inputs.errors import one_line_message
from ..inputs.folders import TOKENIZER_VOCAB_FILES

IGNORE_PATTERNS = [".*", "**/.*", "__pycache__/*", "**/__pycache__/*", "*.tmp"]
# the root files of a sentence-transformers folder whose Transformer module sits at the root (module path "")
MODEL_ROOT_FILES = frozenset({
    "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json", "README.md", "config.json",
    "model.safetensors", "model.safetensors.index.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "merges.txt", "chat_template.jinja", "generation_config.json", "retromae_finetune.json",
    "data_config.json",  # the training data list of sentence-transformers' Hub models (all-MiniLM-L6-v2)
    *TOKENIZER_VOCAB_FILES,
})
WEIGHT_SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")
LICENSE_NAMES = ("LICENSE", "LICENCE", "NOTICE")
SECRET_NAMES = ("*.env", "*.pem", "*.key", "id_rsa*", "id_ed25519*")
HF_TOKEN = re.compile(rb"hf_[A-Za-z0-9]{30,}")
MAX_SCANNED_BYTES = 1 << 20  # settings, notes and records; weights and large vocabularies are not scanned
SHOWN_EXTRAS = 5
# what loading a model folder reads in each module folder (and the root), besides its weights and remote code
LOADED_FILES = frozenset({"modules.json", "config.json", "sentence_bert_config.json",
                          "config_sentence_transformers.json", "tokenizer_config.json", "special_tokens_map.json",
                          "model.safetensors.index.json", *TOKENIZER_VOCAB_FILES})


@dataclass(frozen=True)
class UploadListing:
    """The files an upload sends: relative POSIX path -> size in bytes (sorted), and those that are no part of a
    sentence-transformers model folder."""

    files: dict[str, int]
    extra: list[str]

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())

    def lines(self) -> list[str]:
        """One line per file: path, size, and `(extra)` for a file that is no part of the model."""
        extra = set(self.extra)
        return [f"  {path}  {size_text(size)}{'  (extra)' if path in extra else ''}"
                for path, size in self.files.items()]

    def extras_text(self) -> str:
        """The extra files, the first few named, with their count and size."""
        shown = ", ".join(self.extra[:SHOWN_EXTRAS]) + (", ..." if len(self.extra) > SHOWN_EXTRAS else "")
        size = size_text(sum(self.files[path] for path in self.extra))
        return f"{len(self.extra)} file{'s' if len(self.extra) != 1 else ''} ({size}: {shown})"


def size_text(size: int) -> str:
    """A byte count in the Hub's decimal units: 296 B, 4.1 kB, 52.4 MB."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def ignore_patterns(exclude: Sequence[str] = ()) -> list[str]:
    """What `upload_to_hub` passes to `upload_folder` (a new list: `upload_folder` extends the one it gets)."""
    return [*IGNORE_PATTERNS, *exclude]


def list_upload(folder: Path, exclude: Sequence[str], module_paths: Sequence[str],
                remote_code_files: Sequence[str]) -> UploadListing:
    """The files `upload_to_hub(folder, exclude=exclude)` sends; `module_paths` (modules.json's) and
    `remote_code_files` (the validated ones) say which of them belong to the model."""
    found = {path.relative_to(folder).as_posix(): path for path in sorted(folder.glob("**/*")) if path.is_file()}
    kept = filter_repo_objects(list(found), ignore_patterns=[*ignore_patterns(exclude), *DEFAULT_IGNORE_PATTERNS])
    files = {path: found[path].stat().st_size for path in sorted(kept)}
    if not files:
        return UploadListing({}, [])
    module_dirs = tuple(f"{p.strip('/')}/" for p in module_paths if p.strip("/"))
    extra = [path for path in files if not _belongs_to_model(path, module_dirs, set(remote_code_files))]
    return UploadListing(files, extra)


def left_out_of_upload(folder: Path, listing: UploadListing, module_paths: Sequence[str],
                       remote_code_files: Sequence[str]) -> list[str]:
    """The files of `folder` that loading the model reads (`LOADED_FILES`, `*.safetensors` and the remote code in the
    root and each module folder of `module_paths`) and that `listing` does not send: what the patterns left out."""
    needed = set(remote_code_files)
    for module in {"", *(p.strip("/") for p in module_paths)}:
        for path in (folder / module).glob("*"):
            if path.is_file() and (path.name in LOADED_FILES or path.suffix == ".safetensors"):
                needed.add(path.relative_to(folder).as_posix())
    return sorted(needed - set(listing.files))


def exclude_pattern(path: str) -> str:
    """`path` as an `--exclude` value that matches it alone, quoted for a shell (fnmatch's `[`, `*`, `?` escaped)."""
    return shlex.quote(re.sub(r"([\[*?])", r"[\1]", path))


def _belongs_to_model(path: str, module_dirs: tuple[str, ...], remote_code_files: set[str]) -> bool:
    if path.startswith(module_dirs):
        return True
    if "/" in path:  # a folder no module of modules.json names: checkpoint-5/, eval/
        return False
    return (path in MODEL_ROOT_FILES or path in remote_code_files or WEIGHT_SHARD.fullmatch(path) is not None
            or path.startswith(LICENSE_NAMES))


def secret_problem(folder: Path, files: Sequence[str]) -> tuple[str, str] | None:
    """The first of `files` (relative to `folder`) that looks like a secret, and why; None when none does."""
    for path in files:
        name = PurePosixPath(path).name
        pattern = next((p for p in SECRET_NAMES if fnmatch.fnmatch(name, p)), None)
        if pattern is not None:
            return path, f"looks like a secrets file ({pattern})"
        full = folder / path
        if (not name.endswith(".safetensors") and full.stat().st_size <= MAX_SCANNED_BYTES
                and HF_TOKEN.search(full.read_bytes())):
            return path, "holds what looks like a Hugging Face token (hf_...)"
    return None


def upload_to_hub(folder: Path, repo_id: str, *, exclude: Sequence[str] = (), private: bool | None = None,
                  revision: str | None = None, commit_message: str | None = None, create_pr: bool = False) -> Any:
    """Create the repository if needed and upload `folder` (the files `list_upload` lists); returns the commit."""
    api = HfApi()
    with _hub_errors(repo_id, "create the repository"):
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    with _hub_errors(repo_id, "upload the folder to"):
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=revision,
            commit_message=commit_message or f"Upload {folder.name} with retromae publish",
            create_pr=create_pr,
            ignore_patterns=ignore_patterns(exclude),
        )


@contextmanager
def _hub_errors(repo_id: str, action: str) -> Iterator[None]:
    """Turn what the Hub call raises when offline, not logged in, without write access, for a missing repository or
    on a timeout into one `ValueError` line saying what failed and the fix (raised from the Hub's error, which
    RETROMAE_DEBUG=1 shows); other errors pass unchanged."""
    failed = f"could not {action} {repo_id}"
    try:
        yield
    except RepositoryNotFoundError as error:  # also the Hub's answer to a missing or invalid token
        raise ValueError(
            f"{failed}: the Hub does not know the repository or you may not access it; check the spelling of the "
            f"repo id (OWNER/NAME, --repo-id) and that you are logged in (`hf auth login`) as {repo_id.split('/')[0]} "
            "or a member of that organisation"
        ) from error
    except HfHubHTTPError as error:
        raise ValueError(f"{failed}: {_http_failure(error, repo_id)}") from error
    except OfflineModeIsEnabled as error:
        raise ValueError(
            f"{failed}: HF_HUB_OFFLINE is set; unset it to upload (to validate only: --dry-run)"
        ) from error
    except LocalTokenNotFoundError as error:
        raise ValueError(f"{failed}: you are not logged in; run `hf auth login` (or set HF_TOKEN)") from error
    except TimeoutException as error:
        raise ValueError(
            f"{failed}: the Hub ({constants.ENDPOINT}) did not answer in time ({type(error).__name__}); check the "
            "network connection, then run the command again"
        ) from error
    except TransportError as error:  # connection refused, DNS failure, proxy error
        raise ValueError(
            f"{failed}: cannot reach the Hub ({constants.ENDPOINT}): {one_line_message(error)}; check the network "
            "connection (and HTTPS_PROXY / HF_ENDPOINT if set), then run the command again"
        ) from error


def _http_failure(error: HfHubHTTPError, repo_id: str) -> str:
    """What an HTTP error status means for an upload, and the fix."""
    status = error.response.status_code
    server = f" (the Hub says: {' '.join(error.server_message.split())})" if error.server_message else ""
    if status == 401:
        return f"you are not logged in or your token is invalid{server}; run `hf auth login`"
    if status == 403:
        return (f"your token may not write to {repo_id}{server}; check the owner in the repo id (--repo-id) and log "
                "in (`hf auth login`) with a token that has write access to it")
    return f"the Hub answered HTTP {status}{server}; run the command again later (RETROMAE_DEBUG=1 shows the details)"


__all__ = [
    "IGNORE_PATTERNS", "UploadListing", "exclude_pattern", "ignore_patterns", "left_out_of_upload", "list_upload",
    "secret_problem", "size_text", "upload_to_hub",
]
