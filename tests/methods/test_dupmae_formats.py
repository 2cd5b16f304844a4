"""`retromae export --format dense|sparse` of a DupMAE checkpoint (trainers/export/parts.py): folders that
plain sentence-transformers loads without remote code, compared with the hybrid (remote-code) export.

The measured differences are printed (`pytest -s`); the asserted bounds hold them with a margin."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.cli import main
from retromae.trainers.methods import METHODS
from sentence_transformers import SentenceTransformer, SparseEncoder

from ..builders import tiny_bert_kwargs
from ..commands.test_export import RUN_INFO, TEXTS, _save_checkpoint
from ..families.test_families_export import FAMILIES, _checkpoints

QUERIES = ["what do dense retrievers encode", "hi", "masked auto-encoder pre-training"]
DOC_TOP_K = 64


def _export(checkpoint: Path, out: Path, export_format: str) -> Path:
    assert main(["export", str(checkpoint), str(out), "--format", export_format]) == 0
    return out


@pytest.fixture(scope="module", params=["none", "log1p_relu"])
def exports(request, tmp_path_factory, tokenizer) -> dict:
    """A tiny random DupMAE checkpoint (`ot_activation` = the param) exported in the three formats, loaded WITHOUT
    trust_remote_code for dense and sparse (a folder needing it raises instead of loading)."""
    torch.manual_seed(0)
    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=DOC_TOP_K, ot_activation=request.param)
    root = tmp_path_factory.mktemp(f"dupmae-{request.param}")
    checkpoint = _save_checkpoint(DupMAEForPretraining(config).eval(), tokenizer, root / "checkpoint-500",
                                  {**RUN_INFO, "method": "dupmae"})
    folders = {f: _export(checkpoint, root / f, f) for f in ("hybrid", "dense", "sparse")}
    return {
        "activation": request.param,
        "folders": folders,
        "hybrid": SentenceTransformer(str(folders["hybrid"]), trust_remote_code=True),
        "dense": SentenceTransformer(str(folders["dense"])),
        "sparse": SparseEncoder(str(folders["sparse"])),
    }


def _hybrid_parts(model: SentenceTransformer, texts: list[str], task: str) -> dict[str, torch.Tensor]:
    """The hybrid export's outputs by name, stacked: dense_embedding, ot_embedding (full mu), sparse_embedding."""
    encode = model.encode_query if task == "query" else model.encode_document
    rows = encode(texts, output_value=None)
    return {k: torch.stack([row[k] for row in rows]).float()
            for k in ("dense_embedding", "ot_embedding", "sparse_embedding", "sentence_embedding") if k in rows[0]}


def _sparse(model: SparseEncoder, texts: list[str], task: str) -> torch.Tensor:
    """The sparse export's vectors as a dense tensor; queries keep every entry (DupMAE's full query mu)."""
    if task == "query":
        vectors = model.encode_query(texts, max_active_dims=model.get_embedding_dimension(), convert_to_tensor=True)
    else:
        vectors = model.encode_document(texts, convert_to_tensor=True)
    return vectors.to_dense().float()


def _special_token_max(model: SparseEncoder, texts: list[str]) -> torch.Tensor:
    """Max over the [CLS] / [SEP] positions of the exported MLM head's raw logits `(batch, vocab)`: what SpladePooling
    pools beside DupMAE's ordinary tokens."""
    features = model.preprocess(texts)
    inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}
    with torch.inference_mode():
        logits = model[0].auto_model(**inputs).logits.float()
    special_ids = torch.tensor(model.tokenizer.all_special_ids)
    special = torch.isin(inputs["input_ids"], special_ids) & inputs["attention_mask"].bool()
    return logits.masked_fill(~special[..., None], float("-inf")).amax(dim=1)


def _activated(ot: torch.Tensor, activation: str) -> torch.Tensor:
    """DupMAE's mu through log(1 + relu(.)): SpladePooling's "relu" (already applied for ot_activation log1p_relu)."""
    return ot if activation == "log1p_relu" else torch.log1p(torch.relu(ot))


