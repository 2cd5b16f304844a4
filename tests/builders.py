"""Builders the tests share: tiny data files (corpus lines, JSONL records, BEIR folders), the flags of a tiny
`retromae pretrain` run, tiny BERT configurations and checkpoints, collator-shaped pre-training batches, and the
check that a checkpoint loads as remote code in a fresh interpreter."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

# the tiny vocabulary of the method tests: ids 0-4 play [PAD], -, [CLS], [SEP], [MASK]; 5.. are ordinary tokens
TINY_VOCAB = 99

# ---- tiny data ------------------------------------------------------------------------------------------------------

SENTENCES = [
    "Dense retrieval encodes queries and passages into vectors and ranks passages by inner product.",
    "The masked auto-encoder reconstructs the original sentence from its embedding and a masked copy.",
    "Whole word masking hides every piece of a word at once, which makes the task harder.",
    "Sparse lexical representations weight vocabulary terms and are stored in inverted indexes.",
    "Pre-training on in-domain text often improves retrieval quality after fine-tuning.",
    "A bi-encoder scores a query against millions of documents with one matrix product.",
    "Hard negatives are passages that look relevant to the retriever but are not.",
    "Knowledge distillation transfers the scores of a cross-encoder to a faster bi-encoder.",
]
PAIRS = [
    {"anchor": "A man is playing a guitar on stage.", "positive": "Someone performs music."},
    {"anchor": "Two dogs run through the snow.", "positive": "Animals are outside in winter."},
    {"anchor": "A woman reads a book in the park.", "positive": "A person is reading outdoors."},
    {"anchor": "Children build a sandcastle at the beach.", "positive": "Kids play with sand."},
]
# the vocabulary of the toy BEIR folders
WORDS = ["apple", "banana", "cherry", "dog", "elephant", "fish", "grape", "horse", "igloo", "jacket", "kite", "lemon",
         "mango", "night", "ocean", "piano", "queen", "river", "snake", "tiger"]


def write_file(path: Path, content: str | bytes) -> Path:
    """`content` (bytes as they are, text as UTF-8) at `path`, its folders made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def jsonl_text(*records: dict) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def texts_of(dataset) -> list[str]:
    return [row["text"] for row in dataset]


def write_lines(path: Path, lines: list[str]) -> Path:
    """A plain-text corpus: one passage a line."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path: Path, records: list) -> Path:
    """One JSON record a line; a string record is written as it is (to write broken lines)."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


def write_beir(folder: Path, num_docs: int = 30, splits=(("train", range(0, 12)), ("dev", range(12, 18))),
               extra_qrels: tuple[str, ...] | list[str] = (), second_positives: bool = False) -> Path:
    """A tiny BEIR folder of 18 queries: doc i is the positive of query i. `second_positives`: doc i+12 is a second
    positive of every third query. `extra_qrels`: raw lines added to every split's qrels file."""
    rng = random.Random(0)
    (folder / "qrels").mkdir(parents=True)
    corpus = []
    for i in range(num_docs):
        words = rng.sample(WORDS, 5)
        corpus.append({"_id": f"d{i}", "title": words[0], "text": " ".join(words)})
    write_jsonl(folder / "corpus.jsonl", corpus)
    write_jsonl(folder / "queries.jsonl", [{"_id": f"q{i}", "text": f"about {WORDS[i % 20]} and {WORDS[(i * 7) % 20]}"}
                                           for i in range(18)])
    for split, queries in splits:
        lines = ["query-id\tcorpus-id\tscore"]
        for q in queries:
            lines.append(f"q{q}\td{q}\t1")
            if second_positives and q % 3 == 0:
                lines.append(f"q{q}\td{q + 12}\t1")
        (folder / "qrels" / f"{split}.tsv").write_text("".join(line + "\n" for line in [*lines, *extra_qrels]))
    return folder


# ---- tiny `retromae pretrain` runs ----------------------------------------------------------------------------------


