"""Retrieval validation during pre-training (`training/retrieval_validation.py`, `retromae pretrain
--eval-beir-folder`): the metrics against hand-computed values, exact chunked search, the logged metrics and plot of
a tiny run, bit-identical training with and without it, bad folders refused before training, a failing evaluation
that does not stop the run."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from retromae.trainers.cli import main
from retromae.trainers.retrieval.metrics import RunningTopK, retrieval_metrics
from retromae.trainers.training import retrieval_validation as validation
from retromae.trainers.training.retrieval_validation import load_validation_set
from safetensors.torch import load_file

from ..builders import pretrain_args, write_beir

EVAL_KEYS = {"eval_ndcg@10", "eval_mrr@10", "eval_recall@100"}


@pytest.fixture(scope="module")
def beir_folder(tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("beir") / "toy", second_positives=True)


def test_metrics_match_hand_computed_values():
    ranked = [[3, 1, 2], [5, 6, 7], [9]]
    qrels = [{1: 1, 2: 2}, {8: 1}, {9: 1, 4: 0}]  # query 3: relevance 0 does not count
    # query 1: DCG 1/log2(3) + 2/log2(4) = 1.6309; ideal 2/log2(2) + 1/log2(3) = 2.6309; first hit at rank 2
    ndcg_1 = (1 / math.log2(3) + 2 / math.log2(4)) / (2 + 1 / math.log2(3))
    metrics = retrieval_metrics(ranked, qrels)
    assert metrics["ndcg@10"] == pytest.approx((ndcg_1 + 0 + 1) / 3)
    assert metrics["mrr@10"] == pytest.approx((1 / 2 + 0 + 1) / 3)
    assert metrics["recall@100"] == pytest.approx((1 + 0 + 1) / 3)
    assert retrieval_metrics([list(range(20))], [{12: 1}])["mrr@10"] == 0.0, "only the top 10 count for MRR@10"


def test_chunked_search_equals_full_search():
    torch.manual_seed(0)
    queries, docs = torch.randn(7, 16), torch.randn(250, 16)
    full = (queries @ docs.T).topk(100, dim=1).indices
    top = RunningTopK(7, depth=100)
    for start in range(0, 250, 33):
        top.add(queries @ docs[start : start + 33].T, start)
    assert top.ranking() == full.tolist()
    few = RunningTopK(7, depth=100)
    few.add(queries @ docs[:5].T, 0)
    assert [len(r) for r in few.ranking()] == [5] * 7, "depth capped by the corpus size"


def test_tied_scores_are_ranked_as_pytrec_eval_and_mteb_rank_them():
    """Documents with equal scores rank by document id, last id first, as pytrec_eval (mteb's Recall@100, NDCG@10)
    and mteb's own MRR@10 order them; HEAD kept whichever ties torch.topk returned, so a tie across rank 100 gave
    another Recall@100 than `retromae evaluate`. The validation set's document index is the rank of the id in
    sorted order, so the last id is the highest index."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    # 154 documents: 0-2 ahead of a 4-way tie (3-6), 80 distinct ones (7-86), then 67 tied (87-153) at ranks 88-154,
    # across the cut-off of Recall@100: the 13 kept are 153 down to 141
    scores = torch.cat([torch.tensor([9.0, 8.5, 8.0]), torch.full((4,), 7.0), torch.linspace(6.0, 2.0, 80),
                        torch.full((67,), 1.0)])
    scores = scores[None, :].expand(2, -1).clone()
    scores[1, 6] = 6.99  # query 2: documents 3-5 tied, 6 just below them
    qrels = [{4: 1, 100: 1, 150: 1}, {3: 1, 140: 2}]
    top = RunningTopK(2, depth=100)
    for start in range(0, scores.shape[1], 32):
        top.add(scores[:, start : start + 32], start)
    ranked = top.ranking()
    assert ranked[0][3:7] == [6, 5, 4, 3] and ranked[0][87:100] == list(range(153, 140, -1))
    assert ranked[1][3:7] == [5, 4, 3, 6]
    doc_ids = [f"d{i:03d}" for i in range(scores.shape[1])]  # sorted order = index order, as load_validation_set's
    run = {f"q{q}": {doc_ids[d]: float(scores[q, d]) for d in range(scores.shape[1])} for q in range(2)}
    judged = {f"q{q}": {doc_ids[d]: rel for d, rel in qrel.items()} for q, qrel in enumerate(qrels)}
    per_query = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    metrics = retrieval_metrics(ranked, qrels)
    # query 1: 4 and 150 in the top 100 (100 is not), query 2: 3 (140 is not): (2/3 + 1/2) / 2
    assert metrics["recall@100"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert metrics["recall@100"] == pytest.approx(sum(q["recall_100"] for q in per_query.values()) / 2)
    assert metrics["ndcg@10"] == pytest.approx(sum(q["ndcg_cut_10"] for q in per_query.values()) / 2)
    assert metrics["mrr@10"] == pytest.approx((1 / 6 + 1 / 6) / 2)  # doc 4 at rank 6, doc 3 at rank 6


def test_validation_set_caps_queries_by_sorted_id(beir_folder):
    data = load_validation_set(beir_folder, "dev", max_queries=4)
    assert data.query_ids == sorted(f"q{i}" for i in range(12, 18))[:4]
    assert data.doc_ids == sorted(data.doc_ids) and len(data.doc_ids) == 30
    assert data.qrels[data.query_ids.index("q12")] == {data.doc_ids.index("d12"): 1, data.doc_ids.index("d24"): 1}


def test_pretrain_logs_validation_and_leaves_training_untouched(tiny_bert, corpus, beir_folder, tmp_path, capsys):
    plain, validated = tmp_path / "plain", tmp_path / "validated"
    assert main(pretrain_args(tiny_bert, corpus, plain, "--no-export", "true")) == 0
    assert main(pretrain_args(tiny_bert, corpus, validated, "--no-export", "true", "--eval-beir-folder",
                              str(beir_folder), "--eval-steps", "3", "--eval-max-queries", "5",
                              "--eval-coverage", "true", "--eval-on-start", "true")) == 0
    summary = capsys.readouterr().out
    state = json.loads((validated / "checkpoint-4" / "trainer_state.json").read_text())
    evaluated = [entry for entry in state["log_history"] if entry.keys() >= EVAL_KEYS]
    assert [entry["step"] for entry in evaluated] == [0, 3, 4], "the start, every --eval-steps and the last step"
    assert all("eval_coverage@10" in entry for entry in evaluated)
    assert all("loss" in entry and "encoder_mlm_loss" in entry for entry in evaluated[1:]), "beside the loss terms"
    assert all(0 <= entry[key] <= 1 for entry in evaluated for key in EVAL_KEYS)
    assert f"retrieval validation (step 4): ndcg@10 {evaluated[-1]['eval_ndcg@10']:.4f}" in summary
    assert (validated / "validation.png").stat().st_size > 0
    # resuming the plain run with validation (the options may change on resume) continues it exactly
    resumed = tmp_path / "resumed"
    assert main(pretrain_args(tiny_bert, corpus, resumed, "--no-export", "true", "--resume-from-checkpoint",
                              str(plain / "checkpoint-2"), "--eval-beir-folder", str(beir_folder))) == 0
    for run, name in [(validated, "model.safetensors"), (validated, "checkpoint-2/model.safetensors"),
                      (validated, "checkpoint-2/collator_rng_0.safetensors"), (resumed, "model.safetensors")]:
        expected, got = load_file(str(plain / name)), load_file(str(run / name))
        assert all(torch.equal(expected[k], got[k]) for k in expected), f"{run.name}/{name} differs"


def test_dupmae_scores_its_hybrid_and_its_cls_part(tokenizer, tmp_path):
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining, DupMAEModel

    from ..builders import SENTENCES, tiny_bert_kwargs

    config = DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8, query_top_k=12,
                          special_token_ids=tokenizer.all_special_ids)
    torch.manual_seed(0)
    DupMAEForPretraining(config).save_pretrained(tmp_path / "dupmae")
    model = DupMAEForPretraining.from_pretrained(tmp_path / "dupmae").train()
    encoder = DupMAEModel.from_pretrained(tmp_path / "dupmae").eval()
    batch = dict(tokenizer(SENTENCES[:3], padding=True, return_tensors="pt"))
    with validation.evaluation_mode(model), torch.no_grad():
        output = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        for task in ("query", "document"):
            vectors = validation.sentence_vectors(model, batch, task)
            assert set(vectors) == {"", "cls_"}
            torch.testing.assert_close(vectors[""], encoder.hybrid_embedding(output, task))  # what the export encodes
            torch.testing.assert_close(vectors["cls_"], output.pooler_output)
    assert model.training, "the model's own mode is restored"


def test_failed_evaluation_warns_and_training_continues(tiny_bert, corpus, beir_folder, tmp_path, monkeypatch,
                                                        caplog, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(validation, "evaluate_retrieval", broken)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="retromae.trainers.training.retrieval_validation"):
        assert main(pretrain_args(tiny_bert, corpus, out, "--no-export", "true", "--max-steps", "2",
                                  "--eval-beir-folder", str(beir_folder))) == 0
    assert "retrieval validation on toy (dev) failed at step 1 (RuntimeError: out of memory)" in caplog.text
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and not any("eval_ndcg@10" in entry for entry in state["log_history"])
    capsys.readouterr()
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "best", "--no-export", "true", "--max-steps", "2",
                              "--eval-beir-folder", str(beir_folder), *BEST)) == 0
    # HEAD's summary said nothing of the best checkpoint when no evaluation succeeded
    assert "best checkpoint: none (no evaluation at a saved step succeeded); the final save is the last step's" in \
        capsys.readouterr().out


