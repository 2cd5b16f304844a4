"""HybridIndex: exact eq. 12 search (flat), approximate dense candidates (hnsw / ivf), persistence, refusals."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEModel
from retromae.trainers.export.sentence_transformer import build_dupmae_sentence_transformer
from retromae.trainers.retrieval import hybrid_index, index_files
from retromae.trainers.retrieval.hybrid_index import HybridIndex, claim_index_folder, model_fingerprint

from ..builders import dead_pid, tiny_bert_kwargs

D, V, K = 16, 1000, 20  # dense_dim, vocab_size, doc_top_k of the random corpus
SCIFACT_MAX_SEQ_LENGTH = 16


def random_corpus(num_docs: int, num_queries: int = 7, seed: int = 0):
    """Random documents (dense + top-K sparse) and queries (dense + full mu), as a DupMAE encoder would give."""
    rng = np.random.default_rng(seed)
    doc_dense = rng.normal(size=(num_docs, D)).astype(np.float32)
    doc_mu = rng.normal(size=(num_docs, V)).astype(np.float32)
    doc_idx = np.argsort(-doc_mu, axis=1)[:, :K]  # top-K ids
    doc_val = np.take_along_axis(doc_mu, doc_idx, 1)
    q_dense = rng.normal(size=(num_queries, D)).astype(np.float32)
    q_mu = rng.normal(size=(num_queries, V)).astype(np.float32)
    return doc_dense, doc_idx, doc_val, q_dense, q_mu


def brute_force(doc_dense, doc_idx, doc_val, q_dense, q_mu) -> np.ndarray:
    """(Q, N) eq. 12 scores: h_q . h_d + sum over the document's top-k of mu_q[i] mu_d[i]."""
    doc_sparse = np.zeros((len(doc_dense), V), np.float64)
    np.put_along_axis(doc_sparse, doc_idx, doc_val, 1)
    return q_dense.astype(np.float64) @ doc_dense.T + q_mu.astype(np.float64) @ doc_sparse.T


def make_index(num_docs: int, index_type: str = "flat", **kwargs):
    doc_dense, doc_idx, doc_val, q_dense, q_mu = random_corpus(num_docs)
    index = HybridIndex(D, V, K, index_type=index_type, model_fingerprint="model-a", **kwargs)
    half = num_docs // 2  # two add() calls
    ids = [f"doc{i}" for i in range(num_docs)]
    index.add(ids[:half], doc_dense[:half], doc_idx[:half], doc_val[:half])
    index.add(ids[half:], doc_dense[half:], doc_idx[half:], doc_val[half:])
    return index, brute_force(doc_dense, doc_idx, doc_val, q_dense, q_mu), q_dense, q_mu


@pytest.mark.parametrize("score_block", [hybrid_index.SCORE_BLOCK, 7 * 37])  # one block / many document blocks
def test_flat_search_is_exact(monkeypatch, score_block):
    monkeypatch.setattr(hybrid_index, "SCORE_BLOCK", score_block)
    index, expected, q_dense, q_mu = make_index(500)
    scores, positions = index.search(q_dense, q_mu, top_n=10)
    order = np.argsort(-expected, axis=1)[:, :10]
    assert np.array_equal(positions, order)
    np.testing.assert_allclose(scores, np.take_along_axis(expected, order, 1), rtol=1e-5, atol=1e-4)
    # the same with the query OT part given as a scipy CSR matrix or a torch tensor
    for sparse_query in (sp.csr_matrix(q_mu), torch.from_numpy(q_mu)):
        _, positions_2 = index.search(torch.from_numpy(q_dense), sparse_query, top_n=10)
        assert np.array_equal(positions_2, order)


def test_top_n_larger_than_corpus_and_empty_queries():
    index, expected, q_dense, q_mu = make_index(6)
    scores, positions = index.search(q_dense, q_mu, top_n=50)
    assert positions.shape == (7, 6)
    assert np.array_equal(positions, np.argsort(-expected, axis=1))
    scores, positions = index.search(q_dense[:0], q_mu[:0], top_n=5)
    assert scores.shape == (0, 5)
    with pytest.raises(ValueError, match="top_n"):
        index.search(q_dense, q_mu, top_n=0)


