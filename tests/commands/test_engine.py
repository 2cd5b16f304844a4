"""`retromae index --engine qdrant`: the Qdrant engine answers DupMAE's eq. 12 as our exact HybridIndex does."""

from __future__ import annotations

import json

import numpy as np
import pytest
from retromae.trainers.inputs.errors import UserError
from retromae.trainers.retrieval import engine_qdrant, index_files
from retromae.trainers.retrieval.engine_qdrant import QdrantHybridIndex, load_index
from retromae.trainers.retrieval.hybrid_index import HybridIndex

from .test_hybrid_index import DOCS, D, K, V, random_corpus, st_models  # noqa: F401  (st_models: a fixture)

needs_qdrant = pytest.mark.skipif(not engine_qdrant.qdrant_available(),
                                  reason='qdrant-client is not installed (pip install "retromae[qdrant]")')


def qdrant_and_exact(num_docs: int, tmp_path, **kwargs) -> tuple[QdrantHybridIndex, HybridIndex, tuple]:
    """The same random corpus in both engines (the Qdrant one in an index folder, reopened)."""
    doc_dense, doc_idx, doc_val, q_dense, q_mu = random_corpus(num_docs)
    ids = [f"doc{i}" for i in range(num_docs)]
    exact = HybridIndex(D, V, K)
    exact.add(ids, doc_dense, doc_idx, doc_val)
    client = engine_qdrant.QdrantClient(path=str(tmp_path / "storage"))
    index = QdrantHybridIndex(client, D, V, K, **kwargs)
    index.create_collection()
    half = num_docs // 2  # two add() calls
    index.add(ids[:half], doc_dense[:half], doc_idx[:half], doc_val[:half])
    index.add(ids[half:], doc_dense[half:], doc_idx[half:], doc_val[half:])
    return index, exact, (q_dense, q_mu)


@needs_qdrant
def test_top10_and_scores_equal_the_exact_index(tmp_path):
    index, exact, queries = qdrant_and_exact(500, tmp_path)
    try:
        scores, positions = index.search(*queries, top_n=10)
    finally:
        index.close()
    expected_scores, expected_positions = exact.search(*queries, top_n=10)
    assert np.array_equal(positions, expected_positions)
    np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=1e-4)


@needs_qdrant
def test_few_candidates_still_score_exactly(tmp_path):
    """With 20 candidates per part the ranking may miss a document, but every returned score is eq. 12's."""
    index, exact, (q_dense, q_mu) = qdrant_and_exact(300, tmp_path, candidates=20)
    try:
        scores, positions = index.search(q_dense, q_mu, top_n=10)
    finally:
        index.close()
    all_scores, all_positions = exact.search(q_dense, q_mu, top_n=300)
    for q in range(len(q_dense)):
        truth = dict(zip(all_positions[q].tolist(), all_scores[q].tolist(), strict=True))
        np.testing.assert_allclose(scores[q], [truth[p] for p in positions[q]], rtol=0, atol=1e-4)


@needs_qdrant
def test_model_build_and_search_texts_equal_hybrid_index(st_models, tmp_path):  # noqa: F811
    model, other = st_models
    ids = [f"d{i}" for i in range(len(DOCS))]
    exact = HybridIndex.build(model, DOCS, ids=ids, batch_size=4)
    folder = QdrantHybridIndex.build_folder(model, DOCS, ids, tmp_path / "index", batch_size=4)
    manifest = json.loads((folder / index_files.MANIFEST).read_text())
    assert manifest["engine"] == "qdrant" and manifest["num_documents"] == len(DOCS)
    queries = ["what encodes text into vectors?", "yellow fruit", "sparse vocabulary"]
    index = load_index(folder)
    try:
        assert isinstance(index, QdrantHybridIndex)
        hits = index.search_texts(model, queries, top_n=10)
        with pytest.raises(ValueError, match="built with model"):
            index.search_texts(other, queries)
    finally:
        index.close()
    expected = exact.search_texts(model, queries, top_n=10)
    assert [[d for d, _ in row] for row in hits] == [[d for d, _ in row] for row in expected]
    np.testing.assert_allclose([[s for _, s in row] for row in hits], [[s for _, s in row] for row in expected],
                               rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="built with engine 'qdrant'"):
        HybridIndex.load(folder)


