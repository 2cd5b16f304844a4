"""Input-token coverage of dense representations (Ma et al., 2024, "Drop your Decoder", §3.2, Algorithm 1).

For a text with input token set T (its non-special token ids after tokenization), the sentence representation h (the
last-layer [CLS] state of the *unmasked* input) is projected to the vocabulary, h_proj = h · Eᵀ (paper eq. 11, E =
the encoder's word-embedding matrix), and

    coverage@k = |top-k tokens of h_proj ∩ T| / k

is averaged over the texts. The paper uses it to show that enhanced decoding and BoW prediction pack the input's
lexicon into [CLS] (its Figures 2 and 4).

Choices, documented:
- Projection, two choices (``projection=``): ``"embeddings"`` (default) is the bare word-embedding matrix of eq. 11
  and Algorithm 2 (h · Eᵀ); it exists in every checkpoint (plain BertModel / sentence-transformers folders such as
  all-MiniLM-L6-v2 have no MLM head), so every model is measured the same way. ``"lm_head"`` is the prose of §3.2 and
  §5.2 ("projecting dense representations to the vocabulary space via the BERT language model heads"): the trained
  MLM head (dense + GELU + LayerNorm, then Eᵀ + bias). Our BoW / DupMAE losses train h through that head, so only
  ``"lm_head"`` sees what they taught; it needs a checkpoint that carries the head (BERT's `cls.predictions.*`,
  RoBERTa / XLM-R / ModernBERT's `lm_head.*` or `head.*`: our pre-training checkpoints, the bases' *ForMaskedLM
  folders).
- Denominator: k, the share of the top-k tokens that occur in the input (the paper's prose: "the ratio of the above
  tokens appearing in the tokenized input token set"). Algorithm 1's "/ Numbers of T" is ambiguous between T_topk
  and T; dividing by |T| would make the value grow with k for any model.
- T excludes special tokens ([CLS], [SEP], <s>, ...) by the tokenizer's special-tokens mask; the top-k ranks the whole
  vocabulary (a special or unused token in the top-k counts as a miss). Texts without ordinary tokens are skipped.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from tqdm.auto import tqdm

from ..data.tokenize import UNK_SAMPLE_ROWS, WARN_UNK_SHARE, unknown_token_share
from ..inputs.checkpoints import load_encoder, load_mlm_head, load_tokenizer, usable_positions
from ..inputs.extras import plotting_available
from ..inputs.folders import check_model_folder, model_location
from ..inputs.io import atomic_file, read_json_or_empty, write_json_atomic
from ..inputs.outputs import Holding, check_folder_option, claim_output
from .metrics import DEFAULT_KS

logger = logging.getLogger(__name__)
DEFAULT_MAX_SEQ_LENGTH = 256  # tokens per text unless given; capped at the model's positions
MIN_SEQ_LENGTH = 3  # [CLS] + one text token + [SEP]: with 2, no text keeps a token to cover
COVERAGE_JSON = "coverage.json"
COVERAGE_PNG = "coverage.png"
METRIC = "input token coverage@k (Ma et al., 2024, Algorithm 1)"  # also marks a coverage.json as ours
PROJECTIONS = ("embeddings", "lm_head")
Projection = Literal["embeddings", "lm_head"]
LM_HEAD_HINT = ("; --projection lm_head needs a pre-training or masked-LM checkpoint: use --projection embeddings "
                "(projection='embeddings' in Python)")


def coverage_at_k(scores: torch.Tensor, in_input: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """Per-row coverage@k: the share of the k highest-scoring vocabulary entries that are input tokens.

    Args:
        scores: `(batch_size, vocab_size)` projected representations h · Eᵀ.
        in_input: `(batch_size, vocab_size)` bool, True for the ids in the row's input token set.
        ks: cut-offs, each in [1, vocab_size].

    Returns:
        `(batch_size, len(ks))` float32.
    """
    return _hits_at_k(scores, in_input, ks) / torch.tensor(list(ks), dtype=torch.float32, device=scores.device)


def _hits_at_k(scores: torch.Tensor, in_input: torch.Tensor, ks: Sequence[int]) -> torch.Tensor:
    """`(batch_size, len(ks))` number of input tokens among the top-k (exact integers in float32)."""
    top = scores.topk(max(ks), dim=-1).indices  # (B, k_max), best first
    hits = in_input.gather(1, top).float().cumsum(-1)  # (B, k_max): hits among the first j + 1
    columns = torch.tensor([k - 1 for k in ks], device=scores.device)
    return hits[:, columns]


def _encoder(model_or_path: str | os.PathLike | nn.Module) -> nn.Module:
    """The encoder whose last-layer [CLS] state is the representation: a module as given (or its `base_model`, e.g.
    the `bert` / `roberta` / `model` encoder of a `*ForPretraining` model), else `inputs.checkpoints.load_encoder`
    of the folder or Hub id (any supported base, or one of our checkpoints on it)."""
    if not isinstance(model_or_path, nn.Module):
        return load_encoder(model_or_path, purpose="coverage")
    encoder = getattr(model_or_path, "base_model", model_or_path)
    if not hasattr(encoder, "get_input_embeddings"):
        raise TypeError(f"{type(model_or_path).__name__} is not a transformers encoder (no get_input_embeddings)")
    return encoder


def _lm_head(model_or_path: str | os.PathLike | nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """The trained MLM head as h (B, H) -> float32 vocabulary scores (B, V): a pre-training model's `head_parts`, the
    `cls` of a `BertForMaskedLM`, or a checkpoint's head (`inputs.checkpoints.load_mlm_head`, any supported base)."""
    if isinstance(model_or_path, nn.Module) and callable(getattr(model_or_path, "head_parts", None)):
        model = model_or_path

        def project(h: torch.Tensor) -> torch.Tensor:
            model.mlm_head.to(h.device)  # the encoder alone was moved to the run's device
            transform, weight, bias = model.head_parts()
            return nn.functional.linear(transform(h.to(weight.dtype)), weight, bias).float()

        return project
    if isinstance(model_or_path, nn.Module):
        head = getattr(model_or_path, "cls", None)
        if head is None:
            raise ValueError(f"{type(model_or_path).__name__} has no MLM head (`head_parts`, `cls`){LM_HEAD_HINT}")
    else:
        head = load_mlm_head(model_or_path, hint=LM_HEAD_HINT)
    head = head.eval()
    return lambda h: head.to(h.device)(h.to(next(head.parameters()).dtype)).float()