@pytest.mark.parametrize(("damage", "expected"), [
    ("qrels/dev.tsv", "BEIR folder <folder> is missing qrels/dev.tsv (a BEIR folder holds corpus.jsonl, queries.jsonl and "
                      "qrels/<split>.tsv); qrels splits present: train"),
    ("qrels", "BEIR folder <folder> is missing qrels/dev.tsv"),
    ("corpus.jsonl", "BEIR folder <folder> is missing corpus.jsonl"),
    ("queries.jsonl", "BEIR folder <folder> is missing queries.jsonl"),
    ("empty queries.jsonl", "<folder>/queries.jsonl holds no query"),  # HEAD named the qrels
    ("empty corpus.jsonl", "<folder>/corpus.jsonl holds no document; add one JSON object per line"),  # HEAD: no folder
    ("folder qrels/dev.tsv", "BEIR folder <folder>: qrels/dev.tsv is a folder; it must be a file"),  # HEAD: "is missing" it
])
def test_bad_folder_refused_before_training(tiny_bert, corpus, tmp_path, capsys, damage, expected):
    import shutil

    folder = write_beir(tmp_path / "toy")
    target = folder / damage.split()[-1]
    if damage.startswith("empty "):
        target.write_text("")
    elif damage.startswith("folder "):
        target.unlink()
        target.mkdir()
    else:
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(folder))) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"retromae pretrain: error: --eval-beir-folder {folder} (--eval-split dev): ")
    # the folder as given, not its last part (HEAD: "BEIR folder toy is missing ...")
    assert expected.replace("<folder>", str(folder)) in error and len(error.splitlines()) == 1, error
    assert not out.exists(), "refused before the output folder is touched"


