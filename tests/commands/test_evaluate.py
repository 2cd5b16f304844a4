"""`retromae evaluate`: mteb on local BEIR folders, summary files, faiss, hybrid models, bad input, and the pinned
equality with mteb itself (all-MiniLM-L6-v2 on SciFact dev)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from mteb.abstasks.retrieval import AbsTaskRetrieval
from retromae.trainers.commands.evaluate import evaluate_command
from retromae.trainers.export.sentence_transformer import (
    build_dupmae_sentence_transformer,
    load_as_sentence_transformer,
)
from retromae.trainers.retrieval.beir import RetrievalDataError, read_beir, read_qrels
from retromae.trainers.retrieval.benchmarks import UnknownTaskError, find_tasks, load_registered
from retromae.trainers.retrieval.mteb import (
    evaluate,
    evaluate_folder,
    make_local_task,
    update_model_card,
)
from retromae.trainers.training.finetuning import save_finetuned_model
from sentence_transformers import SentenceTransformer

from .. import builders
from ..builders import save_headless_bert, tiny_bert_kwargs

# ---- helpers -------------------------------------------------------------------------------------------------------


def write_beir(folder, **kwargs):
    """The toy BEIR folder with a second positive (doc i+12) for every third query."""
    return builders.write_beir(folder, second_positives=True, **kwargs)


def hand_ndcg_at_10(query_emb, doc_emb, query_ids, doc_ids, qrels):
    """NDCG@10 by hand (binary gains, log2 discount), exact search by `query_emb @ doc_emb.T`."""
    scores = np.asarray(query_emb, dtype=np.float64) @ np.asarray(doc_emb, dtype=np.float64).T
    total = 0.0
    for row, qid in zip(scores, query_ids, strict=True):
        order = sorted(range(len(doc_ids)), key=lambda j: (-row[j], doc_ids[j]))[:10]
        relevant = qrels[qid]
        dcg = sum(1.0 / math.log2(rank + 2) for rank, j in enumerate(order) if relevant.get(doc_ids[j], 0) > 0)
        ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(10, len(relevant))))
        total += dcg / ideal
    return total / len(query_ids)


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("data") / "toy")


# ---- local tasks and summaries -------------------------------------------------------------------------------------


def test_local_beir_evaluation_writes_mteb_json_and_summary(spread_cls_bert, tiny_beir, tmp_path):
    out = tmp_path / "eval"
    rows = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=out, model_name="local/tiny")
    (row,) = rows
    assert row["task"] == "LocalBEIR-toy" and row["split"] == "dev" and row["queries"] == 6
    for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "recall_at_1000"):
        assert 0.0 <= row[key] <= 1.0
    (task_json,) = (out / "mteb").rglob("LocalBEIR-toy.json")
    mteb_scores = json.loads(task_json.read_text())["scores"]["dev"][0]
    assert mteb_scores["ndcg_at_10"] == row["ndcg_at_10"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"][0]["ndcg_at_10"] == row["ndcg_at_10"]
    markdown = (out / "summary.md").read_text()
    assert "| NDCG@10 | MRR@10 | Recall@100 | Recall@1000 |" in markdown and f"{row['ndcg_at_10']:.5f}" in markdown


def test_evaluation_prints_none_of_mteb_chatter(spread_cls_bert, tiny_beir, tmp_path, capfd):
    """mteb's FutureWarning about a renamed sentence-transformers method and its map progress bars are silenced;
    the progress-bar switch is left as it was."""
    import datasets

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval")
    assert not [w for w in caught if "get_sentence_embedding_dimension" in str(w.message)]
    assert "Standardizing" not in capfd.readouterr().err
    assert datasets.is_progress_bar_enabled()


def test_cls_dot_scores_match_a_hand_computation(spread_cls_bert, tiny_beir, tmp_path):
    """The CLS + dot path (not cosine): mteb's NDCG@10 equals exact search + NDCG computed by hand."""
    rows = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path)
    data = read_beir(tiny_beir, split="dev")
    model, _ = load_as_sentence_transformer(spread_cls_bert)
    assert model.similarity_fn_name == "dot"
    doc_ids, query_ids = list(data.corpus), list(data.queries)
    doc_emb = model.encode_document([data.doc_text(d) for d in doc_ids])
    query_emb = model.encode_query([data.queries[q] for q in query_ids])
    expected = hand_ndcg_at_10(query_emb, doc_emb, query_ids, doc_ids, data.qrels)
    assert rows[0]["ndcg_at_10"] == pytest.approx(expected, abs=1e-5)