def pretrain_args(model: Path, corpus: Path | None, output: Path, *extra: str,
                  defaults: dict[str, str] | None = None) -> list[str]:
    """The flags of a tiny CPU run (4 steps, a checkpoint every 2, seed 7); `defaults` replaces some of them and a
    flag in `extra` replaces its default (the CLI refuses a flag given twice). `corpus` None: the data is in
    `extra` (`--corpus` or `--pairs`)."""
    flags = {"--model": str(model), "--corpus": str(corpus), "--output-dir": str(output), "--max-seq-length": "32",
             "--per-device-train-batch-size": "4", "--max-steps": "4", "--save-steps": "2", "--logging-steps": "1",
             "--seed": "7", "--disable-tqdm": "true", "--use-cpu": "true", **(defaults or {})}
    if corpus is None:
        del flags["--corpus"]
    given = {item for item in extra if item.startswith("--")}
    return ["pretrain", *[x for flag, value in flags.items() if flag not in given for x in (flag, value)], *extra]


# ---- tiny models ----------------------------------------------------------------------------------------------------


def tiny_bert_kwargs(**overrides) -> dict:
    """Tiny BERT sizes with the real 30,522-token vocabulary so the MiniLM tokenizer fits."""
    kwargs = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=128,
    )
    kwargs.update(overrides)
    return kwargs


def tiny_pretraining_config(config_class: type, **fields):
    """`config_class` (a pre-training config) at tiny BERT sizes with the `TINY_VOCAB` vocabulary."""
    return config_class(**tiny_bert_kwargs(vocab_size=TINY_VOCAB, max_position_embeddings=64), **fields)


def hub_cache_layout(folder: Path, repo_id: str, cache: Path) -> Path:
    """`cache`, a Hugging Face cache (`HF_HUB_CACHE`) in which `repo_id` resolves offline to a copy of `folder`'s
    files, as a Hub download leaves them."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    revision = "0" * 40
    shutil.copytree(folder, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return cache


def save_headless_bert(folder: Path, tokenizer, **config_overrides) -> Path:
    """A tiny BertModel (seed 0) without pooler or `cls.*` weights, as all-MiniLM-L6-v2 ships, saved with
    `tokenizer` beside it."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(**tiny_bert_kwargs(**config_overrides)), add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def masked_batch(batch_size: int = 3, seq_len: int = 12, pad: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows [CLS]=2 ... [SEP]=3 over `TINY_VOCAB`, the last row padded by `pad`; the encoder masks positions 2 and 5
    with [MASK]=4. Keys as the collator's: input_ids, attention_mask, encoder_labels, decoder_labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, TINY_VOCAB, (batch_size, seq_len), generator=generator)
    ids[:, 0] = 2
    ids[:, -1] = 3
    attention = torch.ones_like(ids)
    ids[-1, seq_len - pad :] = 0
    ids[-1, seq_len - pad - 1] = 3
    attention[-1, seq_len - pad :] = 0
    decoder_labels = ids.masked_fill((ids <= 3) | (attention == 0), -100)
    encoder_labels = torch.full_like(ids, -100)
    encoder_labels[:, [2, 5]] = ids[:, [2, 5]]
    masked = ids.clone()
    masked[:, [2, 5]] = 4
    return {"input_ids": masked, "attention_mask": attention, "encoder_labels": encoder_labels,
            "decoder_labels": decoder_labels}


# Run in a fresh interpreter without retromae: load a checkpoint folder (argv[1]) through the Auto classes as remote
# code and run its batch.json through it; prints one JSON line.
REMOTE_LOAD_SCRIPT = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining
try:
    import retromae  # noqa: F401
    sys.exit("retromae must not be importable here")
except ImportError:
    pass
d = sys.argv[1]
config = AutoConfig.from_pretrained(d, trust_remote_code=True)
encoder = AutoModel.from_pretrained(d, trust_remote_code=True).eval()
full = AutoModelForPreTraining.from_pretrained(d, trust_remote_code=True).eval()
batch = {k: torch.tensor(v) for k, v in json.load(open(d + "/batch.json")).items()}
with torch.no_grad():
    cls = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).pooler_output
    torch.manual_seed(0)
    out = full(**batch)