def _projector(model_or_path, encoder: nn.Module, projection: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """h (B, H) -> vocabulary scores (B, V) for `projection`."""
    if projection == "embeddings":
        embedding_matrix = encoder.get_input_embeddings().weight
        return lambda h: h.float() @ embedding_matrix.float().t()  # h · Eᵀ
    if projection == "lm_head":
        return _lm_head(model_or_path)
    raise ValueError(f"projection={projection!r}: choose one of {PROJECTIONS}")


@torch.no_grad()
def _coverage_sums(
    encoder: nn.Module,
    project: Callable[[torch.Tensor], torch.Tensor],
    tokenizer,
    texts: Sequence[str],
    ks: Sequence[int],
    batch_size: int,
    max_seq_length: int,
    device: torch.device,
    desc: str | None = None,
) -> tuple[torch.Tensor, int]:
    """Sum over texts of coverage@k `(len(ks),)` and the number of texts scored; a progress bar named `desc` if given."""
    vocab_size = encoder.get_input_embeddings().weight.shape[0]
    totals = torch.zeros(len(ks), dtype=torch.float64)
    scored = 0
    for start in tqdm(range(0, len(texts), batch_size), desc=desc, unit="batch", disable=desc is None):
        batch = tokenizer(
            list(texts[start : start + batch_size]),
            truncation=True,
            max_length=max_seq_length,
            padding=True,
            return_special_tokens_mask=True,
            return_tensors="pt",
        )
        input_ids = batch["input_ids"].to(device)  # (B, L)
        attention_mask = batch["attention_mask"].to(device)  # (B, L)
        ordinary = attention_mask.bool() & ~batch["special_tokens_mask"].to(device).bool()  # (B, L)
        if int(input_ids.max()) >= vocab_size:
            raise ValueError(f"tokenizer produced id {int(input_ids.max())} >= the model's vocab_size {vocab_size}")
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, L, H)
        scores = project(hidden[:, 0])  # (B, V)
        counts = torch.zeros(scores.shape, device=device)
        counts.scatter_add_(1, input_ids, ordinary.float())  # occurrences of each id among the ordinary tokens
        in_input = counts > 0  # (B, V)
        keep = in_input.any(-1)  # (B,) texts with at least one ordinary token
        hits = _hits_at_k(scores[keep], in_input[keep], ks).cpu().double()  # (n, len(ks))
        totals += (hits / torch.tensor(ks, dtype=torch.float64)).sum(0)
        scored += int(keep.sum())
    return totals, scored