@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_approximate_search_recall(index_type):
    index, expected, q_dense, q_mu = make_index(2000, index_type=index_type)
    scores, positions = index.search(q_dense, q_mu, top_n=10)
    truth = np.argsort(-expected, axis=1)[:, :10]
    recall = np.mean([len(set(p) & set(t)) / 10 for p, t in zip(positions, truth, strict=True)])
    print(f"{index_type} recall@10 = {recall:.3f}")  # reported, not exact
    assert recall >= 0.8
    # every returned score is the exact eq. 12 score of that document
    np.testing.assert_allclose(scores, np.take_along_axis(expected, positions, 1), rtol=1e-5, atol=1e-4)


def test_memory_per_document():
    assert HybridIndex(384, 30522, 384).memory_bytes_per_document() == 384 * 4 + 384 * 8 + 8
    assert HybridIndex(384, 30522, 260).memory_bytes_per_document() == 384 * 4 + 260 * 8 + 8
    assert HybridIndex(None, 30522, 768).memory_bytes_per_document() == 768 * 8 + 8  # "OT:768"
    assert HybridIndex(768, 30522, None).memory_bytes_per_document() == 768 * 4  # "CLS:768"
    assert HybridIndex(16, 100, 4, index_type="hnsw", hnsw_m=8).memory_bytes_per_document() == 64 + 64 + 32 + 8


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(doc_top_k=0), "doc_top_k"),
        (dict(doc_top_k=V + 1), "doc_top_k"),
        (dict(dense_dim=0), "dense_dim"),
        (dict(dense_dim=None, doc_top_k=None), "dense part"),
        (dict(index_type="pq"), "index_type"),
    ],
)
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HybridIndex(**{"dense_dim": D, "vocab_size": V, "doc_top_k": K, **kwargs})


def test_add_checks_shapes_and_ids():
    doc_dense, doc_idx, doc_val, *_ = random_corpus(4)
    index = HybridIndex(D, V, K)
    with pytest.raises(ValueError, match="dense"):
        index.add(["a", "b", "c", "d"], doc_dense[:3], doc_idx, doc_val)
    with pytest.raises(ValueError, match="unique"):
        index.add(["a", "a", "c", "d"], doc_dense, doc_idx, doc_val)
    with pytest.raises(ValueError, match="vocab_size"):
        index.add(["a", "b", "c", "d"], doc_dense, doc_idx + V, doc_val)


@pytest.mark.parametrize("index_type", ["flat", "hnsw", "ivf"])
def test_save_load_round_trip(tmp_path, index_type):
    index, _, q_dense, q_mu = make_index(300, index_type=index_type)
    expected = index.search(q_dense, q_mu, top_n=5)
    folder = index.save(tmp_path / "index")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["num_documents"] == 300 and manifest["doc_top_k"] == K and manifest["dense_dim"] == D
    assert manifest["model_fingerprint"] == "model-a" and manifest["index_type"] == index_type
    assert set(manifest["files"]) == {
        "dense.faiss",
        "sparse_indptr.npy",
        "sparse_indices.npy",
        "sparse_data.npy",
        "ids.json",
    }
    loaded = HybridIndex.load(folder)
    assert loaded.ids == index.ids
    got = loaded.search(q_dense, q_mu, top_n=5)
    assert np.array_equal(got[1], expected[1])
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    assert [p.name for p in tmp_path.iterdir()] == ["index"]  # no temporary folder left behind