def test_both_folders_load_without_remote_code(exports):
    for name in ("dense", "sparse"):
        folder = exports["folders"][name]
        assert not list(folder.glob("*.py")), "no remote code in the folder"
        assert "st_dupmae" not in (folder / "modules.json").read_text()
    assert [type(m).__name__ for m in exports["dense"]] == ["Transformer", "Pooling", "Dense"]
    assert [type(m).__name__ for m in exports["sparse"]] == ["Transformer", "SpladePooling"]
    assert exports["sparse"].max_active_dims == DOC_TOP_K and exports["sparse"].similarity_fn_name == "dot"
    assert exports["dense"].similarity_fn_name == "dot"
    assert "SparseEncoder(" in (exports["folders"]["sparse"] / "README.md").read_text()


def test_the_dense_folder_loads_without_a_pooler(exports):
    """As the hybrid and CLS exports (no pooler weights are saved). HEAD: its sentence_bert_config.json lacked
    `add_pooling_layer: false`, so loading built a random pooler and transformers printed a "pooler.dense.* MISSING"
    report (probe 79 B-006)."""
    config = json.loads((exports["folders"]["dense"] / "sentence_bert_config.json").read_text())
    assert config["model_kwargs"]["add_pooling_layer"] is False
    assert exports["dense"][0].auto_model.pooler is None


@pytest.mark.parametrize(("part", "tag", "pipeline"), [("dense", "dense", "sentence-similarity"),
                                                     ("sparse", "sparse-encoder", "feature-extraction")])
def test_the_part_cards_are_the_other_export_cards_with_their_own_usage(exports, part, tag, pipeline):
    """The front matter, the not-fine-tuned warning, the run details and the citation of the hybrid export's card
    (`render_pretrained_card`), with the part's tag, pipeline and usage. HEAD: no license, language or `retromae` tag,
    11-22 lines without the warning, run details or citation (probe 78 B-005)."""
    hybrid = ModelCard.load(exports["folders"]["hybrid"] / "README.md").data
    card = ModelCard.load(exports["folders"][part] / "README.md")
    assert (card.data.license, card.data.language, card.data.library_name) == ("apache-2.0", "en",
                                                                               "sentence-transformers")
    assert (card.data.pipeline_tag, set(card.data.tags)) == (pipeline, set(hybrid.tags) - {"custom_code"} | {tag})
    assert "retromae" in card.data.tags
    assert (card.data.base_model, card.data.model_name) == (hybrid.base_model, hybrid.model_name)
    for section in ("A **pre-trained, not fine-tuned** BERT encoder", "| Pre-training steps | 500 |",
                    "### Training hyperparameters", "| `doc_top_k` | 64 |", "| `loss` | 12.3000 |",
                    "no `trust_remote_code`", METHODS["dupmae"].paper.bibtex):
        assert section in card.text, section


def test_each_dupmae_card_states_the_sentence_transformers_release_it_needs(exports):
    """5.4 is the first release with the module paths the folders name (5.3 fails to load them); releases before 6.2
    load the sparse folder without its `max_active_dims`, so its card says so and its snippet passes it. HEAD: the
    sparse card stated nothing (5.7 kept ~28k entries, scores 33x off), the hybrid card ">= 6" (probe 78 B-002)."""
    texts = {name: " ".join((exports["folders"][name] / "README.md").read_text().split())
             for name in ("hybrid", "dense", "sparse")}
    assert "it needs sentence-transformers >= 5.4)" in texts["hybrid"]
    assert "Requires sentence-transformers >= 5.4." in texts["dense"]
    assert ("Requires sentence-transformers >= 5.4; releases before 6.2 do not read `max_active_dims` (64) from this "
            "folder and keep every positive entry, so pass it when loading, as below.") in texts["sparse"]
    folder = exports["folders"]["sparse"]
    code = (folder / "README.md").read_text().split("```python\n")[-1].split("```")[0]
    assert f'SparseEncoder("<this folder or repo>", max_active_dims={DOC_TOP_K})' in code
    namespace: dict = {}
    exec(code.replace("<this folder or repo>", str(folder)), namespace)  # noqa: S102 - the card's code, as a user runs it
    assert namespace["model"].max_active_dims == DOC_TOP_K and namespace["scores"].shape == (1, 1)


FRESH_LOAD_SCRIPT = """
import json, sys
from sentence_transformers import SentenceTransformer, SparseEncoder
dense, sparse = SentenceTransformer(sys.argv[1]), SparseEncoder(sys.argv[2])  # no trust_remote_code
texts = json.loads(sys.argv[3])
print(json.dumps({"dense": dense.encode_document(texts).tolist(),
                  "sparse": sparse.encode_document(texts, convert_to_tensor=True).to_dense().tolist()}))
"""


def test_both_folders_load_where_retromae_is_not_installed(exports, run_without_retromae, tmp_path):
    """A fresh interpreter without retromae (and without trust_remote_code) gives the same vectors."""
    folders, env = exports["folders"], {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = run_without_retromae(FRESH_LOAD_SCRIPT, [str(folders["dense"]), str(folders["sparse"]),
                                                      json.dumps(TEXTS)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    torch.testing.assert_close(torch.tensor(report["dense"]),
                               exports["dense"].encode_document(TEXTS, convert_to_tensor=True), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(report["sparse"]), _sparse(exports["sparse"], TEXTS, "document"),
                               atol=1e-6, rtol=0)


RESAVE_SCRIPT = """
import sys
from sentence_transformers import SentenceTransformer
SentenceTransformer(sys.argv[1], trust_remote_code=True).save(sys.argv[2])  # what a Hub user does, then push_to_hub
"""
RELOAD_SCRIPT = """
import json, sys
from sentence_transformers import SentenceTransformer
model, texts = SentenceTransformer(sys.argv[1], trust_remote_code=True), json.loads(sys.argv[2])
print(json.dumps({"query": model.encode_query(texts).tolist(), "document": model.encode_document(texts).tolist()}))
"""


def test_the_hybrid_export_resaved_by_sentence_transformers_loads_where_retromae_is_not_installed(
        exports, run_without_retromae, tmp_path):
    """A Hub user loads the hybrid export as remote code and re-saves it with `SentenceTransformer.save`; a fresh
    interpreter without retromae loads the copy and gets the export's vectors. HEAD: `ModuleNotFoundError:
    st_dupmae` (sentence-transformers wrote the module's code into 1_DupMAEPooling/ only, and loads it from the
    root)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    resaved = tmp_path / "resaved"
    result = run_without_retromae(RESAVE_SCRIPT, [str(exports["folders"]["hybrid"]), str(resaved)], cwd=tmp_path,
                                  env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((resaved / "modules.json").read_text())[1]["type"] == "st_dupmae.DupMAEPooling"
    result = run_without_retromae(RELOAD_SCRIPT, [str(resaved), json.dumps(TEXTS)], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    hybrid = exports["hybrid"]
    torch.testing.assert_close(torch.tensor(report["query"]), hybrid.encode_query(TEXTS, convert_to_tensor=True),
                               atol=0, rtol=0)
    torch.testing.assert_close(torch.tensor(report["document"]),
                               hybrid.encode_document(TEXTS, convert_to_tensor=True), atol=0, rtol=0)


@pytest.mark.parametrize("task", ["query", "document"])
def test_dense_export_is_the_hybrid_dense_part(exports, task):
    texts = QUERIES if task == "query" else TEXTS
    want = _hybrid_parts(exports["hybrid"], texts, task)["dense_embedding"]
    encode = exports["dense"].encode_query if task == "query" else exports["dense"].encode_document
    got = encode(texts, convert_to_tensor=True).float()
    print(f"\n[{exports['activation']}/{task}] dense max |diff| = {(got - want).abs().max().item():.2e}")
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_sparse_export_is_dupmae_mu_plus_the_special_tokens(exports):
    """Exact part: the sparse export's full vector = log1p(relu(max(mu, special-token logits))), i.e. DupMAE's mu
    (log1p-relu'd) except where a [CLS]/[SEP] logit is larger. Then the measured differences from DupMAE's mu."""
    texts, activation = TEXTS + QUERIES, exports["activation"]
    got = _sparse(exports["sparse"], texts, "query")
    mu = _activated(_hybrid_parts(exports["hybrid"], texts, "query")["ot_embedding"], activation)
    special = torch.log1p(torch.relu(_special_token_max(exports["sparse"], texts)))
    torch.testing.assert_close(got, torch.maximum(mu, special), atol=1e-5, rtol=1e-5)
    assert (got >= mu - 1e-5).all()  # extra positions can only raise a max
    positive = mu > 0
    changed = ((got - mu).abs() > 1e-5) & positive
    print(f"\n[{activation}] special tokens win on {changed.sum().item() / positive.sum().item():.1%} of mu's positive "
          f"entries; max |diff| there {(got - mu).abs().max().item():.3f} (max mu {mu.max().item():.3f})")
    raw_negative = (_hybrid_parts(exports["hybrid"], texts, "query")["ot_embedding"] < 0).float().mean().item()
    print(f"[{activation}] share of mu entries < 0 (become 0): {raw_negative:.1%}")
    if activation == "none":  # the raw mu has negatives, which SpladePooling's relu drops
        assert raw_negative > 0


def test_sparse_document_top_k_overlap(exports):
    """Documents: the ids the sparse export keeps vs DupMAE's top-k ids (positive entries only: both keep at most
    those; relu makes the rest 0). Measured on the tiny random model (seed 0), asserted with a margin: "hi" (one
    ordinary token beside [CLS] and [SEP]) overlaps least, 0.31; texts of 4+ words 0.75-0.91."""
    texts = TEXTS + QUERIES
    got = _sparse(exports["sparse"], texts, "document")
    want = _hybrid_parts(exports["hybrid"], texts, "document")["sparse_embedding"]
    assert ((got != 0).sum(dim=1) <= DOC_TOP_K).all()
    overlaps = []
    for g, w in zip(got, want, strict=True):
        kept, dupmae = set(g.nonzero().flatten().tolist()), set((w > 0).nonzero().flatten().tolist())
        overlaps.append(len(kept & dupmae) / max(1, len(dupmae)))
    print(f"\n[{exports['activation']}] top-{DOC_TOP_K} overlap per document: {[round(o, 3) for o in overlaps]}, "
          f"min {min(overlaps):.3f}")
    assert min(overlaps) >= 0.25
    assert min(o for o, text in zip(overlaps, texts, strict=True) if len(text.split()) >= 4) >= 0.6


def test_dense_plus_sparse_as_eq12(exports):
    """eq. 12 from the two plain folders (dense dot + lambda * sparse dot) vs the hybrid export's score. With
    ot_activation log1p_relu only the special tokens differ (bound asserted); with "none" the sparse values are
    log1p(relu(mu)), not mu, so only the dense term is comparable (asserted exact)."""
    hybrid, lam = exports["hybrid"], exports["hybrid"][1].sparse_weight
    want = hybrid.similarity(hybrid.encode_query(QUERIES, convert_to_tensor=True),
                             hybrid.encode_document(TEXTS, convert_to_tensor=True)).float()
    dense = exports["dense"].similarity(exports["dense"].encode_query(QUERIES, convert_to_tensor=True),
                                        exports["dense"].encode_document(TEXTS, convert_to_tensor=True)).float()
    sparse = _sparse(exports["sparse"], QUERIES, "query") @ _sparse(exports["sparse"], TEXTS, "document").T
    got = dense + lam * sparse
    hq, hd = _hybrid_parts(hybrid, QUERIES, "query"), _hybrid_parts(hybrid, TEXTS, "document")
    torch.testing.assert_close(dense, hq["dense_embedding"] @ hd["dense_embedding"].T, atol=1e-5, rtol=1e-5)
    want_sparse = want - dense
    relative = ((got - want).abs() / want.abs().clamp_min(1e-6)).max().item()
    print(f"\n[{exports['activation']}] eq. 12: max |score diff| {(got - want).abs().max().item():.4f}, relative "
          f"{relative:.2%}; sparse term hybrid {want_sparse.abs().max().item():.4f} vs export "
          f"{sparse.abs().max().item():.4f}")
    if exports["activation"] == "log1p_relu":
        assert relative <= 0.5


def test_sparse_format_refused_for_other_methods(tokenizer, tmp_path, capsys):
    checkpoint = _save_checkpoint(RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs())), tokenizer,
                                  tmp_path / "retromae", RUN_INFO)
    assert main(["export", str(checkpoint), str(tmp_path / "out"), "--format", "sparse"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--format sparse applies to DupMAE checkpoints" in err
    assert "leave out --format" in err and not (tmp_path / "out").exists()


def test_unknown_format_is_refused_by_argparse(tmp_path, capsys):
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--format", "colbert"]) == 2
    assert "argument --format: invalid choice: 'colbert' (choose from 'hybrid', 'dense', 'sparse')" in (
        capsys.readouterr().err)


def test_format_with_pooling_flags_is_refused(exports, tmp_path, capsys):
    checkpoint = exports["folders"]["hybrid"].parent / "checkpoint-500"
    assert main(["export", str(checkpoint), str(tmp_path / "o"), "--format", "dense", "--pooling", "mean"]) == 2
    assert "leave out --pooling and --similarity" in capsys.readouterr().err


@pytest.fixture(scope="module")
def family_checkpoints(request, tmp_path_factory) -> dict:
    """family -> (DupMAE on the tiny RoBERTa / XLM-R / ModernBERT base, its checkpoint folder)."""
    return _checkpoints(request, tmp_path_factory, "dupmae-formats", lambda base: (
        DupMAEForPretraining.from_encoder_checkpoint(base, dense_dim=16, doc_top_k=20)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_bases_export_both_parts(family_checkpoints, family, tmp_path):
    """The base's own *ForMaskedLM carries the head (ModernBERT's at the top level): the same exact identities as
    on BERT, dense part equal, sparse = log1p(relu(max(mu, special-token logits)))."""
    checkpoint = family_checkpoints[family][1]
    hybrid = SentenceTransformer(str(_export(checkpoint, tmp_path / "hybrid", "hybrid")), trust_remote_code=True)
    dense = SentenceTransformer(str(_export(checkpoint, tmp_path / "dense", "dense")))
    sparse = SparseEncoder(str(_export(checkpoint, tmp_path / "sparse", "sparse")))
    parts = _hybrid_parts(hybrid, TEXTS, "query")
    torch.testing.assert_close(dense.encode_query(TEXTS, convert_to_tensor=True).float(), parts["dense_embedding"],
                               atol=1e-6, rtol=0)
    special = torch.log1p(torch.relu(_special_token_max(sparse, TEXTS)))
    want = torch.maximum(torch.log1p(torch.relu(parts["ot_embedding"])), special)
    torch.testing.assert_close(_sparse(sparse, TEXTS, "query"), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("representation", ["cls", "ot"])
def test_single_part_representations(representation, tokenizer, tmp_path, capsys):
    """representation="cls": the dense export is the [CLS] state itself (no Dense), and there is no sparse part to
    export; "ot": no dense part. A missing part is refused in one line, leaving no folder."""
    dense_dim = 32 if representation == "cls" else 16
    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=dense_dim, representation=representation)
    checkpoint = _save_checkpoint(DupMAEForPretraining(config).eval(), tokenizer, tmp_path / "checkpoint-1", None)
    present, absent = ("dense", "sparse") if representation == "cls" else ("sparse", "dense")
    assert main(["export", str(checkpoint), str(tmp_path / absent), "--format", absent]) == 2
    assert f"representation='{representation}' has no {absent} part" in capsys.readouterr().err
    assert not (tmp_path / absent).exists()
    hybrid = SentenceTransformer(str(_export(checkpoint, tmp_path / "hybrid", "hybrid")), trust_remote_code=True)
    out = _export(checkpoint, tmp_path / present, present)
    if representation == "cls":
        model = SentenceTransformer(str(out))
        assert [type(m).__name__ for m in model] == ["Transformer", "Pooling"]
        torch.testing.assert_close(model.encode_document(TEXTS, convert_to_tensor=True).float(),
                                   _hybrid_parts(hybrid, TEXTS, "document")["dense_embedding"], atol=1e-6, rtol=0)
    else:
        assert SparseEncoder(str(out)).get_embedding_dimension() == config.vocab_size