decoder = full.decoder if "decoder" in dict(full.named_children()) else None
print(json.dumps({
    "classes": [type(config).__name__, type(encoder).__name__, type(full).__name__],
    "config": config.to_dict(),
    "cls": cls.tolist(),
    "losses": {name: value.item() for name, value in out.items() if name.endswith("loss")},
    "tied": full.get_output_embeddings().weight.data_ptr() == full.get_input_embeddings().weight.data_ptr(),
    "decoder_layers": 0 if decoder is None else len(decoder.layers),
}))
"""


def load_in_fresh_process(
    run_without_retromae, model, batch: dict[str, torch.Tensor], tmp_path: Path
) -> tuple[Path, dict]:
    """Save `model` to `tmp_path/checkpoint` and load it there as remote code in a fresh interpreter without retromae
    (`run_without_retromae`: the conftest fixture), running `batch` through it.

    Returns:
        The checkpoint folder and the fresh process's report: `classes` (config, AutoModel, AutoModelForPreTraining),
        `config` (as a dict), `cls` (the encoder's pooler output), `losses` (the pre-training model's, under
        `torch.manual_seed(0)`), `tied` (MLM decoder shares the word embeddings), `decoder_layers`.
    """
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    (checkpoint / "batch.json").write_text(json.dumps({k: v.tolist() for k, v in batch.items()}))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = run_without_retromae(REMOTE_LOAD_SCRIPT, [str(checkpoint)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return checkpoint, json.loads(result.stdout.strip().splitlines()[-1])


def assert_fresh_process_matches(model, batch: dict[str, torch.Tensor], report: dict) -> None:
    """The fresh process's [CLS] embedding and every loss equal `model`'s own (eval mode, same seed)."""
    with torch.no_grad():
        torch.manual_seed(0)
        out = model(**batch)
    assert torch.allclose(torch.tensor(report["cls"]), out.sentence_embedding, atol=1e-6)
    expected = {name: value.item() for name, value in out.items() if name.endswith("loss")}
    assert report["losses"].keys() == expected.keys()
    for name, value in expected.items():
        assert abs(report["losses"][name] - value) < 1e-5, name


def assert_loads_as_remote_code(run_without_retromae, model, tmp_path: Path, module: str,
                                classes: tuple[str, str, str]) -> tuple[Path, dict, dict]:
    """Save `model` (a pre-training model in eval mode), load it as remote code in a fresh interpreter without
    retromae and run `masked_batch()` through it: the saved `auto_map` points the Auto classes at
    `configuration_<module>.py` / `modeling_<module>.py`, they resolve to `classes` (config, AutoModel,
    AutoModelForPreTraining), and the [CLS] embedding and every loss equal the model's own.

    Returns:
        The checkpoint folder, its saved config.json and the fresh process's report (see `load_in_fresh_process`).
    """
    batch = masked_batch()
    checkpoint, report = load_in_fresh_process(run_without_retromae, model, batch, tmp_path)
    saved = json.loads((checkpoint / "config.json").read_text())
    config_class, model_class, pretraining_class = classes
    assert saved["auto_map"] == {
        "AutoConfig": f"configuration_{module}.{config_class}",
        "AutoModel": f"modeling_{module}.{model_class}",
        "AutoModelForPreTraining": f"modeling_{module}.{pretraining_class}",
        "AutoModelForMaskedLM": f"modeling_{module}.{type(model).masked_lm_class.__name__}",
    }
    assert report["classes"] == list(classes)
    assert_fresh_process_matches(model, batch, report)
    return checkpoint, saved, report


def load_with_legacy_key(config, folder, old: str, new: str, caplog):
    """Save `config`, rename its key `new` back to `old` in config.json (a file written before the rename), load it
    again and check the deprecation warning; returns the loaded config."""
    config.save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    assert old not in saved
    saved[old] = saved.pop(new)
    (folder / "config.json").write_text(json.dumps(saved))
    with caplog.at_level(logging.WARNING, logger="retromae.modeling.configuration_retromae"):
        loaded = type(config).from_pretrained(folder)
    assert getattr(loaded, new) == getattr(config, new) and not hasattr(loaded, old)
    assert any(f"`{old}` is deprecated" in record.getMessage() for record in caplog.records)
    return loaded


# ---- benchmark scripts ----------------------------------------------------------------------------------------------

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def benchmark_script(name: str) -> ModuleType:
    """A script as `python benchmarks/NAME.py` loads it: its `import common` and `import phases` find the modules
    of benchmarks/ (registered only while the script loads; sys.path is left alone)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", dict(os.environ))  # the scripts' environment defaults stay out of other tests
        patch.setitem(sys.modules, "common", load_script("common"))
        patch.setitem(sys.modules, "phases", load_script("phases"))
        return load_script(name)