def test_save_is_atomic_and_refuses_to_clobber(tmp_path):
    index, _, q_dense, q_mu = make_index(50)
    folder = index.save(tmp_path / "index")
    with pytest.raises(ValueError, match="overwrite"):
        index.save(folder)
    smaller, _, _, _ = make_index(20)
    smaller.save(folder, overwrite=True)
    assert len(HybridIndex.load(folder)) == 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_a_rebuild_killed_between_its_renames_gives_the_index_back(tmp_path):
    """HEAD: `search` found no index (it lay hidden in `.index.old-PID-…`), and `index` encoded the whole corpus
    before refusing the folder the swap restored."""
    index, _, _, _ = make_index(30)
    folder = index.save(tmp_path / "index")
    folder.rename(tmp_path / f".index.old-{dead_pid()}-0123abcd")
    assert len(HybridIndex.load(folder)) == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    folder.rename(tmp_path / f".index.old-{dead_pid()}-0123abcd")
    with pytest.raises(ValueError, match="already exists and is not empty"):  # before any encoding
        claim_index_folder(folder, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


@pytest.mark.parametrize("name", ["dense.faiss", "sparse_indices.npy", "ids.json"])
def test_missing_or_truncated_file_is_named(tmp_path, name):
    index, *_ = make_index(50)
    folder = index.save(tmp_path / "index")
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(ValueError, match=f"{name}.*truncated"):
        HybridIndex.load(folder)
    (folder / name).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(ValueError, match=f"{name}.*checksum"):
        HybridIndex.load(folder)
    (folder / name).unlink()
    with pytest.raises(FileNotFoundError, match=name):
        HybridIndex.load(folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        HybridIndex.load(folder)


def test_model_mismatch_is_refused():
    index, _, q_dense, q_mu = make_index(20)
    index.search(q_dense, q_mu, top_n=3, model_fingerprint="model-a")
    with pytest.raises(ValueError, match="rebuild"):
        index.search(q_dense, q_mu, top_n=3, model_fingerprint="model-b")


# ---- with a DupMAE sentence-transformers model ---------------------------------------------------------------------

DOCS = [
    "Dense retrievers encode text into vectors.",
    "Bananas are yellow and sweet.",
    "RetroMAE pre-trains encoders with a masked auto-encoder.",
    "Faiss searches vectors by inner product.",
    "The sparse part of DupMAE keeps the top tokens of the vocabulary.",
    "",  # an empty document has no ordinary token: mu = 0
]


def export_tiny(tokenizer, folder, seed: int):
    torch.manual_seed(seed)
    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8, special_token_ids=tokenizer.all_special_ids)
    model = build_dupmae_sentence_transformer(DupMAEModel(config).eval(), tokenizer, folder, max_seq_length=64)
    model[1].chunk_size = 256  # CPU-friendly chunks of the vocabulary projection
    return model


@pytest.fixture(scope="module")
def st_models(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return export_tiny(tokenizer, root / "a", seed=0), export_tiny(tokenizer, root / "b", seed=1)


def test_build_and_search_texts_equal_model_similarity(st_models, tmp_path):
    model, _ = st_models
    index = HybridIndex.build(model, DOCS, ids=[f"d{i}" for i in range(len(DOCS))], batch_size=4)
    queries = ["what encodes text into vectors?", "yellow fruit"]
    hits = index.search_texts(model, queries, top_n=3)
    scores = model.similarity(model.encode_query(queries), model.encode_document(DOCS))  # eq. 12 by dot product
    for row_hits, row_scores in zip(hits, scores, strict=True):
        order = torch.argsort(row_scores, descending=True)[:3]
        assert [doc_id for doc_id, _ in row_hits] == [f"d{int(i)}" for i in order]
        np.testing.assert_allclose([s for _, s in row_hits], row_scores[order].numpy(), rtol=1e-5, atol=1e-4)
    loaded = HybridIndex.load(index.save(tmp_path / "index"))
    assert loaded.search_texts(model, queries, top_n=3) == hits


def test_search_texts_refuses_other_model_and_empty_queries(st_models):
    model, other = st_models
    assert model_fingerprint(model) != model_fingerprint(other)
    index = HybridIndex.build(model, DOCS[:3])
    with pytest.raises(ValueError):
        index.search_texts(other, ["dense retrieval"])
    with pytest.raises(ValueError, match="empty"):
        index.search_texts(model, ["dense retrieval", "   "])
    with pytest.raises(TypeError):
        index.search_texts(model, "dense retrieval")
    assert index.search_texts(model, []) == []


def test_fingerprint_survives_save_and_remote_code_load(st_models, tmp_path):
    from retromae.trainers.export.dupmae import load_dupmae_sentence_transformer, save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "copy")
    reloaded = load_dupmae_sentence_transformer(tmp_path / "copy")
    assert type(reloaded[1]).__module__.startswith("transformers_modules.")
    assert model_fingerprint(reloaded) == model_fingerprint(model)


@pytest.mark.long
def test_scifact_corpus_search(shared_data, st_models, tmp_path):
    corpus_file = shared_data / "scifact" / "corpus.jsonl"
    if not corpus_file.is_file():
        pytest.skip(f"{corpus_file} not found")
    model, _ = st_models
    # The vocabulary projection costs documents x positions x |V| multiply-adds whatever the model size
    # (5,183 x 16 x 30,522 = 2.5G logits here, ~4-8 ns each on two shared AVX2 cores): 16 positions keep the whole
    # corpus under ~30 s. Longer texts only scale this cost linearly.
    model.max_seq_length = SCIFACT_MAX_SEQ_LENGTH
    rows = [json.loads(line) for line in corpus_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    # 400 characters hold far more than 16 tokens: the cut only spares the tokenizer whole abstracts
    texts = [f"{r.get('title', '')} {r['text']}".strip()[:400] for r in rows]
    start = time.perf_counter()
    index = HybridIndex.build(model, texts, ids=[r["_id"] for r in rows], batch_size=64)
    build_seconds = time.perf_counter() - start
    assert len(index) == len(rows) == 5183
    queries = [json.loads(line)["text"] for line in (shared_data / "scifact" / "queries.jsonl").open()][:5]
    hits = index.search_texts(model, queries, top_n=10)
    assert [len(h) for h in hits] == [10] * 5
    assert all(a[1] >= b[1] for h in hits for a, b in zip(h, h[1:], strict=False))
    loaded = HybridIndex.load(index.save(tmp_path / "scifact-index"))
    assert loaded.search_texts(model, queries, top_n=10) == hits
    print(f"SciFact: {len(index)} docs indexed in {build_seconds:.1f}s, {index.memory_bytes_per_document()} B/doc")
    model.max_seq_length = 64


@pytest.mark.parametrize("part", ["dense", "sparse"], ids=["cls-only", "ot-only"])
def test_single_part_indexes_are_exact(part, tmp_path):
    doc_dense, doc_idx, doc_val, q_dense, q_mu = random_corpus(200)
    if part == "dense":  # representation "cls": dense part only
        index = HybridIndex(D, V, None)
        index.add([str(i) for i in range(200)], doc_dense)
        expected, query = q_dense @ doc_dense.T, dict(query_dense=q_dense)
    else:  # representation "ot": sparse part only
        index = HybridIndex(None, V, K)
        index.add([str(i) for i in range(200)], sparse_indices=doc_idx, sparse_values=doc_val)
        expected = brute_force(np.zeros_like(doc_dense), doc_idx, doc_val, np.zeros_like(q_dense), q_mu)
        query = dict(query_sparse=q_mu)
    _, positions = HybridIndex.load(index.save(tmp_path / "index")).search(**query, top_n=5)
    assert np.array_equal(positions, np.argsort(-expected, axis=1)[:, :5])


def test_sparse_queries_with_query_top_k(st_models):
    model, _ = st_models
    index = HybridIndex.build(model, DOCS[:5])
    pooling = model[1]
    pooling.query_top_k = 6  # a query-side setting: the index stays valid
    try:
        queries = ["vectors and inner products", "yellow bananas"]
        hits = index.search_texts(model, queries, top_n=5)
        scores = model.similarity(model.encode_query(queries), model.encode_document(DOCS[:5]))
        for row_hits, row_scores in zip(hits, scores, strict=True):
            order = torch.argsort(row_scores, descending=True)
            assert [doc_id for doc_id, _ in row_hits] == [str(int(i)) for i in order]
    finally:
        pooling.query_top_k = None


# ---- command line: bad folders and repeated flags -------------------------------


def test_search_cli_without_a_manifest_is_a_one_line_error(tmp_path):
    """HEAD raised FileNotFoundError (a traceback from `retromae search`)."""
    from retromae.trainers.commands.index import search_command

    (tmp_path / "index").mkdir()
    with pytest.raises(ValueError, match=r"--index: .*manifest.json is missing"):
        search_command(["--index", str(tmp_path / "index"), "--model", str(tmp_path / "model"), "--query", "x"])


def test_index_cli_refuses_an_existing_folder_before_encoding(tmp_path, monkeypatch):
    """HEAD encoded the whole corpus, then failed with FileExistsError."""
    from retromae.trainers.commands.index import index_command

    out = tmp_path / "index"
    out.mkdir()
    (out / index_files.MANIFEST).write_text("{}")  # an earlier index
    monkeypatch.setattr(HybridIndex, "build", classmethod(lambda *a, **k: pytest.fail("encoded before refusing")))
    with pytest.raises(ValueError, match=r"--output-dir .*index already exists and is not empty.*--overwrite"):
        index_command(["--model", str(tmp_path / "model"), "--corpus", str(tmp_path / "corpus.jsonl"),
                       "--output-dir", str(out)])
    assert (out / index_files.MANIFEST).read_text() == "{}"


def test_search_cli_answers_every_repeated_query(st_models, tmp_path):
    """`search --query a --query b`: HEAD answered b alone. A repeated single-value flag is refused."""
    from retromae.trainers.commands.index import search_command
    from retromae.trainers.export.dupmae import save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "model")
    HybridIndex.build(model, DOCS[:4], ids=[f"d{i}" for i in range(4)]).save(tmp_path / "index")
    common = ["--index", str(tmp_path / "index"), "--model", str(tmp_path / "model"), "--top-n", "2"]
    assert search_command([*common, "--query", "dense vectors", "--query", "yellow fruit", "fish",
                           "--output", str(tmp_path / "hits.jsonl")]) == 0
    records = [json.loads(line) for line in (tmp_path / "hits.jsonl").read_text().splitlines()]
    assert [r["query"] for r in records] == ["dense vectors", "yellow fruit", "fish"]
    with pytest.raises(ValueError, match="--top-n is given 2 times"):
        search_command([*common, "--query", "x", "--top-n", "3"])


def test_index_warns_when_truncation_drops_most_of_the_corpus(st_models, tmp_path, caplog):
    """A one-passage-per-line .txt with one stray empty line reads as two blocks (`--text-format auto`), of which the
    model encodes only the first 64 tokens. HEAD: an INFO line, and "indexed 2 documents"."""
    from retromae.trainers.commands.index import index_command
    from retromae.trainers.export.dupmae import save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "model")
    lines = [f"passage number {i} about dense and sparse retrieval" for i in range(400)]
    (tmp_path / "corpus.txt").write_text("\n".join([*lines[:200], "", *lines[200:]]) + "\n")
    assert index_command(["--model", str(tmp_path / "model"), "--corpus", str(tmp_path / "corpus.txt"),
                          "--output-dir", str(tmp_path / "index")]) == 0
    (record,) = [r for r in caplog.records if "truncation" in r.getMessage()]
    assert record.levelno == logging.WARNING and "the index encodes only the start of each" in record.getMessage()
    (told,) = [r.getMessage() for r in caplog.records if "--text-format lines" in r.getMessage()]  # by the reader
    assert told.startswith(f"{tmp_path / 'corpus.txt'}: ") and "line 201 is empty" in told, told