def test_faiss_search_equals_exact_search(spread_cls_bert, tiny_beir, tmp_path):
    exact = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "a")
    faiss = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "b",
                            search="faiss")
    for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100"):
        assert faiss[0][key] == pytest.approx(exact[0][key], abs=1e-5)


def test_hybrid_model_scores_queries_and_documents_differently(tokenizer, tiny_beir, tmp_path):
    """DupMAE hybrid: mteb uses encode_query (full OT vector) vs encode_document (top-k), dot = eq. 12."""
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining

    torch.manual_seed(0)
    model = build_dupmae_sentence_transformer(
        DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(initializer_range=0.5), dense_dim=16, doc_top_k=8)), tokenizer,
        tmp_path / "dup", max_seq_length=32,
    )
    rows = evaluate_folder(tmp_path / "dup", beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval")
    data = read_beir(tiny_beir, split="dev")
    doc_ids, query_ids = list(data.corpus), list(data.queries)
    doc_emb = model.encode_document([data.doc_text(d) for d in doc_ids])
    query_emb = model.encode_query([data.queries[q] for q in query_ids])
    assert (doc_emb[:, 16:] != 0).sum(axis=1).max() <= 8  # documents: top-k of the OT vector
    assert (query_emb[:, 16:] != 0).sum(axis=1).min() > 8  # queries: the full OT vector
    expected = hand_ndcg_at_10(query_emb, doc_emb, query_ids, doc_ids, data.qrels)
    assert rows[0]["ndcg_at_10"] == pytest.approx(expected, abs=1e-5)


def test_a_pretraining_checkpoint_is_exported_then_evaluated(spread_cls_bert, tiny_beir, tokenizer, tmp_path):
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    RetroMAEForPretraining.from_encoder_checkpoint(str(spread_cls_bert)).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    rows = evaluate_folder(tmp_path / "ckpt", beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval")
    direct = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval2")
    assert rows[0]["ndcg_at_10"] == direct[0]["ndcg_at_10"]  # same encoder weights, CLS + dot both ways


def test_a_checkpoint_is_exported_into_a_temporary_folder(spread_cls_bert, tiny_beir, tokenizer, tmp_path,
                                                          monkeypatch):
    """HEAD exported it to OUTPUT/pretrained-encoder with overwrite, deleting a user's folder of that name."""
    import tempfile

    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    RetroMAEForPretraining.from_encoder_checkpoint(str(spread_cls_bert)).save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    mine = tmp_path / "eval" / "pretrained-encoder"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    rows = evaluate_folder(tmp_path / "ckpt", beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == [
        "mteb", "pretrained-encoder", "summary.json", "summary.md"]
    assert not any((tmp_path / "tmp").iterdir())  # the export is gone
    assert 0.0 < rows[0]["ndcg_at_10"] <= 1.0


def test_update_card_puts_results_into_model_index(spread_cls_bert, tiny_beir, tmp_path):
    from huggingface_hub import ModelCard

    model, _ = load_as_sentence_transformer(spread_cls_bert)
    folder = save_finetuned_model(model, tmp_path / "model", {"model_name": "tiny-ft", "stages": []})
    rows = evaluate_folder(folder, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval",
                           dataset_ids=["my-org/toy"], update_card=True)
    card = ModelCard.load(folder / "README.md")
    results = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert results["ndcg_at_10"] == pytest.approx(rows[0]["ndcg_at_10"])
    assert {"mrr_at_10", "recall_at_100", "recall_at_1000"} <= set(results)
    assert card.data.eval_results[0].dataset_type == "my-org/toy" and card.data.eval_results[0].dataset_split == "dev"
    assert "my-org/toy" in card.data.datasets
    assert "| toy (local BEIR) | dev | 6 |" in card.text
    assert str(tmp_path) not in (folder / "README.md").read_text()


def test_update_card_refuses_foreign_folders(spread_cls_bert, tiny_beir, tmp_path):
    with pytest.raises(ValueError, match="retromae finetune"):
        update_model_card(spread_cls_bert, [])


# ---- bad input -----------------------------------------------------------------------------------------------------


def test_beir_folder_missing_a_file_is_named(tmp_path):
    folder = write_beir(tmp_path / "toy")
    (folder / "queries.jsonl").unlink()
    with pytest.raises(RetrievalDataError, match=r"missing queries\.jsonl"):
        read_beir(folder, split="dev")
    with pytest.raises(RetrievalDataError, match=r"missing qrels/test\.tsv.*splits present: dev, train"):
        read_beir(write_beir(tmp_path / "toy2"), split="test")


def test_qrels_with_unknown_ids_error_or_skip_with_counts(tmp_path):
    folder = write_beir(tmp_path / "toy", extra_qrels=["q12\tnope-1\t1", "q12\tnope-2\t1", "q99\td1\t1"])
    with pytest.raises(RetrievalDataError, match=r"1 query id\(s\) missing.*2 document id\(s\) missing") as info:
        read_beir(folder, split="dev")
    assert "--on-missing skip" in str(info.value)
    data = read_beir(folder, split="dev", on_missing="skip")
    assert data.report == {"qrels_lines_with_unknown_query": 1, "qrels_lines_with_unknown_document": 2}
    assert set(data.qrels["q12"]) == {"d12", "d24"}
    with pytest.raises(ValueError, match="missing from corpus.jsonl"):
        evaluate_folder("unused", beir_folders=[folder], split="dev", output_dir=tmp_path / "e")


def test_queries_without_positives_are_dropped_and_counted(tmp_path):
    folder = write_beir(tmp_path / "toy", extra_qrels=["q1\td3\t0"])  # q1 judged, nothing relevant
    data = read_beir(folder, split="dev")
    assert "q1" not in data.queries and data.report["queries_without_positives"] == 1
    assert "queries without positives: 1" in data.summary()


def test_registered_task_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"cannot load the data of MTEB task SciFact.*--beir-folder"):
        load_registered(find_tasks(["SciFact"]))
    with pytest.raises(ValueError, match="unknown MTEB task"):
        find_tasks(["NoSuchTaskAnywhere"])


def test_every_task_and_benchmark_name_is_checked_before_any_download(spread_cls_bert, tmp_path, monkeypatch):
    """HEAD downloaded SciFact's data before it reported the typo in `--tasks SciFact,NoSuchTask` (offline: SciFact's
    Hub error instead of the typo), and checked `--benchmark` only after the `--tasks` downloads."""
    def no_download(task, *args, **kwargs):
        raise AssertionError(f"{task.metadata.name} loaded before every name was checked")

    monkeypatch.setattr(AbsTaskRetrieval, "load_data", no_download)
    with pytest.raises(UnknownTaskError, match="unknown MTEB task 'NoSuchTask'"):
        evaluate_folder(spread_cls_bert, tasks=["SciFact", "NoSuchTask"], output_dir=tmp_path / "eval")
    with pytest.raises(ValueError, match="unknown MTEB benchmark 'NoSuchBench'"):
        evaluate_folder(spread_cls_bert, tasks=["SciFact"], benchmark="NoSuchBench", output_dir=tmp_path / "eval")
    with pytest.raises(ValueError, match="cannot load the data of MTEB task SciFact .*SciFact loaded before"):
        evaluate_folder(spread_cls_bert, tasks=["SciFact"], output_dir=tmp_path / "eval")  # the names known: loaded
    assert not (tmp_path / "eval").exists()


def test_cli_needs_something_to_evaluate(spread_cls_bert, tmp_path):
    with pytest.raises(ValueError, match="nothing to evaluate"):
        evaluate_command([str(spread_cls_bert), "--output-dir", str(tmp_path)])


def test_cli_writes_summary(spread_cls_bert, tiny_beir, tmp_path, capsys):
    assert evaluate_command([str(spread_cls_bert), "--beir-folder", str(tiny_beir), "--split", "dev",
                             "--output-dir", str(tmp_path / "out")]) == 0
    assert "| toy (local BEIR) | dev | 6 |" in capsys.readouterr().out
    assert (tmp_path / "out" / "summary.md").is_file()


def test_python_api_takes_folders_and_task_names(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    rows = evaluate(spread_cls_bert, tiny_beir, tmp_path / "out", split="dev")
    assert [(r["dataset_name"], r["split"], r["queries"]) for r in rows] == [("toy (local BEIR)", "dev", 6)]
    assert rows == evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "b")
    assert (tmp_path / "out" / "summary.json").is_file()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a name that is not a folder is a registered task
    with pytest.raises(ValueError, match="cannot load the data of MTEB task SciFact"):
        evaluate(spread_cls_bert, [tiny_beir, "SciFact"], tmp_path / "c", split="dev")


def test_local_task_holds_the_split(tiny_beir):
    task = make_local_task(read_beir(tiny_beir, split="dev"), dataset_id="my-org/toy")
    task.load_data()
    split = task.dataset["default"]["dev"]
    assert len(split["queries"]) == 6 and len(split["corpus"]) == 30
    assert task.metadata.dataset["path"] == "my-org/toy" and task.metadata.main_score == "ndcg_at_10"


# ---- the pinned equality with mteb (real model, real data) ----------------------------------------------------------


def _fingerprint(model: SentenceTransformer) -> str:
    """Everything that decides an embedding: the modules and their configs, the similarity and all weights."""
    digest = hashlib.sha256()
    for module in model:
        digest.update(type(module).__name__.encode())
        config = module.get_config_dict() if hasattr(module, "get_config_dict") else {}
        digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    digest.update(f"{model.similarity_fn_name}|{model.max_seq_length}".encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def encode_once():
    """Memoise `encode_query` / `encode_document` for this module: SciFact's 5,183 documents are encoded once
    (~2-6 min on 2 CPU cores), not once per evaluation. The key is the model fingerprint (modules, pooling config,
    similarity, weights), the method, the prompt and the exact texts, so a call with anything different (another
    pooling, another text format) is computed afresh, and the equality below stays a real check."""
    cache, calls = {}, {"computed": 0, "reused": 0}
    originals = {name: getattr(SentenceTransformer, name) for name in ("encode_query", "encode_document")}

    def wrap(name):
        original = originals[name]

        def memoised(self, sentences, *args, prompt=None, **kwargs):
            effective_prompt = prompt if prompt is not None else self.prompts.get(name.removeprefix("encode_"), "")
            texts = hashlib.sha256("\x00".join(sentences).encode()).hexdigest()
            key = (_fingerprint(self), name, effective_prompt or "", texts)
            if key not in cache:
                calls["computed"] += 1
                cache[key] = np.asarray(original(self, sentences, *args, prompt=prompt, **kwargs))
            else:
                calls["reused"] += 1
            return cache[key].copy()

        return memoised

    with pytest.MonkeyPatch.context() as patch:
        for name in originals:
            patch.setattr(SentenceTransformer, name, wrap(name))
        yield calls


SUBSET_DISTRACTORS = 800


def _scifact_dev_subset(source, target):
    """SciFact dev in BEIR layout with every dev positive plus the first SUBSET_DISTRACTORS other documents: the
    same 200 queries at a fifth of the corpus, so the three-way equality below runs in a minute on 2 CPU cores."""
    with open(source / "qrels" / "dev.tsv", encoding="utf-8") as f:
        positives = {row[1] for row in list(csv.reader(f, delimiter="\t"))[1:]}
    with open(source / "corpus.jsonl", encoding="utf-8") as f:
        lines = f.read().splitlines()
    kept = [line for line in lines if json.loads(line)["_id"] in positives]
    kept += [line for line in lines if json.loads(line)["_id"] not in positives][:SUBSET_DISTRACTORS]
    (target / "qrels").mkdir(parents=True)
    (target / "corpus.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    (target / "queries.jsonl").write_bytes((source / "queries.jsonl").read_bytes())
    (target / "qrels" / "dev.tsv").write_bytes((source / "qrels" / "dev.tsv").read_bytes())
    return target


def _read_scifact_dev_directly(folder):
    """SciFact dev read with nothing but json/csv (independent of retromae's reader)."""
    with open(folder / "corpus.jsonl", encoding="utf-8") as f:
        corpus = [json.loads(line) for line in f]
    with open(folder / "queries.jsonl", encoding="utf-8") as f:
        queries = {q["_id"]: q["text"] for q in map(json.loads, f)}
    qrels = {}
    with open(folder / "qrels" / "dev.tsv", encoding="utf-8") as f:
        for row in list(csv.reader(f, delimiter="\t"))[1:]:
            qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return corpus, {q: queries[q] for q in qrels}, qrels


@pytest.mark.long
def test_minilm_scifact_dev_equals_mteb(minilm_dir, shared_data, tmp_path, encode_once):
    """all-MiniLM-L6-v2 as shipped (mean pooling + Normalize, cosine) on SciFact dev (all 200 queries, a 1/5 corpus):
    `retromae evaluate` == `mteb.evaluate(SentenceTransformer(minilm), <local SciFact dev task>)` == NDCG@10 by hand.
    (On the full corpus this check gave 0.61088 three times; benchmarks/scifact_experiment.py reports that model.)"""
    import mteb
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata

    folder = _scifact_dev_subset(shared_data / "scifact", tmp_path / "scifact-dev-subset")
    ours = evaluate_folder(minilm_dir, beir_folders=[folder], split="dev", output_dir=tmp_path / "ours",
                           batch_size=64)[0]

    corpus, queries, qrels = _read_scifact_dev_directly(folder)

    class SciFactDev(AbsTaskRetrieval):
        metadata = TaskMetadata(
            name="SciFactDevDirect", description="SciFact dev, built in the test", reference=None,
            dataset={"path": "local/scifact", "revision": "1"}, type="Retrieval", category="t2t",
            modalities=["text"], eval_splits=["dev"], eval_langs=["eng-Latn"], main_score="ndcg_at_10")

        def load_data(self, num_proc=None, **kwargs):
            self.dataset = {"default": {"dev": RetrievalSplitData(
                corpus=Dataset.from_list([{"id": d["_id"], "title": d["title"], "text": d["text"]} for d in corpus]),
                queries=Dataset.from_list([{"id": q, "text": t} for q, t in queries.items()]),
                relevant_docs=qrels, top_ranked=None)}}
            self.data_loaded = True

    minilm = SentenceTransformer(str(minilm_dir), device="cpu")
    assert [type(m).__name__ for m in minilm] == ["Transformer", "Pooling", "Normalize"]
    result = mteb.evaluate(minilm, SciFactDev(), cache=None, show_progress_bar=False)
    direct = result.task_results[0].scores["dev"][0]

    # independent: exact cosine search over the whole corpus + NDCG@10 by hand (no mteb, no pytrec_eval)
    doc_ids = [d["_id"] for d in corpus]
    doc_emb = minilm.encode_document([(d["title"] + " " + d["text"]).strip() for d in corpus], batch_size=64)
    query_ids = list(queries)
    query_emb = minilm.encode_query([queries[q] for q in query_ids], batch_size=64)
    by_hand = hand_ndcg_at_10(query_emb, doc_emb, query_ids, doc_ids, qrels)

    print(f"\nSciFact dev NDCG@10: retromae evaluate {ours['ndcg_at_10']:.5f}, mteb.evaluate {direct['ndcg_at_10']:.5f}, "
          f"by hand {by_hand:.5f}; encodings computed {encode_once['computed']}, reused {encode_once['reused']}")
    assert ours["queries"] == len(queries) == 200
    assert ours["ndcg_at_10"] == direct["ndcg_at_10"]
    for key in ("mrr_at_10", "recall_at_100", "recall_at_1000"):
        assert ours[key] == round(direct[key], 5)  # rows round to 5 decimals, as mteb rounds all but MRR
    assert direct["ndcg_at_10"] == pytest.approx(by_hand, abs=1e-5)
    assert len(corpus) < 1200
    assert 0.55 < ours["ndcg_at_10"] < 0.95  # a sane value for this model on SciFact dev with a smaller corpus


# ---- progress bar, repeated --beir-folder, incomplete folders ------------------------------


def test_cli_shows_progress_and_evaluates_every_repeated_beir_folder(spread_cls_bert, tiny_beir, tmp_path, capsys):
    """HEAD showed no progress bar by default, and `--beir-folder A --beir-folder B` evaluated B alone."""
    import shutil

    second = tmp_path / "toy2"
    shutil.copytree(tiny_beir, second)
    assert evaluate_command([str(spread_cls_bert), "--beir-folder", str(tiny_beir), "--beir-folder", str(second),
                             "--split", "dev", "--output-dir", str(tmp_path / "eval")]) == 0
    rows = json.loads((tmp_path / "eval" / "summary.json").read_text())["results"]
    assert sorted(row["dataset_name"] for row in rows) == ["toy (local BEIR)", "toy2 (local BEIR)"]
    err = capsys.readouterr().err
    assert "it/s" in err or "s/it" in err  # tqdm's encoding bars


def test_model_folder_killed_mid_save_is_refused_before_reading_data(spread_cls_bert, tmp_path):
    import shutil

    broken = tmp_path / "checkpoint-9"
    shutil.copytree(spread_cls_bert, broken)
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"evaluate --model: model folder .*checkpoint-9 is incomplete"):
        evaluate_folder(broken, beir_folders=[tmp_path / "not-read-yet"], output_dir=tmp_path / "eval")


def test_a_bad_config_and_a_tokenizer_larger_than_the_vocabulary_get_one_line(spread_cls_bert, tiny_beir, tmp_path,
                                                                               tokenizer, capsys):
    """HEAD: an OSError traceback from transformers, and an IndexError from inside torch's embedding."""
    import shutil

    from retromae.trainers.cli import main

    bad_json = Path(shutil.copytree(spread_cls_bert, tmp_path / "bad-json"))
    (bad_json / "config.json").write_text("{bad")
    small = save_headless_bert(tmp_path / "small-vocab", tokenizer, vocab_size=1000)
    for model, message in [(bad_json, r"evaluate --model: .*bad-json/config.json is not valid JSON \(Expecting property"
                                      r" name .*line 1 column 2.*\); fix or restore the file"),
                           (small, r"small-vocab: its tokenizer has 30522 tokens but the model has 1000 word "
                                   r"embeddings \(vocab_size in config.json\)")]:
        assert main(["evaluate", str(model), "--beir-folder", str(tiny_beir), "--split", "dev",
                     "--output-dir", str(tmp_path / "eval"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.search(message, err), err



@pytest.mark.parametrize("damage, message", [
    ("missing 1_DupMAEPooling/config.json",
     r"cannot load the sentence-transformers folder .*dup \(ValueError: .*dup/1_DupMAEPooling/config.json is missing or "
     r"lacks hidden_size, vocab_size .*\); a module's files are missing or damaged: export the model again"),
    ("bad 1_DupMAEPooling/config.json", r"evaluate --model: .*dup/1_DupMAEPooling/config.json is not valid JSON "
                                        r"\(Expecting value.*\); restore the file, or export the model again"),
    ("truncated 1_DupMAEPooling/model.safetensors", r"evaluate --model: weights file .*dup/1_DupMAEPooling/"
                                                    r"model.safetensors is incomplete: it has 300 bytes"),
    ("missing st_dupmae.py", r"cannot load the sentence-transformers folder .*dup \(ModuleNotFoundError: No module "
                             r"named 'st_dupmae'\); a module's files are missing or damaged: export the model again"),
])
def test_a_damaged_dupmae_export_gets_one_line(tokenizer, tiny_beir, tmp_path, capsys, damage, message):
    """HEAD: a TypeError or SafetensorError traceback from inside sentence-transformers' module loader."""
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining
    from retromae.trainers.cli import main

    folder = tmp_path / "dup"
    build_dupmae_sentence_transformer(DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16)),
                                      tokenizer, folder, max_seq_length=32)
    kind, name = damage.split(" ")
    if kind == "missing":
        (folder / name).unlink()
    elif kind == "bad":
        (folder / name).write_text('{"hidden_size":\n')
    else:
        (folder / name).write_bytes((folder / name).read_bytes()[:300])
    assert main(["evaluate", str(folder), "--beir-folder", str(tiny_beir), "--split", "dev",
                 "--output-dir", str(tmp_path / "eval"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err
    with pytest.raises(ValueError, match=message.replace("evaluate --model", "--model")):  # finetune's loader
        load_as_sentence_transformer(folder)

# ---- same-named BEIR folders, output folder, --update-card, paths in the Python API -----------------------------


def test_beir_folders_with_one_name_get_a_row_and_a_result_file_each(spread_cls_bert, tmp_path):
    """HEAD named both tasks LocalBEIR-beir: two identical-looking rows with one query count, one result file."""
    first = write_beir(tmp_path / "a" / "beir")
    second = builders.write_beir(tmp_path / "b" / "beir", splits=(("dev", range(12, 15)),))
    rows = evaluate_folder(spread_cls_bert, beir_folders=[first, second], split="dev", output_dir=tmp_path / "eval")
    assert [(r["dataset_name"], r["queries"]) for r in rows] == [("a/beir (local BEIR)", 6), ("b/beir (local BEIR)", 3)]
    assert len({r["task"] for r in rows}) == 2 and len(list((tmp_path / "eval" / "mteb").rglob("LocalBEIR-*"))) == 2
    (alone,) = evaluate_folder(spread_cls_bert, beir_folders=[second], split="dev", output_dir=tmp_path / "alone")
    assert rows[1]["ndcg_at_10"] == alone["ndcg_at_10"]
    with pytest.raises(ValueError, match=r"--beir-folder names .*beir twice"):
        evaluate_folder(spread_cls_bert, beir_folders=[first, tmp_path / "a" / ".." / "a" / "beir"], split="dev",
                        output_dir=tmp_path / "e")


def test_output_dir_that_is_a_file_is_refused_before_loading(tmp_path):
    """HEAD: a FileExistsError traceback after the model and data were loaded."""

    (tmp_path / "out.txt").write_text("notes")
    with pytest.raises(ValueError, match=r"--output-dir .*out\.txt is a file, not a folder"):
        evaluate_command(["unused", "--beir-folder", str(tmp_path / "not-read"), "--output-dir",
                          str(tmp_path / "out.txt")])


def test_default_output_dir_is_the_model_folder_name(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """As the README says; HEAD used the fine-tune's --model-name, so copies seed42 and seed43 shared one folder."""
    import shutil

    from retromae.trainers.retrieval.mteb import default_output_dir

    model, _ = load_as_sentence_transformer(spread_cls_bert)
    seed42 = save_finetuned_model(model, tmp_path / "seed42", {"model_name": "my-org/fancy", "stages": []})
    shutil.copytree(seed42, tmp_path / "seed43")
    monkeypatch.chdir(tmp_path)
    assert evaluate_command(["seed43", "--beir-folder", str(tiny_beir), "--split", "dev", "--no-progress"]) == 0
    assert (tmp_path / "eval-results" / "seed43" / "summary.json").is_file()
    assert default_output_dir(seed42).as_posix() == "eval-results/seed42"
    assert default_output_dir("my-org/fancy").as_posix() == "eval-results/fancy"  # a Hub id: its last part


def test_another_models_results_are_kept_unless_overwrite(spread_cls_bert, tiny_beir, tmp_path, monkeypatch):
    """Every `retromae pretrain` export is named `encoder`: the second run's default folder is the first's. HEAD
    replaced the first model's summary without a word."""
    import shutil

    for run in ("run1", "run2"):
        shutil.copytree(spread_cls_bert, tmp_path / run / "encoder")
    monkeypatch.chdir(tmp_path)
    flags = ["--beir-folder", str(tiny_beir), "--split", "dev", "--no-progress"]
    summary = tmp_path / "eval-results" / "encoder" / "summary.json"
    assert evaluate_command(["run1/encoder", *flags]) == 0
    first = summary.read_text()
    assert json.loads(first)["model_path"] == str((tmp_path / "run1" / "encoder").resolve())
    assert evaluate_command(["run1/encoder", *flags]) == 0  # the same model again: replaced
    with pytest.raises(ValueError, match=r"eval-results/encoder holds the results of .*run1/encoder \(summary"
                       r"\.json\); choose another --output-dir, or pass --overwrite"):
        evaluate_command(["run2/encoder", *flags])
    assert summary.read_text() == first
    assert evaluate_command(["run2/encoder", *flags, "--output-dir", "eval-results/run2"]) == 0
    assert evaluate_command(["run2/encoder", *flags, "--overwrite"]) == 0
    assert json.loads(summary.read_text())["model_path"].endswith("run2/encoder")


def test_update_card_on_a_foreign_folder_is_refused_before_evaluating(spread_cls_bert, tiny_beir, tmp_path):
    """HEAD refused it after the whole evaluation had run and written its results."""
    with pytest.raises(ValueError, match="--update-card needs a folder written by `retromae finetune`"):
        evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval",
                        update_card=True)
    assert not (tmp_path / "eval").exists()


def test_python_api_names_a_missing_beir_folder(spread_cls_bert, tmp_path, monkeypatch):
    """HEAD took a path that does not exist for an MTEB task name: `unknown MTEB task '/...'`; a plain name that is
    neither says both (HEAD: an unknown task only)."""
    import retromae

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"'beri' is no folder in {tmp_path} and unknown MTEB task 'beri'"):
        retromae.evaluate(spread_cls_bert, "beri", tmp_path / "eval", split="dev")

    with pytest.raises(ValueError, match=r"BEIR folder .*no-such-beir does not exist"):
        retromae.evaluate(spread_cls_bert, str(tmp_path / "no-such-beir"), tmp_path / "eval", split="dev")
    (tmp_path / "corpus.txt").write_text("a file\n")
    with pytest.raises(ValueError, match=r"BEIR folder .*corpus.txt is a file, not a folder"):
        retromae.evaluate(spread_cls_bert, str(tmp_path / "corpus.txt"), tmp_path / "eval", split="dev")


@pytest.mark.parametrize(("arguments", "message"), [
    ({"batch_size": 0}, "batch_size=0; give a whole number >= 1"),
    ({"bogus_opt": 1}, "unknown option bogus_opt; the options are output_dir, split, batch_size, search, "
                       "update_card, pooling"),
    ({"bach_size": 8}, "unknown option bach_size; did you mean batch_size\\? the options"),  # HEAD: not listed
])
def test_python_api_refuses_bad_arguments_before_loading(tmp_path, arguments, message):
    """HEAD: batch_size 0 failed inside torch's DataLoader after the model and data were loaded; an unknown option
    was a TypeError naming evaluate_folder."""
    import retromae

    with pytest.raises(ValueError, match=message):
        retromae.evaluate(tmp_path / "no-model", str(tmp_path / "beir"), tmp_path / "eval", **arguments)


def test_a_fractional_relevance_is_refused_naming_the_line(tmp_path):
    """HEAD read a qrels score of 0.5 as int 0 (not relevant) and dropped those documents without a word."""
    folder = write_beir(tmp_path / "beir", extra_qrels=["q12\td5\t0.5"])
    with pytest.raises(RetrievalDataError, match=r"dev.tsv:10: relevance '0.5' is not a whole number"):
        read_beir(folder, split="dev")
    assert read_qrels(builders.write_lines(tmp_path / "t.tsv", ["q\td\t0.5"]), value_type=float) == {"q": {"d": 0.5}}


@pytest.mark.parametrize("score", ["99999999999999999999", "2147483647", "1000001", "-2147483649", "1e12"])
def test_a_relevance_out_of_range_is_refused_naming_the_line(tmp_path, score):
    """HEAD took 99999999999999999999 as a whole number: pytrec_eval then failed with a bare `SystemError` (it
    scored 4294967296 as not relevant, and held 17 GB for a grade of 2147483647)."""
    qrels = builders.write_lines(tmp_path / "q.tsv", ["q\td\t1", f"q\te\t{score}"])
    with pytest.raises(RetrievalDataError, match=re.escape(f"q.tsv:2: relevance '{score}' is out of range; qrels "
                                                           "grade relevance in integers from -2147483648 to "
                                                           "1000000")):
        read_qrels(qrels)
    builders.write_lines(qrels, ["q\td\t1000000", "q\te\t-2147483648"])
    assert read_qrels(qrels) == {"q": {"d": 1000000, "e": -2147483648}}
    assert read_qrels(builders.write_lines(tmp_path / "t.tsv", [f"q\td\t{score}"]), value_type=float)  # a score


def test_qrels_errors_name_the_path_given(tmp_path):
    """HEAD named `beir_unknown/qrels/dev.tsv` (the folder's name, not the path given) and a bare `dev.tsv`."""
    import re

    folder = write_beir(tmp_path / "data" / "beir_unknown", extra_qrels=["q99\td1\t1"])
    qrels = folder / "qrels" / "dev.tsv"
    with pytest.raises(RetrievalDataError, match=re.escape(f"{qrels} names 1 query id(s) missing")):
        read_beir(folder, split="dev")
    qrels.write_text("query-id\tcorpus-id\tscore\n")
    with pytest.raises(RetrievalDataError, match=re.escape(f"{qrels} holds no (query-id, corpus-id, score) line")):
        read_beir(folder, split="dev")


@pytest.mark.parametrize("inside", ["", "results"])
def test_results_are_not_written_into_the_model_folder(spread_cls_bert, tiny_beir, tmp_path, inside):
    """HEAD wrote summary.json (the model's absolute path) and mteb/ into the model folder, which publish uploads."""
    model = tmp_path / "model"
    shutil.copytree(spread_cls_bert, model)
    before = sorted(p.name for p in model.iterdir())
    with pytest.raises(ValueError, match=r"--output-dir .*: writing into it would change the --model folder "
                                         r"\(.*model\); choose a folder outside it"):
        evaluate_folder(model, beir_folders=[tiny_beir], split="dev", output_dir=model / inside)
    assert sorted(p.name for p in model.iterdir()) == before