@needs_qdrant
def test_cli_index_and_search_round_trip(st_models, tmp_path):  # noqa: F811
    from retromae.trainers.commands.index import index_command, search_command
    from retromae.trainers.export.dupmae import save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "model")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(DOCS) if t))
    outputs = {}
    for engine in ("faiss", "qdrant"):
        folder = tmp_path / f"index-{engine}"
        assert index_command(["--model", str(tmp_path / "model"), "--corpus", str(corpus), "--output-dir",
                              str(folder), "--engine", engine, "--batch-size", "4"]) == 0
        for run in ("first", "second"):  # the embedded storage's lock is given back after a search
            out = tmp_path / f"hits-{engine}-{run}.jsonl"
            assert search_command(["--index", str(folder), "--model", str(tmp_path / "model"), "--top-n", "5",
                                   "--query", "dense vectors", "yellow fruit", "--output", str(out)]) == 0
        outputs[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [[r["id"] for r in q["results"]] for q in outputs["qdrant"]] == \
        [[r["id"] for r in q["results"]] for q in outputs["faiss"]]
    for mine, ours in zip(outputs["qdrant"], outputs["faiss"], strict=True):
        np.testing.assert_allclose([r["score"] for r in mine["results"]], [r["score"] for r in ours["results"]],
                                   atol=2e-4)
    with pytest.raises(ValueError, match="already exists"):  # the owned-output policy, as for the default engine
        index_command(["--model", str(tmp_path / "model"), "--corpus", str(corpus), "--output-dir",
                       str(tmp_path / "index-qdrant"), "--engine", "qdrant"])


def test_search_prints_every_result_asked_for_and_checks_its_queries_first(st_models, tmp_path, capsys,  # noqa: F811
                                                                           monkeypatch):
    """Without --output the terminal is the result: each query's --top-n hits (HEAD: 5 at most, of 20 queries, without
    a word). A bad query is refused before the index and the model load."""
    from retromae.trainers.commands import index as index_module
    from retromae.trainers.export.dupmae import save_dupmae_sentence_transformer

    model, _ = st_models
    save_dupmae_sentence_transformer(model, tmp_path / "model")
    corpus = tmp_path / "corpus.jsonl"
    texts = [t for t in DOCS if t] + ["Apples are red.", "Queries meet documents.", "Indexes hold vectors."]
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    folder = tmp_path / "index"
    assert index_module.index_command(["--model", str(tmp_path / "model"), "--corpus", str(corpus), "--output-dir",
                                       str(folder), "--batch-size", "4"]) == 0
    capsys.readouterr()
    top_n = 7
    assert index_module.search_command(["--index", str(folder), "--model", str(tmp_path / "model"), "--top-n",
                                        str(top_n), "--query", "dense vectors"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].count(" (") == top_n, printed
    monkeypatch.setattr(index_module, "load_index", lambda *a: pytest.fail("loaded the index before the queries"))
    with pytest.raises(UserError, match="--queries .* not found"):
        index_module.search_command(["--index", str(folder), "--model", str(tmp_path / "model"), "--queries",
                                     str(tmp_path / "missing.jsonl")])


@needs_qdrant
def test_a_folder_whose_vectors_live_on_another_client(tmp_path):
    """`client=`: a server's collection (here an in-memory client) with the manifest and ids in the folder."""
    doc_dense, doc_idx, doc_val, q_dense, q_mu = random_corpus(50)
    server = engine_qdrant.QdrantClient(":memory:")
    index = QdrantHybridIndex(server, D, V, K)
    index.create_collection()
    assert not index.defer_local_syncs()  # nothing to defer in memory
    index.add([f"d{i}" for i in range(50)], doc_dense, doc_idx, doc_val)
    index.write_manifest(tmp_path, storage="server")
    with pytest.raises(ValueError, match="on a Qdrant server; pass client="):
        QdrantHybridIndex.load(tmp_path)
    reopened = QdrantHybridIndex.load(tmp_path, client=server)
    assert reopened.ids == index.ids
    np.testing.assert_array_equal(reopened.search(q_dense, q_mu)[1], index.search(q_dense, q_mu)[1])


def test_missing_qdrant_client_is_one_line(monkeypatch, tmp_path):
    from retromae.trainers.commands.index import index_command, search_command

    monkeypatch.setattr(engine_qdrant, "QdrantClient", None)
    monkeypatch.setattr("retromae.trainers.commands.index.qdrant_available", lambda: False)
    with pytest.raises(ValueError, match=r'--engine qdrant needs qdrant-client: pip install "retromae\[qdrant\]"'):
        index_command(["--model", "m", "--corpus", "c.jsonl", "--output-dir", str(tmp_path / "i"), "--engine",
                       "qdrant"])
    with pytest.raises(ImportError, match=r"retromae\[qdrant\]"):
        QdrantHybridIndex(None, D, V, K)
    (tmp_path / "index").mkdir()  # a qdrant index folder, searched without qdrant-client
    (tmp_path / "index" / index_files.MANIFEST).write_text(json.dumps({"engine": "qdrant"}))
    with pytest.raises(ValueError, match=r'^--index: the qdrant engine needs qdrant-client: pip install "retromae'):
        search_command(["--index", str(tmp_path / "index"), "--model", "m", "--query", "x"])


def test_manifest_engine_defaults_to_ours(tmp_path):
    doc_dense, doc_idx, doc_val, _, _ = random_corpus(5)
    index = HybridIndex(D, V, K)
    index.add([str(i) for i in range(5)], doc_dense, doc_idx, doc_val)
    folder = index.save(tmp_path / "index")
    assert index_files.index_engine(folder) == "faiss"
    assert isinstance(load_index(folder), HybridIndex)
    assert index_files.index_engine(tmp_path / "nothing") == "faiss"  # then the loader names what is missing
