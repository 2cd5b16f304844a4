"""Loading sentence-transformers models, and saving them without a pooler.

`load_sentence_transformer(path_or_id, ...)`: a `SentenceTransformer`, CLS pooling + dot product for a folder without
modules.json.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from retromae.modeling.loading import ShapeMismatchError, held_load_report
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

from .checkpoints import CheckpointError, encoder_kwargs, needs_remote_code
from .errors import one_line_message
from .folders import check_model_folder, is_local_path
from .io import read_json_or_empty, write_json_atomic

logger = logging.getLogger(__name__)

# the similarity a pooling implies when nothing says otherwise: CLS with the dot product (the papers' BEIR protocol),
# mean pooling with cosine (sentence-transformers' bases such as all-MiniLM-L6-v2)
POOLING_SIMILARITY = {"cls": "dot", "mean": "cosine"}
NO_MODULES_WARNING = (
    "{model} has no modules.json (it is not a sentence-transformers folder): assuming {pooling} pooling and the "
    "{similarity} product. RetroMAE-style pre-training trains the last-layer [CLS] state as the sentence embedding "
    "and the papers' BEIR protocol scores with [CLS] + dot product; sentence-transformers' own default for such a "
    "folder is MEAN pooling, which averages token states that were never trained as an embedding and gives wrong "
    "(lower) BEIR numbers. Pass --pooling mean only for a model that was trained with mean pooling."
)


def save_without_pooler(model: SentenceTransformer, folder: str | os.PathLike) -> None:
    """After `model.save(folder)`: a BERT encoder built without a pooler (the [CLS] state is used as it is) keeps
    loading without one. sentence-transformers does not save `model_kwargs`, and would add a randomly initialised
    pooler, reported as MISSING, when the folder is loaded."""
    config_file = Path(folder) / "sentence_bert_config.json"
    if config_file.is_file() and getattr(getattr(model[0], "auto_model", None), "pooler", True) is None:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config.setdefault("model_kwargs", {})["add_pooling_layer"] = False
        write_json_atomic(config_file, config)


def check_pooling(pooling: str | None, similarity: str | None = None) -> None:
    """Refuse a pooling or similarity that an export cannot have (`POOLING_SIMILARITY`); None passes."""
    if pooling is not None and pooling not in POOLING_SIMILARITY:
        raise CheckpointError(f"pooling {pooling!r}: give one of {', '.join(POOLING_SIMILARITY)}")
    if similarity is not None and similarity not in POOLING_SIMILARITY.values():
        raise CheckpointError(f"similarity {similarity!r}: give one of {', '.join(POOLING_SIMILARITY.values())}")


def load_sentence_transformer(path_or_id: str | os.PathLike, *, pooling: str | None = None,
                              device: str | None = None) -> SentenceTransformer:
    """A `SentenceTransformer` from a folder or Hub id.

    Args:
        path_or_id: a sentence-transformers folder (modules.json; remote-code modules are trusted when modules.json
            references them), a plain transformers encoder folder (Transformer + `pooling`, CLS by default, with a
            warning), or a Hub id.
        pooling: only for folders without modules.json: "cls" (default, with the dot product) or "mean" (cosine,
            with a Normalize module, as `retromae export --pooling mean` writes it).
        device: torch device (default: sentence-transformers' choice).

    Raises:
        UserError: an incomplete local folder.
        CheckpointError: the folder cannot be loaded, or `pooling` is given for a sentence-transformers folder.
    """
    check_pooling(pooling)
    path = Path(path_or_id).expanduser()
    if not path.is_dir():
        if path.exists():
            raise CheckpointError(f"--model {path_or_id} is a file; give the model's folder")
        if is_local_path(path_or_id):
            raise CheckpointError(f"model folder {path_or_id} does not exist")
        try:
            return SentenceTransformer(str(path_or_id), device=device)
        except Exception as error:  # offline / unknown id: the hub message says which
            raise CheckpointError(f"model {str(path_or_id)!r} is no local folder and cannot be loaded from the Hub "
                                  f"({one_line_message(error)}); check the path or the Hub id") from None
    check_model_folder(path, purpose="--model")
    if (path / "modules.json").is_file():
        if pooling is not None:
            raise CheckpointError(
                f"--pooling applies to folders without modules.json; {path.name} is a sentence-transformers folder "
                "and keeps its own pooling"
            )
        try:
            with held_load_report(path):
                return SentenceTransformer(str(path), trust_remote_code=needs_remote_code(path), device=device)
        except ShapeMismatchError:
            raise
        except Exception as error:  # a module's file missing or damaged: its loader fails with anything
            raise CheckpointError(
                f"cannot load the sentence-transformers folder {path} ({type(error).__name__}: "
                f"{one_line_message(error)}); a module's files are missing or damaged: export the model again"
            ) from None
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path.name} holds neither modules.json nor config.json; not a model folder")
    pooling = pooling or "cls"
    similarity = POOLING_SIMILARITY[pooling]
    logger.warning(NO_MODULES_WARNING.format(model=path.name, pooling=pooling.upper(), similarity=similarity))
    model_type = read_json_or_empty(path / "config.json").get("model_type")
    try:
        with held_load_report(path):
            transformer = Transformer(str(path), model_kwargs=encoder_kwargs(model_type))
    except ShapeMismatchError:
        raise
    except Exception as error:  # e.g. a config.json field of the wrong type, found by transformers' validation
        raise CheckpointError(f"cannot load the model folder {path} ({type(error).__name__}: "
                              f"{one_line_message(error)}); fix {path / 'config.json'} or save the model again") from None
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
    if similarity == "cosine":  # as `retromae export --pooling mean` builds it
        modules.append(Normalize())
    return SentenceTransformer(
        modules=modules,
        similarity_fn_name=similarity,
        prompts={"query": "", "document": ""},
        device=device,
    )


__all__ = ["check_pooling", "load_sentence_transformer", "save_without_pooler"]
