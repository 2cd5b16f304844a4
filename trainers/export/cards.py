"""The model cards (README.md) of the folders the package writes, rendered from `model_cards/*.md`.

* `render_pretrained_card`: the card of an exported pre-trained encoder (`retromae export`, after `pretrain`).
* `render_finetuned_card` / `write_finetuned_card`: the card of a fine-tuned model, rendered from its run record
  (`retromae_finetune.json`); `retromae evaluate --update-card` re-renders it with the new results.

A card never shows a local filesystem path: local names are reduced to their last component (`card_name`), and
`find_local_paths` finds any left in a card's text (`retromae publish` refuses them). What a card says about
a pre-training method (title, summary, paper link, citation) comes from the method registry; the caller passes the
registry's entry (anything with the fields of `MethodDescription`). The papers' BibTeX entries live in
`model_cards/papers.bib` (`read_papers`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from retromae.modeling.backbones import DEFAULT_ENCODER_TYPE, backbone_for, encoder_type_of_config
from transformers import CONFIG_MAPPING, BertConfig

from ..inputs.folders import FILE_SUFFIXES, is_hub_id, is_local_path, public_name
from ..inputs.io import read_json_or_empty, write_json_atomic, write_text_atomic

PRETRAINED_TEMPLATE = "pretrained_encoder.md"
TRANSFORMERS_USAGE_TEMPLATE = "transformers_usage.md"
PAPERS_FILE = "papers.bib"
FINETUNED_TEMPLATE = "finetuned_encoder.md"
FINETUNE_RUN_INFO_FILE = "retromae_finetune.json"
SNIPPET_MODULES = ["Transformer", "Pooling"]  # a saved model the transformers snippet reproduces (+ Normalize)
# the sentence embedding of a plain-BERT export, by pooling
POOLED_REPRESENTATION = {"cls": "last-layer `[CLS]` state",
                         "mean": "mean of the last-layer token states (padding left out)"}
# the metrics of the evaluation summary and the card: (mteb score key, display name)
CARD_METRICS = (("ndcg_at_10", "NDCG@10"), ("mrr_at_10", "MRR@10"), ("recall_at_100", "Recall@100"),
                ("recall_at_1000", "Recall@1000"))
# The first sentence-transformers release that imports each module path a saved modules.json may name (5.4 moved the
# modules into these packages, 6.0 moved Normalize; folders were loaded with 5.3, 5.4, 5.7, 6.0), and the one that
# added `encode_query` / `encode_document`, which the cards use, for any other path (remote code's imports unread)
MODULE_RELEASES = (("sentence_transformers.base.modules.normalize.", (6, 0)), ("sentence_transformers.base.", (5, 4)),
                   ("sentence_transformers.sentence_transformer.modules.", (5, 4)),
                   ("sentence_transformers.sparse_encoder.modules.", (5, 4)))
ENCODE_QUERY_RELEASE = (5, 0)
# BertConfig's own fields; a method config's other fields are its hyperparameters (listed in the card)
BERT_FIELDS = frozenset(f.name for f in dataclasses.fields(BertConfig))
# method-config fields that are implementation knobs, not hyperparameters worth a line in the card
NOT_HYPERPARAMETERS = frozenset({"loss_chunk_size", "mask_token_id"})
# what a method config carries about its base besides the base config's own fields
BASE_META_FIELDS = frozenset({"encoder_type", "sliding_window"})
BIBTEX_ENTRY = re.compile(r"^@\w+\{(?P<key>[^,\s]+),\n.*?^\}$", re.MULTILINE | re.DOTALL)
BIBTEX_URL = re.compile(r"^\s*url = \{([^}]*)\}", re.MULTILINE)
# an absolute path of this machine in prose: `/a/b` (a lone `/name` only as a data or weight file), `~/x`, `C:\x`,
# `file:///x`. Not a URL's path (`https://host/a/b`, preceded by a host name), `owner/name`, `and/or`, `km/h`,
# `(a+b)/c/d` in math or `<placeholder>/x`: the character before the slash must not be a word character, `.:/~\-`
# or a closing bracket.
_PATH_CHARS = r"[\w.@%+=~-]"
CARD_LOCAL_PATH = re.compile(
    rf"file:///\S+"
    rf"|(?<![\w.:/~\\\-)\]}}>])/{_PATH_CHARS}+(?:/{_PATH_CHARS}*)*"
    rf"|(?<![\w~/])~/{_PATH_CHARS}+(?:/{_PATH_CHARS}*)*"
    rf"|(?<![\w/])[A-Za-z]:[\\/][^\s`'\"<>|]+"
)
# site-relative links (`[text](/owner/name)`, `href="/docs"`) and documentation placeholders are not local paths
_NOT_LOCAL_PREFIXES = ("](", 'href="', 'src="')
_PLACEHOLDER_PATHS = ("/path/to/",)


@dataclass(frozen=True)
class Paper:
    """A method's paper: its BibTeX entry, as written in `papers.bib`, and the address its `url` field gives."""

    bibtex: str
    url: str