def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, str], str]:
    """Replace `time.perf_counter` by a clock per thread that reads one second after its last reading (0 first), for
    the seconds a benchmark ledger (`common.Phases`) records.

    Returns:
        `work(seconds, result)`: lets `seconds` readings pass on the calling thread's clock, then returns `result`.
    """
    clocks = threading.local()

    def read() -> float:
        clocks.now = getattr(clocks, "now", -1) + 1
        return float(clocks.now)

    def work(seconds: int, result: str) -> str:
        for _ in range(seconds):
            read()
        return result

    monkeypatch.setattr(time, "perf_counter", read)
    return work


# ---- tiny RoBERTa / XLM-R / ModernBERT bases (no download) ------------------------------------------------------------

# The special tokens of each family, in the order the real tokenizers number them. RoBERTa and XLM-R: <s> <pad> </s>
# <unk> first (ids 0-3), <mask> last; ModernBERT (GPT-NeoX BPE): all five after the BPE vocabulary, ids
# [UNK] < [CLS] < [SEP] < [PAD] < [MASK] as in answerdotai/ModernBERT-base (50280-50284).
BPE_FAMILIES = ("roberta", "xlm-roberta", "modernbert")
_FIRST_SPECIALS = {"roberta": ["<s>", "<pad>", "</s>", "<unk>"], "xlm-roberta": ["<s>", "<pad>", "</s>", "<unk>"],
                   "modernbert": []}
_LAST_SPECIALS = {"roberta": ["<mask>"], "xlm-roberta": ["<mask>"],
                  "modernbert": ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]}
# the mask token swallows the space before it ("a <mask> b"), as in the real tokenizers
_LSTRIP = {"<mask>", "[MASK]"}
_SPECIAL_MAP = {
    "roberta": dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", unk_token="<unk>",
                    pad_token="<pad>", mask_token="<mask>"),
    "modernbert": dict(cls_token="[CLS]", sep_token="[SEP]", unk_token="[UNK]", pad_token="[PAD]",
                       mask_token="[MASK]"),
}
_SPECIAL_MAP["xlm-roberta"] = _SPECIAL_MAP["roberta"]

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


def _bpe_training_text(corpus_texts: list[str] | None) -> list[str]:
    """The built-in English text (the tests' sentences, pairs and words, every printable ASCII character) plus
    `corpus_texts`."""
    import string

    pairs = [text for pair in PAIRS for text in pair.values()]
    return [*SENTENCES, *pairs, " ".join(WORDS), "hello world", string.printable.strip(), *(corpus_texts or [])]