BEST = ("--eval-strategy", "steps", "--eval-steps", "1", "--save-steps", "1", "--save-total-limit", "2",
        "--metric-for-best-model", "ndcg@10", "--load-best-model-at-end", "true")


@pytest.mark.parametrize(("flags", "expected"), [
    (["--eval-max-queries", "0"], "--eval-max-queries 0"),
    (["--load-best-model-at-end", "true"], "--load-best-model-at-end keeps the saved checkpoint with the best "
                                           "validation: add --eval-strategy steps --eval-steps N (--save-steps a "
                                           "multiple of N)"),
    (["--metric-for-best-model", "ndcg@10"], "--metric-for-best-model ndcg@10 compares the Trainer's evaluations"),
    (["--eval-strategy", "steps", "--eval-steps", "2", "--load-best-model-at-end", "true"],
     "--metric-for-best-model loss: the retrieval validation logs ndcg@10, mrr@10, recall@100"),
    ([*BEST[:6], "--metric-for-best-model", "coverage@10"], "--metric-for-best-model coverage@10: the retrieval"),
    ([*BEST[:6], "--save-total-limit", "1", *BEST[8:]], "use --save-total-limit 2 or more"),
    (["--eval-strategy", "steps", "--eval-steps", "3", "--save-steps", "2", *BEST[8:]],
     "multiple of the evaluation steps"),
])
def test_unsupported_options_refused(tiny_bert, corpus, beir_folder, tmp_path, capsys, flags, expected):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(beir_folder), *flags)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and expected in error and not out.exists(), error