def test_index_and_search_refuse_a_model_that_is_not_hybrid_naming_the_fix(tiny_bert, st_models, tmp_path,
                                                                          monkeypatch):
    """A plain encoder, a pre-training run folder and a dense sentence-transformers model each get one line that
    names the fix, before the corpus is read (HEAD read it, then raised "SentenceTransformer has no DupMAEPooling
    module" naming a Python function)."""
    import shutil

    from retromae.trainers.commands import index as index_module
    from retromae.trainers.commands.index import index_command, search_command
    from retromae.trainers.export.sentence_transformer import load_as_sentence_transformer

    monkeypatch.setattr(index_module, "_documents", lambda corpus: pytest.fail("read the corpus before refusing"))
    dense, _ = load_as_sentence_transformer(tiny_bert)
    dense.save(str(tmp_path / "dense"))
    run = tmp_path / "run"
    shutil.copytree(tiny_bert, run)
    shutil.copytree(tmp_path / "dense", run / "encoder")
    cases = {
        tiny_bert: rf"--model {tiny_bert} is not a sentence-transformers folder .*export it first: retromae export",
        run: rf"--model {run} is not a sentence-transformers folder .*pass its exported encoder, {run / 'encoder'}",
        tmp_path / "dense": r"is not a DupMAE hybrid model .*retromae evaluate --search faiss",
    }
    for model, message in cases.items():
        with pytest.raises(ValueError, match=message):
            index_command(["--model", str(model), "--corpus", "c.jsonl", "--output-dir", str(tmp_path / "index")])
    HybridIndex.build(st_models[0], DOCS[:4], ids=[f"d{i}" for i in range(4)]).save(tmp_path / "index")
    with pytest.raises(ValueError, match="retromae search is for the export of a dupmae pre-training"):
        search_command(["--index", str(tmp_path / "index"), "--model", str(tmp_path / "dense"), "--query", "x"])


# ---- command line: inputs and outputs (probe of 2026-11-27) -------------------------------


def test_index_overwrite_refuses_an_output_that_holds_its_inputs(tmp_path, monkeypatch):
    """HEAD's `index --overwrite` deleted a corpus inside the output folder, or the model folder itself, and
    exited 0."""
    from retromae.trainers.commands.index import index_command

    monkeypatch.setattr(HybridIndex, "build", classmethod(lambda *a, **k: pytest.fail("encoded before refusing")))
    out = tmp_path / "out"
    out.mkdir()
    corpus = out / "my_corpus.txt"
    corpus.write_text("one passage\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "modules.json").write_text("[]")
    for argv, what in (([str(model), str(corpus), str(out)], "--corpus"), ([str(model), str(corpus), str(model)],
                                                                            "--model")):
        with pytest.raises(ValueError, match=f"replacing it would delete {what} "):
            index_command(["--model", argv[0], "--corpus", argv[1], "--output-dir", argv[2], "--overwrite"])
    assert corpus.read_text() == "one passage\n" and (model / "modules.json").is_file()


def test_search_output_is_refused_before_the_search_when_it_would_lose_a_file(tmp_path, monkeypatch):
    """HEAD replaced the --queries file or any existing file with the results, and failed with a traceback after
    the whole search for a folder."""
    from retromae.trainers.commands.index import search_command

    monkeypatch.setattr(HybridIndex, "load", classmethod(lambda *a, **k: pytest.fail("searched before refusing")))
    queries = tmp_path / "queries.txt"
    queries.write_text("fruit\n")
    earlier = tmp_path / "results.jsonl"
    earlier.write_text("mine\n")
    (tmp_path / "folder").mkdir()
    common = ["--index", str(tmp_path / "index"), "--model", str(tmp_path / "model"), "--queries", str(queries)]
    cases = {queries: r"writing it would change --queries ", earlier: r"already exists; choose another --output, or pass --overwrite",
             tmp_path / "folder": "is a folder; give a file path"}
    for output, message in cases.items():
        with pytest.raises(ValueError, match=message):
            search_command([*common, "--output", str(output)])
    with pytest.raises(ValueError, match="would change --queries"):
        search_command([*common, "--output", str(queries), "--overwrite"])
    assert queries.read_text() == "fruit\n" and earlier.read_text() == "mine\n"
    for folder, flag in [("index", "--index"), ("model", "--model")]:  # HEAD replaced the file, exit 0
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "ids.json").write_text("[]")
        with pytest.raises(ValueError, match=rf"writing it would change {flag} "):
            search_command([*common, "--output", str(tmp_path / folder / "ids.json"), "--overwrite"])
        assert (tmp_path / folder / "ids.json").read_text() == "[]"