def tiny_bpe_tokenizer(family: str, corpus_texts: list[str] | None = None, vocab_size: int = 300, *,
                       model_max_length: int = 128) -> PreTrainedTokenizerFast:
    """A subword tokenizer of `family` ("roberta", "xlm-roberta", "modernbert") trained in milliseconds on the built-in
    English text plus `corpus_texts`, wrapped as a transformers `PreTrainedTokenizerFast` (transformers 5: the
    `TokenizersBackend`; saved with `tokenizer_class` "TokenizersBackend", which `AutoTokenizer` loads back).

    - "roberta": byte-level BPE (`Ġ` marks a leading space) with RobertaProcessing: `<s> A </s>`, pair
      `<s> A </s></s> B </s>`; ids <s> 0, <pad> 1, </s> 2, <unk> 3, <mask> last.
    - "xlm-roberta": SentencePiece-like Unigram (NFKC, whitespace split, `▁` metaspace, unknown characters become
      <unk>) with the same template and ids as "roberta".
    - "modernbert": GPT-NeoX-style byte-level BPE with `[CLS] A [SEP]`, pair `[CLS] A [SEP] B [SEP]`; [UNK], [CLS],
      [SEP], [PAD], [MASK] follow the BPE vocabulary (ids `vocab_size - 5` ..).

    The mask token strips the space before it; `word_ids()` gives one word per whitespace-separated word (the
    pre-tokenizer's split; punctuation is its own word in the byte-level families). No token_type_ids are returned,
    as by the real tokenizers. `len(tokenizer)` is `vocab_size` for the BPE families and at most `vocab_size` for
    the Unigram one (its trainer stops when the text has no more pieces).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if family not in BPE_FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {BPE_FAMILIES}")
    first, last = _FIRST_SPECIALS[family], _LAST_SPECIALS[family]
    if family == "xlm-roberta":
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
        tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size - len(last), special_tokens=first, unk_token="<unk>",
                                          show_progress=False, max_piece_length=8)
    else:
        tokenizer = Tokenizer(models.BPE())
        if family == "modernbert":
            tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(last), special_tokens=first, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_bpe_training_text(corpus_texts), trainer)
    if family == "xlm-roberta":
        # The Unigram trainer orders pieces of equal score at random and its scores differ in the 11th digit from run
        # to run; specials first, then score (rounded), then piece makes the ids the same in every build.
        vocab = json.loads(tokenizer.to_str())["model"]["vocab"]
        pieces = sorted(((piece, round(score, 4)) for piece, score in vocab[len(first):]), key=lambda p: (-p[1], p[0]))
        specials = [(piece, score) for piece, score in vocab[: len(first)]]
        tokenizer.model = models.Unigram([*specials, *pieces], unk_id=first.index("<unk>"))
    tokenizer.add_special_tokens([AddedToken(token, special=True, lstrip=token in _LSTRIP) for token in last])
    special = _SPECIAL_MAP[family]
    cls, sep = special["cls_token"], special["sep_token"]
    cls_id, sep_id = tokenizer.token_to_id(cls), tokenizer.token_to_id(sep)
    if family == "roberta":
        tokenizer.post_processor = processors.RobertaProcessing((sep, sep_id), (cls, cls_id), trim_offsets=True,
                                                                add_prefix_space=False)
    elif family == "xlm-roberta":
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
            special_tokens=[(cls, cls_id), (sep, sep_id)])
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, cls_id), (sep, sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length,
                                   model_input_names=["input_ids", "attention_mask"], **special)


def save_tiny_masked_lm(folder: Path, family: str, tokenizer, seed: int = 0, headless: bool = False,
                        **overrides) -> Path:
    """A tiny random masked LM of `family` (torch seed `seed`) sized for `tokenizer` (a `tiny_bpe_tokenizer`), saved
    as safetensors with `tokenizer` beside it; returns `folder`.

    RobertaForMaskedLM / XLMRobertaForMaskedLM: hidden 32, 2 layers, 2 heads, intermediate 64, type_vocab_size 1,
    `max_position_embeddings = model_max_length + pad_token_id + 1` (positions count from pad + 1, so all
    `model_max_length` positions are usable). ModernBertForMaskedLM: the same sizes with 3 layers (layer 0 global,
    layers 1-2 local, `global_attn_every_n_layers=3`, `local_attention=16`) and `max_position_embeddings =
    model_max_length` (RoPE). The special ids in the config (pad/bos/eos, ModernBERT also cls/sep) are the
    tokenizer's; `vocab_size = len(tokenizer)`. `headless`: the bare RobertaModel (no pooler) / XLMRobertaModel (no
    pooler) / ModernBertModel, whose keys carry no `lm_head.*` / `head.*` / `decoder.*` and no base prefix.
    `overrides` replace config fields (e.g. `num_hidden_layers`, `initializer_range`).
    """
    import transformers

    if family not in BPE_FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {BPE_FAMILIES}")
    max_len = tokenizer.model_max_length if tokenizer.model_max_length <= 4096 else 128
    sizes = dict(vocab_size=len(tokenizer), hidden_size=32, num_attention_heads=2, intermediate_size=64,
                 pad_token_id=tokenizer.pad_token_id)
    if family == "modernbert":
        prefix = "ModernBert"
        kwargs = dict(sizes, num_hidden_layers=3, global_attn_every_n_layers=3, local_attention=16,
                      max_position_embeddings=max_len, bos_token_id=tokenizer.cls_token_id,
                      eos_token_id=tokenizer.sep_token_id, cls_token_id=tokenizer.cls_token_id,
                      sep_token_id=tokenizer.sep_token_id)
    else:
        prefix = "Roberta" if family == "roberta" else "XLMRoberta"
        kwargs = dict(sizes, num_hidden_layers=2, type_vocab_size=1, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id,
                      max_position_embeddings=max_len + tokenizer.pad_token_id + 1)
    config = getattr(transformers, f"{prefix}Config")(**{**kwargs, **overrides})
    torch.manual_seed(seed)
    if not headless:
        model = getattr(transformers, f"{prefix}ForMaskedLM")(config)
    elif family == "modernbert":
        model = transformers.ModernBertModel(config)
    else:
        model = getattr(transformers, f"{prefix}Model")(config, add_pooling_layer=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def dead_pid() -> int:
    """The id of a process that has ended (what a killed writer leaves in its temporary folders' names)."""
    import subprocess

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid
