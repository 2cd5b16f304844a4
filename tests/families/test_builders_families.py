"""Tests for the tiny RoBERTa / XLM-R / ModernBERT builders (`tiny_bpe_tokenizer`, `save_tiny_masked_lm`) and their
fixtures: the folders load through the Auto classes, the tokenizers wrap text in the family's special tokens and give
word ids, and retromae's tokenization and masking accept them."""

from __future__ import annotations

import json

import datasets
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..builders import BPE_FAMILIES, SENTENCES, save_tiny_masked_lm, tiny_bpe_tokenizer

FIXTURES = {"roberta": "tiny_roberta", "xlm-roberta": "tiny_xlm_roberta", "modernbert": "tiny_modernbert"}
MODEL_CLASSES = {"roberta": "RobertaForMaskedLM", "xlm-roberta": "XLMRobertaForMaskedLM",
                 "modernbert": "ModernBertForMaskedLM"}
# (cls, sep, pad, unk, mask) tokens of each family
SPECIALS = {"roberta": ("<s>", "</s>", "<pad>", "<unk>", "<mask>"),
            "xlm-roberta": ("<s>", "</s>", "<pad>", "<unk>", "<mask>"),
            "modernbert": ("[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")}


@pytest.fixture(params=BPE_FAMILIES)
def family_folder(request):
    return request.param, request.getfixturevalue(FIXTURES[request.param])


def _load(folder):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return AutoModelForMaskedLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def test_folder_loads_and_runs_with_labels(family_folder):
    family, folder = family_folder
    model, tokenizer = _load(folder)
    assert type(model).__name__ == MODEL_CLASSES[family]
    assert tokenizer.is_fast and model.config.vocab_size == len(tokenizer)
    cls, sep, pad, unk, mask = SPECIALS[family]
    assert (tokenizer.cls_token, tokenizer.sep_token, tokenizer.pad_token, tokenizer.unk_token,
            tokenizer.mask_token) == (cls, sep, pad, unk, mask)
    assert tokenizer.mask_token_id is not None and tokenizer.mask_token_id == len(tokenizer) - 1
    assert model.config.pad_token_id == tokenizer.pad_token_id
    if family == "modernbert":
        assert (model.config.cls_token_id, model.config.sep_token_id) == (tokenizer.cls_token_id, tokenizer.sep_token_id)
    else:
        assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
            0, 1, 2, 3)
        assert (model.config.bos_token_id, model.config.eos_token_id) == (0, 2)
        assert tokenizer.bos_token_id == tokenizer.cls_token_id and tokenizer.eos_token_id == tokenizer.sep_token_id

    batch = tokenizer(SENTENCES[:3], padding=True, return_tensors="pt")
    assert set(batch) == {"input_ids", "attention_mask"}  # no token_type_ids, as the real tokenizers
    encoding = tokenizer(SENTENCES[0])
    assert encoding.input_ids[0] == tokenizer.cls_token_id and encoding.input_ids[-1] == tokenizer.sep_token_id
    words = encoding.word_ids()
    assert words[0] is None and words[-1] is None and all(w is not None for w in words[1:-1])
    # one word per pre-tokenizer split: whitespace words (XLM-R), and punctuation on its own (byte-level families)
    splits = tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(SENTENCES[0])
    assert max(words[1:-1]) + 1 == len(splits) >= len(SENTENCES[0].split())
    assert tokenizer.unk_token_id not in encoding.input_ids

    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    masked = batch["input_ids"].clone()
    masked[:, 3] = tokenizer.mask_token_id
    with torch.no_grad():
        out = model(input_ids=masked, attention_mask=batch["attention_mask"], labels=labels)
    assert out.logits.shape == (*masked.shape, len(tokenizer))
    assert torch.isfinite(out.loss) and out.loss.item() > 0


def test_pair_templates_and_mask_token():
    roberta, modernbert = tiny_bpe_tokenizer("roberta"), tiny_bpe_tokenizer("modernbert")
    a, b = roberta("dog", add_special_tokens=False).input_ids, roberta("fish", add_special_tokens=False).input_ids
    assert roberta("dog", "fish").input_ids == [0, *a, 2, 2, *b, 2]
    a, b = modernbert("dog", add_special_tokens=False).input_ids, modernbert("fish", add_special_tokens=False).input_ids
    cls, sep = modernbert.cls_token_id, modernbert.sep_token_id
    assert modernbert("dog", "fish").input_ids == [cls, *a, sep, *b, sep]
    # the mask token swallows the space before it, as <mask> / [MASK] in the real tokenizers
    for tokenizer in (roberta, tiny_bpe_tokenizer("xlm-roberta"), modernbert):
        ids = tokenizer(f"a {tokenizer.mask_token} dog", add_special_tokens=False).input_ids
        assert ids[1] == tokenizer.mask_token_id, tokenizer.convert_ids_to_tokens(ids)