def _check_ks(ks: Iterable[int], vocab_size: int) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks:
        raise ValueError("ks is empty; give at least one cut-off k")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab_size:
            raise ValueError(f"k={k!r} must be an integer in [1, vocab_size={vocab_size}]")
    return ks


def input_token_coverage(
    model_dir_or_model: str | os.PathLike | nn.Module,
    tokenizer,
    texts: Iterable[str],
    ks: Iterable[int] = DEFAULT_KS,
    batch_size: int = 32,
    max_seq_length: int | None = None,
    device: str | torch.device | None = None,
    projection: Projection = "embeddings",
    show_progress_bar: bool = False,
) -> dict[int, float]:
    """Mean input-token coverage@k of a model's [CLS] representations over `texts` (Algorithm 1, see module doc).

    Args:
        model_dir_or_model: checkpoint directory / Hub id (see `inputs.checkpoints.load_encoder`) or a module
            (a transformers encoder, or a model with a `bert` encoder such as `*ForPretraining`).
        tokenizer: a transformers tokenizer; None loads the one saved with `model_dir_or_model`.
        texts: the texts; each is tokenized without masking, truncated to `max_seq_length`.
        ks: top-k cut-offs.
        batch_size: texts per forward pass.
        max_seq_length: truncation length in tokens (special tokens included), `MIN_SEQ_LENGTH` (3) to the
            encoder's usable positions;
            None: `DEFAULT_MAX_SEQ_LENGTH`, capped at those positions (logged).
        device: where to run; default the module's device, else CUDA when available.
        projection: "embeddings" (h · Eᵀ) or "lm_head" (the checkpoint's trained MLM head); see the module doc.
        show_progress_bar: show a tqdm bar over the batches.

    Returns:
        `{k: coverage@k}` in the order of `ks`, each in [0, 1].
    """
    texts = [t for t in texts]
    if not texts:
        raise ValueError("no texts given")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if projection not in PROJECTIONS:
        raise ValueError(f"projection={projection!r}: choose one of {PROJECTIONS}")
    if not isinstance(model_dir_or_model, nn.Module):  # its own tokenizer is read from it when none is given
        check_model_folder(model_dir_or_model, purpose="coverage", tokenizer=tokenizer is None)
    encoder = _encoder(model_dir_or_model)
    max_seq_length = _sequence_length(max_seq_length, encoder, str(model_dir_or_model))
    project = _projector(model_dir_or_model, encoder, projection)
    if tokenizer is None:
        if isinstance(model_dir_or_model, nn.Module):
            raise ValueError("tokenizer is required when a module is given")
        tokenizer = load_tokenizer(model_dir_or_model)
    _warn_unknown_tokens(tokenizer, texts, max_seq_length)
    vocab_size = encoder.get_input_embeddings().weight.shape[0]
    ks = _check_ks(ks, vocab_size)
    if device is None:
        if isinstance(model_dir_or_model, nn.Module):
            device = next(encoder.parameters()).device
        else:
            device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    was_training = encoder.training
    original_device = next(encoder.parameters()).device
    encoder.eval().to(device)
    try:
        totals, scored = _coverage_sums(encoder, project, tokenizer, texts, ks, batch_size, max_seq_length, device,
                                        desc=str(model_dir_or_model) if show_progress_bar else None)
    finally:
        encoder.train(was_training)
        encoder.to(original_device)
    if scored == 0:
        raise ValueError(f"none of the {len(texts)} texts has a non-special token")
    if scored < len(texts):
        logger.warning("coverage: %d of %d texts have no non-special token and were skipped", len(texts) - scored, len(texts))
    return {k: float(total) / scored for k, total in zip(ks, totals.tolist(), strict=True)}


def _sequence_length(max_seq_length: int | None, encoder: nn.Module, model_name: str) -> int:
    """`max_seq_length`, refused beyond the encoder's usable positions (longer inputs fail inside torch); None:
    `DEFAULT_MAX_SEQ_LENGTH`, capped at them."""
    config = getattr(encoder, "config", None)
    limit = usable_positions(config) if getattr(config, "max_position_embeddings", None) else None
    if max_seq_length is None:
        if limit is not None and limit < DEFAULT_MAX_SEQ_LENGTH:
            logger.info("coverage: max_seq_length %d for %s (the default %d capped at its position limit)", limit,
                        model_name, DEFAULT_MAX_SEQ_LENGTH)
            return limit
        return DEFAULT_MAX_SEQ_LENGTH
    if max_seq_length < MIN_SEQ_LENGTH or (limit is not None and max_seq_length > limit):
        raise ValueError(f"--max-seq-length {max_seq_length}: give {MIN_SEQ_LENGTH} to "
                         f"{limit or 'the encoder limit'} for {model_name} (tokens per text, special tokens "
                         "included: [CLS], at least one text token and [SEP])")
    return max_seq_length