def test_best_model_needs_the_validation_folder(tiny_bert, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_args(tiny_bert, corpus, out, *BEST)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and not out.exists()
    assert "--load-best-model-at-end" in error and "--eval-beir-folder" in error


@pytest.mark.parametrize(("flags", "expected"), [
    (["--eval-strategy", "steps", "--eval-steps", "1"], "--eval-strategy, --eval-steps configure the validation"),
    (["--eval-on-start", "true"], "--eval-on-start configures the validation"),
    (["--eval-split", "test", "--eval-coverage", "true"], "--eval-split, --eval-coverage configure the validation"),
    (["--eval-split", "dev"], "--eval-split configures the validation"),  # the default, given: HEAD accepted it
    (["--eval-beir-folder", "FOLDER", "--eval-steps", "0"], "--eval-steps 0.0: give a positive number"),
    (["--eval-beir-folder", "FOLDER", "--eval-steps", "-2"], "--eval-steps -2.0: give a positive number"),
    (["--eval-beir-folder", "FOLDER", "--per-device-eval-batch-size", "0"],  # HEAD: every evaluation failed
     "--per-device-eval-batch-size 0: give a positive integer"),
])
def test_validation_options_that_cannot_work_are_refused_before_training(tiny_bert, corpus, beir_folder, tmp_path,
                                                                         capsys, flags, expected):
    """HEAD: without --eval-beir-folder, a traceback from Trainer.__init__ after the model loaded, or the options
    ignored; --eval-steps 0 or -2 accepted (0 evaluated at every logging step)."""
    out = tmp_path / "run"
    flags = [str(beir_folder) if flag == "FOLDER" else flag for flag in flags]
    assert main(pretrain_args(tiny_bert, corpus, out, *flags)) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and expected in error and not out.exists(), error


def scripted_ndcg(monkeypatch, values: list[float]) -> None:
    """Make each retrieval validation return the next of `values` as its NDCG@10 (the others fixed)."""
    scores = iter(values)
    monkeypatch.setattr(validation, "evaluate_retrieval",
                        lambda *args, **kwargs: {"ndcg@10": next(scores), "mrr@10": 0.5, "recall@100": 0.5})


def test_an_evaluation_between_saves_is_never_the_best(tiny_bert, corpus, beir_folder, tmp_path, monkeypatch,
                                                        capsys):
    """With --eval-steps 1 --save-steps 2 the 0.6 of step 3 has no checkpoint: HEAD recorded it as the best, loaded
    checkpoint-2 at the end, and said the final weights were step 3's. The best is chosen among saved steps."""
    out = tmp_path / "best"
    scripted_ndcg(monkeypatch, [0.2, 0.5, 0.6, 0.3])
    flags = [value if i != BEST.index("--save-steps") + 1 else "2" for i, value in enumerate(BEST)]
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(beir_folder), *flags,
                              "--no-export", "true")) == 0
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert [e["eval_ndcg@10"] for e in state["log_history"] if "eval_ndcg@10" in e] == [0.2, 0.5, 0.6, 0.3]
    assert (state["best_global_step"], state["best_metric"]) == (2, 0.5)
    assert f"best checkpoint: step 2, ndcg@10 0.5000 ({out / 'checkpoint-2'})" in capsys.readouterr().out
    info = json.loads((out / "retromae_run.json").read_text())
    assert (info["weights_step"], info["best_metric"]) == (2, {"ndcg@10": 0.5})
    best, final = (load_file(str(out / name)) for name in ("checkpoint-2/model.safetensors", "model.safetensors"))
    assert all(torch.equal(best[k], final[k]) for k in best)


def test_resuming_after_the_validation_files_changed_is_refused(tiny_bert, corpus, beir_folder, tmp_path, monkeypatch,
                                                                capsys):
    """HEAD resumed a best-checkpoint run whose validation qrels had been rewritten in place, and compared the new
    scores with the recorded best's."""
    import shutil

    folder = Path(shutil.copytree(beir_folder, tmp_path / "beir"))
    out = tmp_path / "run"
    scripted_ndcg(monkeypatch, [0.2, 0.5, 0.3, 0.4])
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(folder), *BEST,
                              "--no-export", "true")) == 0
    qrels = folder / "qrels" / "dev.tsv"
    qrels.write_text(qrels.read_text() + qrels.read_text().splitlines()[-1] + "\n")
    scripted_ndcg(monkeypatch, [0.3, 0.4])
    assert main(["pretrain", "--output-dir", str(tmp_path / "resumed"), "--resume-from-checkpoint",
                 str(out / "checkpoint-2")]) == 2
    err = capsys.readouterr().err
    assert f"--eval-beir-folder file {qrels} changed size" in err and "compared with the recorded best's" in err, err