class MethodDescription(Protocol):
    """What a card needs of a pre-training method (the registry's `Method` has these fields)."""

    name: str
    summary: str
    paper: Paper
    model_class: type
    # the fine-tuning recipe (in-batch, hard negatives, distillation) follows its paper: fine-tuned cards cite it
    finetuning_recipe: bool

    @property
    def pooling_label(self) -> str | None:
        """How a fine-tuning record's `pooling` starts for a model holding the method's own module, else None."""


def read_papers() -> dict[str, Paper]:
    """The entries of `model_cards/papers.bib` by citation key. Each entry starts at a line `@type{key,` and ends
    at the next line that is a lone `}`; its `url = {...}` field is the paper's address."""
    papers = {}
    for match in BIBTEX_ENTRY.finditer(_template(PAPERS_FILE)):
        url = BIBTEX_URL.search(match.group(0))
        if url is None:
            raise ValueError(f"{PAPERS_FILE}: entry {match.group('key')!r} has no url field")
        papers[match.group("key")] = Paper(bibtex=match.group(0), url=url.group(1))
    return papers


def find_local_paths(text: str) -> list[tuple[int, str]]:
    """The absolute local paths in a card's text (`/tmp/x/corpus.jsonl`, `~/data`, `C:\\data`, `file:///x`), as
    (1-based line number, path); a lone `/name` counts only when it names a data or weight file (`/corpus.jsonl`)."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in CARD_LOCAL_PATH.finditer(line):
            path = match.group(0).rstrip(".,;:")
            single = path.startswith("/") and path.count("/") == 1
            if (line[:match.start()].endswith(_NOT_LOCAL_PREFIXES) or path.startswith(_PLACEHOLDER_PATHS)
                    or (single and not path.lower().endswith(FILE_SUFFIXES))):
                continue
            found.append((number, path))
    return found


def card_name(name: Any) -> Any:
    """What a card may show for a recorded name: a local path reduced to its last component (`public_name`); Hub ids,
    plain names and prose as they are."""
    return public_name(name) if isinstance(name, str) and is_local_path(name) else name


def _hub_id(name: Any) -> str | None:
    """`name` when it is a Hub id (`owner/name`) and not a local path (`data/train.jsonl` looks like one)."""
    return name if is_hub_id(name) and not is_local_path(name) else None


def _template(name: str) -> str:
    return resources.files("retromae.model_cards").joinpath(name).read_text(encoding="utf-8")


def transformers_usage(repo_id: str, *, pooling: str, normalize: bool, max_seq_length: int, pooler_kwarg: str) -> str:
    """The card's "With transformers alone" paragraph and code: `pooling` ("cls" or "mean") of `last_hidden_state`,
    normalised when `normalize`; `pooler_kwarg` is ", add_pooling_layer=False" for a model saved without a pooler."""
    return jinja2.Template(_template(TRANSFORMERS_USAGE_TEMPLATE)).render(
        repo_id=repo_id, pooling=pooling, normalize=normalize, max_seq_length=max_seq_length, pooler_kwarg=pooler_kwarg)


def _title_and_summary(method: MethodDescription) -> tuple[str, str]:
    """`"RetroMAE: encoder MLM + ..."` -> ("RetroMAE", "encoder MLM + ...")."""
    title, _, summary = method.summary.partition(": ")
    return (title, summary) if summary else (method.name, method.summary)


def record_value(value: Any) -> Any:
    """A training argument as a run record holds it: an enum (`SchedulerType.LINEAR`) by its value (`linear`), so a
    card rendered from the record in memory reads as one rendered from its JSON file."""
    return getattr(value, "value", value)


def format_value(value: Any, *, loss: bool = False) -> str:
    """A value as a card cell: losses with 4 decimals, other floats in their shortest form, None as "-"."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if loss else f"{value:g}"
    return str(value)


def format_metric(value: Any) -> str:
    """A retrieval metric (0..1) with 4 decimals; other numbers in their shortest form, None as "-"."""
    if isinstance(value, float) and 1e-3 <= abs(value) < 10:
        return f"{value:.4f}"
    return format_value(value)


# ---- the pre-trained encoder ---------------------------------------------------------------------------------------


def render_pretrained_card(
    method: MethodDescription,
    config: Mapping[str, Any],
    run_info: Mapping[str, Any] | None,
    *,
    model_name: str,
    folder_name: str,
    embedding_dim: int,
    num_layers: int,
    max_seq_length: int,
    representation: str | None = None,
    similarity: str = "dot",
    pooling: str = "cls",
    usage: str | None = None,
    tags: Sequence[str] = (),
    pipeline_tag: str = "sentence-similarity",
) -> str:
    """README.md of an exported pre-trained encoder from `model_cards/pretrained_encoder.md`.

    Args:
        method: the registry entry of the pre-training method.
        config: the pre-training config (config.json contents).
        run_info: the pre-training run record (`retromae_run.json`), or None when not recorded.
        model_name: the name in the card (and its `hf upload <your-org>/<model_name>` command).
        folder_name: the output folder's basename.
        representation: how the sentence embedding is formed; None = the plain-BERT export (no remote code), whose
            embedding `pooling` and `similarity` describe. Any other value marks a model that needs
            `trust_remote_code=True`, unless `usage` is given.
        similarity: "dot" or "cosine" (the export normalises the embeddings).
        pooling: "cls" or "mean", for the plain-BERT export.
        usage: the usage section's text after `pip install` (markdown), for an export of plain sentence-transformers
            modules other than the plain-BERT one (no remote code); None = the card's own snippet.
        tags / pipeline_tag: tags added to the card's own, and the Hub pipeline.
    """
    run_info = run_info or {}
    backbone = backbone_for(encoder_type_of_config(config))
    model_name = card_name(model_name)
    base_model = run_info.get("base_model")
    hub_base_model = _hub_id(base_model)
    # a corpus read from the Hub (`--corpus owner/name`) is the card's dataset; a local file or folder is not named
    hub_corpus = _hub_id(run_info.get("corpus"))
    title, summary = _title_and_summary(method)
    repo_id = model_name if "/" in model_name else f"<your-org>/{model_name}"
    custom_code = representation is not None and usage is None
    card_data = ModelCardData(
        language="en",
        license="apache-2.0",
        library_name="sentence-transformers",
        pipeline_tag=pipeline_tag,
        base_model=hub_base_model,
        datasets=[hub_corpus] if hub_corpus else None,
        tags=list(dict.fromkeys(["retromae", method.name, "sentence-transformers", *tags, "feature-extraction",
                                 *(["custom_code"] if custom_code else [])])),
        model_name=model_name,
    )
    scratch = (run_info.get("initialisation") or {}).get("from_scratch")
    if scratch:
        base_model_text = _scratch_text(run_info["initialisation"])
    elif hub_base_model:
        base_model_text = f"[{hub_base_model}](https://huggingface.co/{hub_base_model})"
    else:
        base_model_text = "a local checkpoint (not a Hub model id)" if base_model else "not recorded"
    card = ModelCard.from_template(
        card_data,
        template_str=_template(PRETRAINED_TEMPLATE),
        method=method.name,
        method_title=title,
        method_summary=summary,
        paper_url=method.paper.url,
        base_model_text=base_model_text,
        corpus=(f"[{hub_corpus}](https://huggingface.co/datasets/{hub_corpus})" if hub_corpus
                else public_name(run_info.get("corpus")) or "not recorded"),
        num_layers=num_layers,
        embedding_dim=embedding_dim,
        hidden_size=config["hidden_size"],
        architecture=backbone.display_name,
        model_class=backbone.model_class.__name__,
        model_type=backbone.model_types[0],
        cls_model=representation is None,
        custom_code=custom_code,
        usage=usage,
        transformers_usage=transformers_usage(
            repo_id, pooling=pooling, normalize=similarity == "cosine", max_seq_length=max_seq_length,
            pooler_kwarg=", add_pooling_layer=False" if backbone.has_pooler else ""),  # the export has no pooler
        similarity=similarity,
        pooling=pooling,
        representation=representation or (f"{POOLED_REPRESENTATION[pooling]}, {embedding_dim} dimensions, "
                                          + ("normalised" if similarity == "cosine" else "not normalised")),
        max_seq_length=max_seq_length,
        global_step=run_info.get("global_step", "not recorded"),
        weights_step=run_info.get("weights_step"),
        best_metric=[(name, format_metric(value)) for name, value in (run_info.get("best_metric") or {}).items()],
        retromae_version=run_info.get("retromae_version", "not recorded"),
        method_hparams=method_hyperparameters(method, config),
        training=_training_rows(run_info.get("training")),
        final_losses=[(k, format_value(v, loss=True)) for k, v in (run_info.get("final_losses") or {}).items()],
        repo_id=repo_id,
        folder_name=folder_name,
        citation=method.paper.bibtex,
    )
    return str(card)


def _scratch_text(initialisation: Mapping[str, Any]) -> str:
    """The base-model row of a model pre-trained from random initialisation (`--from-scratch`)."""
    source = card_name(initialisation.get("architecture_of"))
    overrides = initialisation.get("config_overrides")
    text = "none: initialised randomly" + (f", with the architecture of `{source}`" if source else "")
    return text + (f" changed by `{overrides}`" if overrides else "")


def base_architecture_fields(config: Mapping[str, Any]) -> frozenset[str]:
    """The fields that describe the base rather than the method: BertConfig's, and for a RoBERTa / XLM-R / ModernBERT
    base (`encoder_type`) every field of its own config class (ModernBERT's norm_eps, layer_types, ...), plus
    `encoder_type` and `sliding_window` themselves."""
    encoder_type = config.get("encoder_type") or DEFAULT_ENCODER_TYPE
    base_class = CONFIG_MAPPING[encoder_type] if encoder_type in CONFIG_MAPPING else None  # noqa: SIM401 (lazy: no .get)
    base_fields = {f.name for f in dataclasses.fields(base_class)} if dataclasses.is_dataclass(base_class) else set()
    if base_class is not None:
        base_fields |= set(base_class().to_dict())  # also a config class that is not a dataclass
    return BERT_FIELDS | base_fields | BASE_META_FIELDS


def method_hyperparameters(method: MethodDescription, config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The method config's fields beyond the base's architecture (`base_architecture_fields`: mask ratios,
    decoding, ...), with their values."""
    config_class = method.model_class.config_class
    architecture = base_architecture_fields(config)
    names = [f.name for f in dataclasses.fields(config_class) if f.name not in architecture]
    return [(n, format_value(config[n])) for n in names if n in config and n not in NOT_HYPERPARAMETERS]


def trained_settings(training: Mapping[str, Any]) -> dict[str, Any]:
    """The training arguments a card shows: without `num_train_epochs` where `max_steps` > 0 stopped the run (the
    row would claim epochs it did not train)."""
    by_steps = isinstance(training.get("max_steps"), int) and training["max_steps"] > 0
    return {k: v for k, v in training.items() if not (by_steps and k == "num_train_epochs")}


def _training_rows(training: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not training:
        return []
    rows = [(k, format_value(v)) for k, v in trained_settings(training).items()]
    factors = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size")
    if all(isinstance(training.get(k), int) for k in factors):
        effective = training[factors[0]] * training[factors[1]] * training[factors[2]]
        rows.append(("effective_batch_size", str(effective)))
    return rows


# ---- the fine-tuned model ------------------------------------------------------------------------------------------


def _eval_results(rows: list[dict[str, Any]]) -> list[EvalResult]:
    """The model-index entries of the rows whose `dataset_id` is a Hub dataset id (`_hub_id`): the Hub reads
    `dataset.type` as one, so a local folder without one (`local/<name>`) stays in the card's table only."""
    results = []
    for row in rows:
        for key, label in CARD_METRICS:
            if row.get(key) is None or not _hub_id(row["dataset_id"]):
                continue
            results.append(EvalResult(
                task_type="retrieval", task_name="Retrieval", dataset_type=row["dataset_id"],
                dataset_name=card_name(row["dataset_name"]), dataset_split=row["split"], metric_type=key,
                metric_name=label, metric_value=float(row[key]),
            ))
    return results


def render_finetuned_card(info: Mapping[str, Any], methods: Mapping[str, MethodDescription],
                          model_files: Mapping[str, Any] | None = None,
                          sentence_transformers_release: str | None = None) -> str:
    """README.md of a fine-tuned model from its run record (`retromae_finetune.json`); never a local path.

    Args:
        info: the run record.
        methods: the method registry, by name: the starting model's pre-training method is described from its entry,
            and the card cites it and the papers of the fine-tuning recipe (`finetuning_recipe`); a `pooling` that
            names a method's own module (`pooling_label`) marks the hybrid model.
        model_files: `saved_layout` of the model folder; with it, a CLS- or mean-pooled model without prompts, extra
            modules or remote code gets the transformers snippet (`transformers_usage`).
        sentence_transformers_release: the release the card says the model needs (`sentence_transformers_needed`
            of the model folder); None: no requirement stated.
    """
    method_name = info.get("pretraining_method")
    method = methods.get(method_name) if method_name else None
    model_name = card_name(info.get("model_name")) or "retromae-finetuned"
    base_model = info.get("base_model")
    hub_base = _hub_id(base_model)
    train = info.get("train_data") or {}
    eval_rows = list(info.get("eval_results") or [])
    datasets = [d for d in dict.fromkeys([train.get("name"), *(r.get("dataset_id") for r in eval_rows)]) if _hub_id(d)]
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "retromae", "retrieval"]
    if method_name:
        tags.append(method_name)
    if info.get("trust_remote_code"):
        tags.append("custom_code")
    card_data = ModelCardData(
        language="en", license="apache-2.0", library_name="sentence-transformers", pipeline_tag="sentence-similarity",
        base_model=hub_base, datasets=datasets or None, tags=list(dict.fromkeys(tags)), model_name=model_name,
        eval_results=_eval_results(eval_rows) or None,
    )
    cited = [method, *(m for m in methods.values() if m.finetuning_recipe)]
    citations = list(dict.fromkeys(m.paper.bibtex for m in cited if m is not None))
    trust = info.get("trust_remote_code")
    repo_id = model_name if "/" in model_name else f"<your-org>/{model_name}"
    plain = (model_files is not None and not trust and info.get("pooling") in POOLED_REPRESENTATION
             and isinstance(info.get("max_seq_length"), int))
    card = ModelCard.from_template(
        card_data,
        template_str=_template(FINETUNED_TEMPLATE),
        model_name=model_name,
        repo_id=repo_id,
        base_model_text=_base_model_text(hub_base, base_model),
        method_text=(f"{_title_and_summary(method)[0]} (`{method.name}`, [paper]({method.paper.url}))"
                     if method else "not a retromae pre-training (or not recorded)"),
        pooling=info.get("pooling"),
        similarity=info.get("similarity"),
        embedding_dim=info.get("embedding_dim"),
        max_seq_length=info.get("max_seq_length"),
        hybrid=_names_own_module(str(info.get("pooling", "")), methods),
        trust_remote_code=trust,
        load_args=", trust_remote_code=True" if trust else "",
        transformers_usage=transformers_usage(repo_id, pooling=info["pooling"], max_seq_length=info["max_seq_length"],
                                              **model_files) if plain else "",
        train_name=card_name(train.get("name")),
        train_split=train.get("split"),
        train_queries=train.get("queries"),
        dropped=[(k.replace("_", " "), v) for k, v in (train.get("dropped") or {}).items() if v],
        stages=info.get("stages") or [],
        hyperparameters=[(k, format_metric(v)) for k, v in trained_settings(info.get("hyperparameters") or {}).items()],
        eval_rows=[{**row, "dataset_name": card_name(row.get("dataset_name")),
                    **{k: format_metric(row.get(k)) for k, _ in CARD_METRICS}} for row in eval_rows],
        metric_labels=[label for _, label in CARD_METRICS],
        metric_keys=[key for key, _ in CARD_METRICS],
        retromae_version=info.get("retromae_version", "unknown"),
        citations=citations,
        folder_name=model_name.split("/")[-1],
        sentence_transformers_release=sentence_transformers_release,
    )
    return str(card)


def _names_own_module(pooling: str, methods: Mapping[str, MethodDescription]) -> bool:
    """Whether a fine-tuning record's `pooling` names a method's own module (the hybrid model's)."""
    return any(pooling.startswith(m.pooling_label) for m in methods.values() if m.pooling_label)


def _base_model_text(hub_base: str | None, base_model: str | None) -> str:
    if hub_base:
        return f"[{hub_base}](https://huggingface.co/{hub_base})"
    return f"`{card_name(base_model)}` (local)" if base_model else "a local model (no Hub id recorded)"


def _module_types(folder: Path) -> list[str]:
    """The `type` of each module in a saved folder's modules.json (a list, which read_json_or_empty does not
    return); none without the file."""
    modules_file = folder / "modules.json"
    return ([str(m.get("type", "")) for m in json.loads(modules_file.read_text(encoding="utf-8"))]
            if modules_file.is_file() else [])


def sentence_transformers_needed(folder: Path) -> str:
    """The oldest sentence-transformers release, as "5.4", that loads a saved folder and has `encode_query`: the
    latest `MODULE_RELEASES` entry of its module types (each type's first matching prefix)."""
    releases = [next((release for prefix, release in MODULE_RELEASES if module_type.startswith(prefix)),
                     ENCODE_QUERY_RELEASE) for module_type in _module_types(folder)]
    return ".".join(map(str, max([ENCODE_QUERY_RELEASE, *releases])))


def saved_layout(folder: Path) -> dict[str, Any] | None:
    """What the transformers snippet needs to know of a saved sentence-transformers folder: whether it normalises
    (a Normalize module in modules.json) and loads without a pooler (`model_kwargs` in sentence_bert_config.json);
    None when the snippet would not give its vectors: a module other than Transformer, Pooling and Normalize (a
    Dense layer), or prompts (config_sentence_transformers.json, also those kept from the starting model)."""
    modules = [module_type.rsplit(".", 1)[-1] for module_type in _module_types(folder)]
    prompts = read_json_or_empty(folder / "config_sentence_transformers.json").get("prompts") or {}
    if modules not in (SNIPPET_MODULES, [*SNIPPET_MODULES, "Normalize"]) or any(prompts.values()):
        return None
    config = read_json_or_empty(folder / "sentence_bert_config.json")
    no_pooler = (config.get("model_kwargs") or {}).get("add_pooling_layer") is False
    return {"normalize": modules[-1] == "Normalize", "pooler_kwarg": ", add_pooling_layer=False" if no_pooler else ""}


def write_finetuned_card(folder: str | os.PathLike, info: Mapping[str, Any],
                         methods: Mapping[str, MethodDescription]) -> None:
    """Write the run record (`retromae_finetune.json`) and README.md into `folder` (a saved model), each atomically."""
    folder = Path(folder)
    write_json_atomic(folder / FINETUNE_RUN_INFO_FILE, info)
    write_text_atomic(folder / "README.md", render_finetuned_card(info, methods, saved_layout(folder),
                                                                  sentence_transformers_needed(folder)))


__all__ = [
    "CARD_METRICS",
    "CARD_LOCAL_PATH",
    "POOLED_REPRESENTATION",
    "FINETUNE_RUN_INFO_FILE",
    "MethodDescription",
    "Paper",
    "card_name",
    "find_local_paths",
    "format_metric",
    "format_value",
    "method_hyperparameters",
    "read_papers",
    "record_value",
    "render_finetuned_card",
    "render_pretrained_card",
    "sentence_transformers_needed",
    "write_finetuned_card",
]