def _warn_unknown_tokens(tokenizer, texts: Sequence[str], max_seq_length: int) -> None:
    """Warn when more than `WARN_UNK_SHARE` of the texts' tokens are [UNK] for the tokenizer (their language or script
    is another): every [UNK] is one and the same input token, so their coverage says little. Measured on the first
    `UNK_SAMPLE_ROWS` texts."""
    sample = list(texts[:UNK_SAMPLE_ROWS])
    ids = tokenizer(sample, truncation=True, max_length=max_seq_length, return_attention_mask=False)["input_ids"]
    share = unknown_token_share(tokenizer, ids)
    if share is None or share <= WARN_UNK_SHARE:
        return
    which = f"the {len(sample)}" if len(sample) == len(texts) else f"the first {len(sample)} of {len(texts)}"
    logger.warning("coverage: %.0f%% of the text tokens of %s texts are [UNK] for the tokenizer %s: it does not know "
                   "their language or script, so their coverage says little; use texts in the model's language",
                   100 * share, which, tokenizer.name_or_path)


def plot_coverage(results: dict[str, dict[int, float]], path_png: str | os.PathLike) -> Path | None:
    """Line plot of coverage@k against k, one line per model; written atomically as PNG (matplotlib Agg). Without
    matplotlib (the `plots` extra) nothing is drawn: a log line says so and None is returned.

    Args:
        results: `{model name: {k: coverage@k}}`.
        path_png: output file.

    Returns:
        The path written, or None without matplotlib.
    """
    if not results:
        raise ValueError("results is empty; nothing to plot")
    path = Path(path_png)
    if not plotting_available(path.name):
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 4.4), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    all_ks: set[int] = set()
    for name, coverage in results.items():
        ks = sorted(int(k) for k in coverage)
        all_ks.update(ks)
        ax.plot(ks, [coverage[k] if k in coverage else coverage[str(k)] for k in ks], marker="o", label=name)
    if len(all_ks) > 1 and min(all_ks) > 0:
        ax.set_xscale("log")
    ax.set_xticks(sorted(all_ks), labels=[str(k) for k in sorted(all_ks)])
    ax.minorticks_off()
    ax.set_ylim(bottom=0.0)
    ax.set_xlabel("k (top-k tokens of [CLS] · Eᵀ)")
    ax.set_ylabel("input token coverage@k")
    ax.set_title("Input token coverage of the [CLS] representation")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    with atomic_file(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=120)
    return path


def check_coverage_run(models: Sequence[str | os.PathLike], output_dir: str | os.PathLike, *,
                       tokenizer_given: bool = False, overwrite: bool = False) -> list[str]:
    """Everything `run_coverage` checks before any model loads, so that a bad second model or a taken output folder
    never costs a scored first model: the models (none, one twice, a local folder that is missing or incomplete, see
    `check_model_folder`) and `output_dir` (see `_check_results_folder`).

    Args:
        models: checkpoint directories / Hub ids (Hub ids are not checked here).
        output_dir: where coverage.json and coverage.png will go.
        tokenizer_given: one tokenizer is given for every model, so a folder need not carry its own.
        overwrite: replace coverage.json / coverage.png that are not ours or hold other models' results.

    Returns:
        The models as strings, the names they are reported under.

    Raises:
        ValueError: one line naming the model or file and the fix.
    """
    check_folder_option("--output-dir", output_dir)
    names = [str(m) for m in models]
    if not names:
        raise ValueError("no models given")
    if len(set(names)) != len(names):
        raise ValueError(f"models listed twice: {sorted({n for n in names if names.count(n) > 1})}")
    _check_results_folder(Path(output_dir), names, overwrite)
    for name in names:
        check_model_folder(name, purpose="coverage --model", tokenizer=not tokenizer_given)
    return names


def _check_results_folder(output_dir: Path, models: Sequence[str], overwrite: bool) -> None:
    """Refuse a folder in place of coverage.json or coverage.png, then apply `claim_output` with `coverage_holding`:
    the same models, by any path to them, may replace their own results."""
    for path in (output_dir / COVERAGE_JSON, output_dir / COVERAGE_PNG):
        if path.is_dir():
            raise ValueError(f"{path} is a folder; choose another --output-dir")
    claim_output(output_dir, "--output-dir", overwrite, kind="into", owner=lambda _: coverage_holding(output_dir, models),
                 inputs={f"the model {model}": model for model in models})


def coverage_holding(output_dir: Path, models: Sequence[str]) -> Holding:
    """Not ours: a coverage.json that this command did not write or that scored other models (every run's default
    `out/coverage` is the same folder), and a coverage.png without a coverage.json (ours always has one: the JSON is
    written first)."""
    results, plot = output_dir / COVERAGE_JSON, output_dir / COVERAGE_PNG
    if not results.is_file():
        return (f"a {COVERAGE_PNG} that `retromae coverage` did not write (no {COVERAGE_JSON} beside it)", False) \
            if plot.exists() else None
    record = read_json_or_empty(results)
    scored = record.get("model_paths")
    if not isinstance(scored, list):  # written before coverage.json recorded its models: the names given then
        scored, given = list(record.get("coverage") or {}), sorted(models)
    else:
        given = sorted(model_location(m) for m in models)
    if record.get("metric") != METRIC:
        return f"a {COVERAGE_JSON} that `retromae coverage` did not write", False
    if sorted(map(str, scored)) != given:
        return f"the coverage of {', '.join(map(str, scored))}", False
    return None


def run_coverage(
    models: Sequence[str | os.PathLike],
    texts: Iterable[str],
    tokenizer=None,
    output_dir: str | os.PathLike = ".",
    *,
    overwrite: bool = False,
    **options: Any,
) -> dict[str, dict[int, float]]:
    """Coverage@k of several models on the same texts; writes `coverage.json` (which records the models' resolved
    paths or Hub ids) and `coverage.png` to `output_dir`.

    Args:
        models: checkpoint directories / Hub ids; each is reported under the string given.
        texts: the corpus texts (materialised once and shared by all models).
        tokenizer: one tokenizer for every model; None loads each model's own.
        output_dir: created if missing; both files are replaced atomically.
        overwrite: replace a coverage.json (and coverage.png) there that this command did not write or that holds
            other models' results; without it they are refused before any model loads.
        options: the settings of `input_token_coverage` (ks, batch_size, max_seq_length, device, projection,
            show_progress_bar), its defaults for those not given.

    Returns:
        `{model: {k: coverage@k}}`.

    Raises:
        ValueError: what `check_coverage_run` refuses, before any model loads.
    """
    names = check_coverage_run(models, output_dir, tokenizer_given=tokenizer is not None, overwrite=overwrite)
    texts = [t for t in texts]
    settings = inspect.signature(input_token_coverage).bind(None, tokenizer, texts, **options)
    settings.apply_defaults()
    settings.arguments["ks"] = ks = tuple(settings.arguments["ks"])
    results: dict[str, dict[int, float]] = {}
    for name in names:
        logger.info("coverage: %s on %d texts", name, len(texts))
        results[name] = input_token_coverage(name, *settings.args[1:], **settings.kwargs)
        logger.info("coverage: %s %s", name, {k: round(v, 4) for k, v in results[name].items()})
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "metric": METRIC,
        "model_paths": [model_location(name) for name in names],  # tells our results for other models apart
        "projection": settings.arguments["projection"],
        "representation": "last-layer [CLS] state of the unmasked input",
        "denominator": "k",
        "ks": list(ks),
        "num_texts": len(texts),
        "max_seq_length": settings.arguments["max_seq_length"] or DEFAULT_MAX_SEQ_LENGTH,  # less where capped
        "coverage": {name: {str(k): v for k, v in cov.items()} for name, cov in results.items()},
    }
    write_json_atomic(out / COVERAGE_JSON, payload)  # first: a coverage.png without it is not ours
    if plot_coverage(results, out / COVERAGE_PNG) is None:  # no matplotlib: no plot of earlier results beside
        (out / COVERAGE_PNG).unlink(missing_ok=True)
    return results


__all__ = [
    "DEFAULT_KS", "DEFAULT_MAX_SEQ_LENGTH", "MIN_SEQ_LENGTH", "PROJECTIONS", "check_coverage_run", "coverage_at_k",
    "input_token_coverage", "plot_coverage", "run_coverage"
]