def test_load_best_model_at_end_saves_and_exports_the_best_checkpoint(tiny_bert, corpus, beir_folder, tmp_path,
                                                                      monkeypatch, capsys):
    plain, out = tmp_path / "plain", tmp_path / "best"
    assert main(pretrain_args(tiny_bert, corpus, plain, "--no-export", "true")) == 0
    scripted_ndcg(monkeypatch, [0.2, 0.5, 0.3, 0.4])
    assert main(pretrain_args(tiny_bert, corpus, out, "--eval-beir-folder", str(beir_folder), *BEST)) == 0
    summary = capsys.readouterr().out
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["best_global_step"] == 2 and state["best_metric"] == 0.5, "greater is better for ndcg@10"
    assert state["best_model_checkpoint"] == str(out / "checkpoint-2")
    assert [e["step"] for e in state["log_history"] if "eval_ndcg@10" in e] == [1, 2, 3, 4]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"], "the best is kept"
    assert f"best checkpoint: step 2, ndcg@10 0.5000 ({out / 'checkpoint-2'}); the final save and export" in summary
    info = json.loads((out / "retromae_run.json").read_text())
    assert (info["global_step"], info["weights_step"], info["best_metric"]) == (4, 2, {"ndcg@10": 0.5})
    assert "weights_step" not in json.loads((out / "checkpoint-4" / "retromae_run.json").read_text())
    card = (out / "encoder" / "README.md").read_text()
    assert "| Pre-training steps | 4 (the weights are step 2's, the best by validation: ndcg@10 0.5" in card, card
    best, last, final = (load_file(str(out / name)) for name in
                         ("checkpoint-2/model.safetensors", "checkpoint-4/model.safetensors", "model.safetensors"))
    assert all(torch.equal(best[k], final[k]) for k in best) and not all(torch.equal(last[k], final[k]) for k in last)
    exported = load_file(str(out / "encoder" / "model.safetensors"))
    assert all(torch.equal(value, best[f"bert.{k}"]) for k, value in exported.items() if f"bert.{k}" in best)
    assert any(f"bert.{k}" in best for k in exported)
    expected = load_file(str(plain / "checkpoint-4" / "model.safetensors"))  # the evaluations leave training alone
    assert all(torch.equal(expected[k], last[k]) for k in expected)
    # resuming from the best checkpoint continues the run exactly and still ends on the best weights
    resumed = tmp_path / "resumed"
    scripted_ndcg(monkeypatch, [0.3, 0.4])
    assert main(pretrain_args(tiny_bert, corpus, resumed, "--eval-beir-folder", str(beir_folder), *BEST,
                              "--no-export", "true", "--resume-from-checkpoint", str(out / "checkpoint-2"))) == 0
    again = load_file(str(resumed / "model.safetensors"))
    assert all(torch.equal(best[k], again[k]) for k in best)
    state = json.loads((resumed / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["best_global_step"] == 2
    resumed_last = load_file(str(resumed / "checkpoint-4" / "model.safetensors"))
    assert all(torch.equal(last[k], resumed_last[k]) for k in last)
    # resuming the finished run (its last checkpoint) trains nothing and saves the best weights too
    finished = tmp_path / "finished"
    assert main(pretrain_args(tiny_bert, corpus, finished, "--eval-beir-folder", str(beir_folder), *BEST,
                              "--no-export", "true", "--resume-from-checkpoint", str(out / "checkpoint-4"))) == 0
    again = load_file(str(finished / "model.safetensors"))
    assert all(torch.equal(best[k], again[k]) for k in best)
    finished_summary = capsys.readouterr().out  # nothing exported: HEAD said "the final save and export are ..."
    assert f"best checkpoint: step 2, ndcg@10 0.5000 ({out / 'checkpoint-2'}); the final save is its weights" \
        in finished_summary, finished_summary
    # another validation set would compare its scores with the recorded best's (HEAD resumed and mixed them)
    for changed in (["--eval-split", "train"], ["--eval-max-queries", "3"]):
        assert main(pretrain_args(tiny_bert, corpus, tmp_path / "mixed", "--eval-beir-folder", str(beir_folder),
                                  *BEST, "--no-export", "true", "--resume-from-checkpoint", str(out / "checkpoint-2"),
                                  *changed)) == 2
        assert f"{changed[0]} {changed[1]} contradicts the run being resumed" in capsys.readouterr().err