def test_index_overwrite_replaces_an_index_only(tmp_path, monkeypatch):
    """HEAD's `index --overwrite` deleted any folder, the user's files in it too."""
    from retromae.trainers.commands.index import index_command

    monkeypatch.setattr(HybridIndex, "build", classmethod(lambda *a, **k: pytest.fail("encoded before refusing")))
    mine = tmp_path / "mydocs"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    for flags in ([], ["--overwrite"]):
        with pytest.raises(ValueError, match=r"holds files but no hybrid index \(no manifest.json\), which --overwrite does not replace"):
            index_command(["--model", "m", "--corpus", "c.jsonl", "--output-dir", str(mine), *flags])
    assert (mine / "notes.txt").read_text() == "mine"


def test_a_damaged_model_folder_or_manifest_is_one_line(st_models, tmp_path):
    """HEAD: tracebacks (TypeError, SafetensorError, ModuleNotFoundError) from deep inside the loaders."""
    import shutil

    from retromae.trainers.commands.index import _load_hybrid_model
    from retromae.trainers.export.dupmae import save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "model")
    for damage, message in [("1_DupMAEPooling/config.json", "ValueError"), ("st_dupmae.py", "ModuleNotFoundError")]:
        damaged = Path(shutil.copytree(tmp_path / "model", tmp_path / f"damaged-{damage.replace('/', '-')}"))
        (damaged / damage).unlink()
        with pytest.raises(ValueError, match=rf"--model .*damaged.* does not load \({message}: .*export it again"):
            _load_hybrid_model(str(damaged), "index")
    folder = HybridIndex.build(model, DOCS[:4], ids=[f"d{i}" for i in range(4)]).save(tmp_path / "index")
    manifest = json.loads((folder / index_files.MANIFEST).read_text())
    for field, value in [("dense_dim", "16"), ("index_params", {"foo": 1})]:
        (folder / index_files.MANIFEST).write_text(json.dumps({**manifest, field: value}))
        with pytest.raises(ValueError, match="manifest.json: .*the index folder is corrupted: rebuild it"):
            HybridIndex.load(folder)


def test_corpus_ids_are_kept_whichever_line_holds_the_first_id(tmp_path):
    """HEAD looked for `_id` on the first line only: a leading blank line, or a first record without `_id`, gave
    every document a passage number instead, silently."""
    from retromae.trainers.commands.index import _documents
    from retromae.trainers.retrieval.beir import RetrievalDataError

    leading_blank = tmp_path / "corpus.JSONL"
    leading_blank.write_text('\n{"_id": "doc-A", "text": "apples"}\n{"_id": "doc-B", "text": "pears"}\n')
    assert _documents(str(leading_blank)) == (["doc-A", "doc-B"], ["apples", "pears"])
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"text": "apples"}\n{"_id": "doc-B", "text": "pears"}\n')
    with pytest.raises(RetrievalDataError, match=r"mixed.jsonl:1: field '_id'"):
        _documents(str(mixed))
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"text": "apples"}\n{"text": "pears"}\n')
    assert _documents(str(plain)) == (["1", "2"], ["apples", "pears"])


def test_blank_beir_documents_keep_their_ids_and_are_named(tmp_path, caplog):
    """HEAD indexed them as empty texts without a word."""
    from retromae.trainers.commands.index import _documents

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "text": "apples"}\n{"_id": "b", "title": " ", "text": ""}\n'
                      '{"_id": "c", "text": "pears"}\n')
    with caplog.at_level(logging.WARNING):
        assert _documents(str(corpus)) == (["a", "b", "c"], ["apples", "", "pears"])
    assert "corpus.jsonl: 1 document(s) without title or text are indexed as empty texts (ids: b)" in caplog.text


def test_a_corpus_without_ids_is_numbered_by_line_so_blank_passages_shift_no_id(tmp_path):
    """HEAD numbered the passages it kept: a blank record, or the blank line that makes a .txt file a file of
    blocks, shifted every later id, and the results named the wrong documents (exit 0)."""
    from retromae.trainers.commands.index import _documents

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text('{"text": "zero apples"}\n{"text": ""}\n{"text": "two river tigers"}\n')
    assert _documents(str(jsonl)) == (["1", "3"], ["zero apples", "two river tigers"])
    lines = tmp_path / "lines.txt"
    lines.write_text("apples\n   \npears\n")
    assert _documents(str(lines)) == (["1", "3"], ["apples", "pears"])
    blocks = tmp_path / "blocks.txt"
    blocks.write_text("line zero apples\nline one dogs\n\nline three river\nline four tigers\n")
    assert _documents(str(blocks)) == (["1", "4"], ["line zero apples line one dogs",
                                                    "line three river line four tigers"])
    assert _documents(str(blocks), "lines")[0] == ["1", "2", "4", "5"]  # index --text-format lines
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"text": " "}\n')
    with pytest.raises(ValueError, match="every passage is blank"):
        _documents(str(blank))


def test_queries_files_are_read_with_their_place_named(tmp_path):
    """HEAD: a non-UTF-8 .txt gave a UnicodeDecodeError traceback, `queries.JSONL` was searched line by line as
    raw JSON, a blank BEIR query was "query 1 is empty" and a folder "not found"."""
    from retromae.trainers.commands.index import SearchArguments, _queries

    def read(path):
        return _queries(SearchArguments(index="i", model="m", queries=str(path)))

    latin = tmp_path / "q.txt"
    latin.write_bytes("caf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"q.txt:1: bytes that are not valid UTF-8"):
        read(latin)
    upper = tmp_path / "queries.JSONL"
    upper.write_text('{"_id": "q1", "text": "fruit"}\n')
    assert read(upper) == [("q1", "fruit")]
    blank = tmp_path / "blank.jsonl"
    blank.write_text('{"_id": "q1", "text": "fruit"}\n{"_id": "q7", "text": "  "}\n')
    with pytest.raises(ValueError, match=r"blank.jsonl: query 'q7' has no text"):
        read(blank)
    with pytest.raises(ValueError, match="is a folder; give a file"):
        read(tmp_path)
    for name, text in [("queries.json", '[{"_id": "q1", "text": "fruit"}]\n'), ("queries.tsv", "q1\tfruit\n")]:
        (tmp_path / name).write_text(text)  # HEAD searched each line as a query text, exit 0
        with pytest.raises(ValueError, match=rf"--queries .*{name}: give a BEIR queries.jsonl or a .txt file"):
            read(tmp_path / name)


OURS = {"format": index_files.FORMAT, "format_version": index_files.FORMAT_VERSION}


@pytest.mark.parametrize(("manifest", "message"), [
    ([1, 2], "is not a JSON object"),
    (OURS, "lacks model_fingerprint, dense_dim"),
    ({**OURS, **dict.fromkeys(index_files.MANIFEST_KEYS, 0), "files": {"ids.json": {}}},
     "lacks the sizes and checksums of files"),
])
def test_a_manifest_of_another_shape_is_one_line(tmp_path, manifest, message):
    """HEAD: KeyError / AttributeError tracebacks for valid JSON that is not a whole manifest."""
    index, *_ = make_index(20)
    folder = index.save(tmp_path / "index")
    (folder / index_files.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=f"manifest.json {message}.*rebuild it"):
        HybridIndex.load(folder)
