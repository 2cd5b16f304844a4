"""The files of a saved hybrid index, written to a temporary sibling and renamed into place::

    manifest.json        format, model fingerprint, dims, k, document count, index parameters, per-file bytes + sha256
    dense.faiss          the faiss index (absent when the representation has no dense part)
    sparse_indptr.npy    CSR row pointers (int64, num_documents + 1)
    sparse_indices.npy   vocabulary ids (int32, num_documents * doc_top_k)
    sparse_data.npy      weights (float32, num_documents * doc_top_k)
    ids.json             document ids, in index order

`manifest.json` names the `engine` that built the index: "faiss" (`HybridIndex`, the default; absent in older
manifests) or "qdrant" (`engine_qdrant.QdrantHybridIndex`: a `qdrant/` storage folder + ids.json instead).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..inputs.io import file_sha256
from ..inputs.outputs import Holding, Inputs, claim_output, clean_stale_siblings

FORMAT = "retromae-hybrid-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_KEYS = ("model_fingerprint", "dense_dim", "vocab_size", "doc_top_k", "num_documents", "index_type",
                 "index_params", "files")
DENSE_FILE = "dense.faiss"
SPARSE_FILES = ("sparse_indptr.npy", "sparse_indices.npy", "sparse_data.npy")
IDS_FILE = "ids.json"
ENGINES = ("faiss", "qdrant")
DEFAULT_ENGINE = "faiss"


def claim_index_folder(folder: Path, overwrite: bool, inputs: Inputs | None = None) -> None:
    """`claim_output` for an index folder, after restoring what a killed rebuild left: `overwrite` replaces an
    index only, never other files."""
    clean_stale_siblings(folder)  # a rebuild killed mid-swap: its previous index comes back before it is judged
    claim_output(folder, "--output-dir", overwrite, inputs=inputs, owner=index_holding)


def index_holding(folder: Path) -> Holding:
    if (folder / MANIFEST).is_file():
        return "", False  # an index: refused without --overwrite as any non-empty folder
    return f"files but no hybrid index (no {MANIFEST})", True


def write_manifest(folder: Path, files: list[str], fields: dict[str, Any]) -> None:
    """`MANIFEST` in `folder`: our format, `fields` and the bytes and sha256 of each of `files` (written already)."""
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **fields,
                "files": {name: {"bytes": (folder / name).stat().st_size, "sha256": file_sha256(folder / name)}
                          for name in files}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def index_engine(folder: Path) -> str:
    """The engine that built the index in `folder` (`DEFAULT_ENGINE` when its manifest is missing, unreadable or
    names none: `read_manifest` then says what is wrong)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return DEFAULT_ENGINE
    engine = manifest.get("engine", DEFAULT_ENGINE) if isinstance(manifest, dict) else DEFAULT_ENGINE
    return engine if engine in ENGINES else DEFAULT_ENGINE


def read_manifest(folder: Path, verify_checksums: bool = True, engine: str = DEFAULT_ENGINE) -> dict[str, Any]:
    """The manifest of the index in `folder`, once every file it lists is there with its size (and checksum), and
    once it says the index was built by `engine`.

    Raises:
        FileNotFoundError: the folder, its manifest or one of its files is missing (the message names it).
        ValueError: a file is truncated / has the wrong size or checksum, the manifest is not ours, or another
            engine built the index.
    """
    clean_stale_siblings(folder)  # a rebuild killed mid-swap left the index beside its place
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{manifest_path} is missing: {folder} is not a hybrid index folder (see HybridIndex.save)"
        )
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{manifest_path} is not valid JSON ({error}); the index folder is corrupted"
        ) from error
    if not isinstance(manifest, dict):
        raise ValueError(f"{manifest_path} is not a JSON object; the index folder is corrupted: rebuild it")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{manifest_path}: format {manifest.get('format')!r} v{manifest.get('format_version')}, "
            f"expected {FORMAT!r} v{FORMAT_VERSION}"
        )
    built = manifest.get("engine", DEFAULT_ENGINE)
    if built != engine:
        raise ValueError(f"{folder} was built with engine {built!r}, not {engine!r}: open it with "
                         "retromae.trainers.retrieval.engine_qdrant.load_index (or retromae search)")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    files = manifest.get("files")
    if missing or not isinstance(files, dict) or not all(
            isinstance(meta, dict) and {"bytes", "sha256"} <= set(meta) for meta in files.values()):
        raise ValueError(f"{manifest_path} lacks {', '.join(missing) or 'the sizes and checksums of files'}; "
                         "the index folder is corrupted: rebuild it")
    for name, meta in files.items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"index file {name} is missing from {folder}; rebuild or re-copy the index")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise ValueError(
                f"index file {name} in {folder} has {size} bytes, the manifest says {meta['bytes']}: "
                "truncated or replaced; rebuild or re-copy the index"
            )
        if verify_checksums and file_sha256(path) != meta["sha256"]:
            raise ValueError(f"index file {name} in {folder} does not match its sha256 checksum: corrupted")
    return manifest