def test_roberta_positions_cover_model_max_length(tiny_roberta, tiny_xlm_roberta):
    for folder in (tiny_roberta, tiny_xlm_roberta):
        model, tokenizer = _load(folder)
        usable = model.config.max_position_embeddings - model.config.pad_token_id - 1
        assert usable >= 128 and tokenizer.model_max_length == 128 and model.config.type_vocab_size == 1
        ids = tokenizer(" ".join(SENTENCES), truncation=True, max_length=128, return_tensors="pt").input_ids
        assert ids.shape == (1, 128)
        with torch.no_grad():
            assert torch.isfinite(model(input_ids=ids).logits).all()


def test_modernbert_has_global_and_local_layers(tiny_modernbert):
    config = json.loads((tiny_modernbert / "config.json").read_text())
    assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    assert config["local_attention"] == 16 and config["num_hidden_layers"] == 3


@pytest.mark.parametrize("family", BPE_FAMILIES)
def test_headless_keys_are_the_bare_models(tmp_path, family):
    from transformers import AutoModel

    tokenizer = tiny_bpe_tokenizer(family)
    full = save_tiny_masked_lm(tmp_path / "full", family, tokenizer)
    bare = save_tiny_masked_lm(tmp_path / "bare", family, tokenizer, headless=True)
    keys = {}
    for name, folder in (("full", full), ("bare", bare)):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys[name] = set(f.keys())
    heads = ("lm_head.", "head.", "decoder.", "pooler.", "roberta.", "model.")
    assert not any(key.startswith(heads) or ".pooler." in key for key in keys["bare"])
    prefix = "model." if family == "modernbert" else "roberta."
    assert {prefix + key for key in keys["bare"]} <= keys["full"]
    assert any(key.startswith(("lm_head.", "head.", "decoder.")) for key in keys["full"])
    assert (bare / "tokenizer.json").is_file()
    encoder = AutoModel.from_pretrained(bare)
    assert type(encoder).__name__ == MODEL_CLASSES[family].replace("ForMaskedLM", "Model")


def test_builds_are_deterministic(tmp_path):
    for family in BPE_FAMILIES:
        first, second = tiny_bpe_tokenizer(family), tiny_bpe_tokenizer(family)
        assert first.get_vocab() == second.get_vocab()
        folders = [save_tiny_masked_lm(tmp_path / f"{family}{i}", family, tok) for i, tok in enumerate((first, second))]
        tensors = [load_file(folder / "model.safetensors") for folder in folders]
        assert tensors[0].keys() == tensors[1].keys()
        assert all(torch.equal(tensors[0][key], tensors[1][key]) for key in tensors[0])


def test_overrides_and_corpus_texts(tmp_path):
    from transformers import AutoConfig

    # corpus_texts: characters the built-in text lacks become pieces of the Unigram tokenizer instead of <unk>
    text = "Straße café 東京"
    plain, trained = tiny_bpe_tokenizer("xlm-roberta"), tiny_bpe_tokenizer("xlm-roberta", [text])
    assert plain.unk_token_id in plain(text).input_ids
    assert trained.unk_token_id not in trained(text).input_ids
    # the byte-level families never need <unk>
    assert tiny_bpe_tokenizer("roberta").unk_token_id not in tiny_bpe_tokenizer("roberta")(text).input_ids
    assert len(tiny_bpe_tokenizer("modernbert", vocab_size=280)) == 280
    folder = save_tiny_masked_lm(tmp_path / "m", "roberta", tiny_bpe_tokenizer("roberta", model_max_length=64),
                                 seed=3, num_hidden_layers=1)
    config = AutoConfig.from_pretrained(folder)
    assert (config.num_hidden_layers, config.max_position_embeddings) == (1, 64 + 1 + 1)
    with pytest.raises(ValueError, match="unknown family"):
        tiny_bpe_tokenizer("bert")


@pytest.mark.parametrize("packing", [False, True])
def test_retromae_tokenization_and_masking_accept_the_tokenizers(family_folder, packing, datasets_cache):
    from retromae.trainers.data.collator import PretrainingCollator
    from retromae.trainers.data.tokenize import special_template, tokenize_corpus
    from transformers import AutoTokenizer

    family, folder = family_folder
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert special_template(tokenizer) == ([tokenizer.cls_token_id], [tokenizer.sep_token_id])
    corpus = datasets.Dataset.from_dict({"text": SENTENCES * 2})
    tokenized = tokenize_corpus(corpus, tokenizer, max_seq_length=32, packing=packing)
    assert len(tokenized) > 0
    for row in tokenized:
        ids, starts = row["input_ids"], row["word_starts"]
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id and len(ids) <= 32
        assert 0 < sum(starts[1:-1]) < len(ids) - 2  # multi-piece words exist: not every token starts a word
    collator = PretrainingCollator(tokenizer, generator=torch.Generator().manual_seed(0))
    batch = collator([dict(row) for row in tokenized.select(range(4))])
    masked = batch["encoder_labels"] != -100
    assert masked.any()
    specials = torch.tensor(tokenizer.all_special_ids)
    original = torch.where(masked, batch["encoder_labels"], batch["input_ids"])
    assert not torch.isin(original[masked], specials).any()
    assert (batch["input_ids"][masked] == tokenizer.mask_token_id).any()
    assert ((batch["decoder_labels"] != -100) == (batch["attention_mask"].bool() & ~torch.isin(original, specials))).all()
