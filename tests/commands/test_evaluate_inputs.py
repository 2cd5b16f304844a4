"""`retromae evaluate` and the BEIR reader on inputs of the wrong type or shape: the Python API's bool, path and list
parameters, qrels edge cases (a blank line before the header, quotes, duplicates), ids with whitespace, blank
queries, and the summary of several evaluations of one model into one folder."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
import retromae
from retromae.trainers.retrieval import mteb as mteb_module
from retromae.trainers.retrieval.beir import RetrievalDataError, drop_blank_queries, read_beir, read_qrels
from retromae.trainers.retrieval.mteb import evaluate_folder
from retromae.trainers.retrieval.summaries import model_digest

from .. import builders


@pytest.fixture(scope="module")
def tiny_beir(tmp_path_factory):
    return builders.write_beir(tmp_path_factory.mktemp("data") / "toy")


def _rewrite_jsonl(path, change):
    """Rewrite each JSON line of `path` through `change(record) -> record`."""
    records = [change(json.loads(line)) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


# ---- the Python API's parameter types ------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [{"overwrite": "no"}, {"update_card": "no"}, {"show_progress_bar": "yes"},
                                    {"overwrite": 0}])
def test_python_api_refuses_a_bool_option_that_is_no_bool(tmp_path, option):
    """HEAD took overwrite="no" as True (it replaced another model's results) and update_card="no" too."""
    ((name, value),) = option.items()
    with pytest.raises(TypeError, match=re.escape(f"retromae.evaluate: {name}={value!r} is not a bool; give True or "
                                                  "False")):
        retromae.evaluate(tmp_path / "no-model", str(tmp_path / "beir"), tmp_path / "eval", **option)
    assert not (tmp_path / "eval").exists()


@pytest.mark.parametrize(("arguments", "message"), [
    ({"model": 5}, "retromae.evaluate: model=5 (int) is not a path; give a model folder or a Hub id"),
    ({"data": 123}, "retromae.evaluate: data=123 (int) is neither a str or os.PathLike nor a list of them"),
    ({"data": ["beir", 5]}, "retromae.evaluate: data[1]=5 (int) is not a str or os.PathLike"),
    ({"output_dir": 7}, "retromae.evaluate: output_dir=7 (int) is not a path"),
    ({"dataset_ids": 5}, "retromae.evaluate: dataset_ids=5 (int) is neither a str nor a list of them"),
    ({"dataset_ids": ["org/a", None]}, "retromae.evaluate: dataset_ids[1]=None (NoneType) is not a str"),
])
def test_python_api_names_a_parameter_of_the_wrong_type(tmp_path, arguments, message):
    """HEAD: `'int' object is not iterable` (mteb.py) for data=123, pathlib's TypeError for model=5."""
    call = {"model": tmp_path / "no-model", "data": str(tmp_path / "beir"), "output_dir": tmp_path / "eval"}
    call.update(arguments)
    with pytest.raises(TypeError, match=re.escape(message)):
        retromae.evaluate(call.pop("model"), call.pop("data"), call.pop("output_dir"), **call)


def test_a_single_dataset_id_or_folder_is_one_item(spread_cls_bert, tiny_beir, tmp_path):
    """HEAD took dataset_ids="org/x" as 5 ids (`--dataset-ids has 5 entries for 1 BEIR folders`), and
    evaluate_folder's beir_folders="path" as one folder per character."""
    rows = retromae.evaluate(spread_cls_bert, tiny_beir, tmp_path / "e1", split="dev", dataset_ids="org/x",
                             show_progress_bar=False)
    assert [row["dataset_id"] for row in rows] == ["org/x"]
    rows = evaluate_folder(spread_cls_bert, beir_folders=str(tiny_beir), split="dev",
                           output_dir=tmp_path / "e2")
    assert [row["dataset_id"] for row in rows] == ["local/toy"]


# ---- qrels edge cases ----------------------------------------------------------------------------------------------


def test_a_blank_line_before_the_qrels_header_is_skipped(tmp_path):
    """HEAD: `dev.tsv:2: score 'score' is not a finite number` (the header was recognised on line 1 only)."""
    qrels = builders.write_lines(tmp_path / "q.tsv", ["", "  ", "query-id\tcorpus-id\tscore", "q1\td1\t1"])
    assert read_qrels(qrels) == {"q1": {"d1": 1}}
    builders.write_lines(qrels, ["q1\td1\t1", "query-id\tcorpus-id\tscore"])  # a header on a later line is no header
    with pytest.raises(RetrievalDataError, match=r"q.tsv:2: score 'score' is not a finite number"):
        read_qrels(qrels)


def test_an_id_starting_with_a_quote_is_an_ordinary_id(tmp_path):
    """HEAD read qrels with csv quoting: the `"` swallowed the rest of the file (`expected 3 ... columns, got 1`)."""
    folder = builders.write_beir(tmp_path / "toy")
    _rewrite_jsonl(folder / "queries.jsonl", lambda q: {**q, "_id": '"' + q["_id"] if q["_id"] == "q12" else q["_id"]})
    qrels = folder / "qrels" / "dev.tsv"
    qrels.write_text(qrels.read_text().replace("q12\t", '"q12\t'))
    data = read_beir(folder, split="dev")
    assert data.qrels['"q12'] == {"d12": 1} and len(data.queries) == 6


def test_ids_are_stripped_in_corpus_and_queries_as_in_qrels(tmp_path):
    """HEAD kept `"d12 "` in corpus.jsonl and refused the qrels' `d12` as missing from corpus.jsonl."""
    folder = builders.write_beir(tmp_path / "toy")
    _rewrite_jsonl(folder / "corpus.jsonl", lambda d: {**d, "_id": d["_id"] + " " if d["_id"] == "d12" else d["_id"]})
    _rewrite_jsonl(folder / "queries.jsonl", lambda q: {**q, "_id": " " + q["_id"] if q["_id"] == "q13" else q["_id"]})
    data = read_beir(folder, split="dev")
    assert data.qrels["q12"] == {"d12": 1} and "q13" in data.queries and "d12" in data.corpus


def test_a_pair_judged_twice_with_different_scores_is_warned_about(tmp_path, caplog):
    """HEAD kept the later score without a word; the query was then dropped as `judged queries have no relevant
    document`, which did not mention the duplicate."""
    folder = builders.write_beir(tmp_path / "toy", extra_qrels=["q12\td12\t0", "q13\td13\t1"])  # lines 8 and 9
    with caplog.at_level(logging.WARNING, logger="retromae"):
        data = read_beir(folder, split="dev")
    assert "q12" not in data.queries and data.qrels["q13"] == {"d13": 1}
    assert ("dev.tsv: 1 (query-id, corpus-id) pair(s) are given again with another score, e.g. query 'q12' document "
            "'d12': line 2 score 1, line 8 score 0; the later line's score (0) is kept") in caplog.text
    caplog.clear()
    scores = builders.write_lines(tmp_path / "t.tsv", ["q\td\t0.5", "q\td\t0.5", "q\td\t2.5"])
    with caplog.at_level(logging.WARNING, logger="retromae"):
        assert read_qrels(scores, value_type=float) == {"q": {"d": 2.5}}
    assert "line 2 score 0.5, line 3 score 2.5" in caplog.text  # the line that set the score replaced


# ---- blank queries and the summary of several evaluations ---------------------------------------------------------


def test_blank_queries_are_dropped_with_a_count(spread_cls_bert, tmp_path, caplog):
    """HEAD encoded and scored queries of empty text as real queries, with no word (finetune drops them)."""
    folder = builders.write_beir(tmp_path / "toy")
    _rewrite_jsonl(folder / "queries.jsonl", lambda q: {**q, "text": " " if q["_id"] in {"q12", "q14"} else q["text"]})
    with caplog.at_level(logging.WARNING, logger="retromae"):
        rows = evaluate_folder(spread_cls_bert, beir_folders=[folder], split="dev", output_dir=tmp_path / "eval")
    assert rows[0]["queries"] == 4  # 6 dev queries, 2 blank
    assert "toy (dev): dropped 2 blank queries (e.g. ids ['q12', 'q14'])" in caplog.text
    data = drop_blank_queries(read_beir(folder, split="dev"))
    assert set(data.queries) == set(data.qrels) == {"q13", "q15", "q16", "q17"}
    assert data.report["blank_queries"] == 2 and "blank queries: 2" in data.summary()
    _rewrite_jsonl(folder / "queries.jsonl", lambda q: {**q, "text": ""})
    with pytest.raises(RetrievalDataError, match=r"toy \(dev\): all 6 queries with a relevant document have blank"):
        drop_blank_queries(read_beir(folder, split="dev"))


def test_a_second_evaluation_of_the_model_keeps_the_first_ones_rows(spread_cls_bert, tiny_beir, tmp_path):
    """HEAD replaced summary.{json,md} with the last run's rows: the first dataset's row was gone, without a flag."""
    other = builders.write_beir(tmp_path / "other")
    out = tmp_path / "eval"
    first = evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=out)
    evaluate_folder(spread_cls_bert, beir_folders=[other], split="dev", output_dir=out, search="faiss")
    again = evaluate_folder(spread_cls_bert, beir_folders=[other], split="dev", output_dir=out)  # replaces its row
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["dataset_name"], r["search"]) for r in summary["results"]] == [
        ("toy (local BEIR)", "exact"), ("other (local BEIR)", "exact")]
    assert summary["results"][0]["ndcg_at_10"] == first[0]["ndcg_at_10"] and len(again) == 1
    markdown = (out / "summary.md").read_text()
    assert "| toy (local BEIR) | dev |" in markdown and "| other (local BEIR) | dev |" in markdown
    evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="train", output_dir=out)  # another split: added
    assert len(json.loads((out / "summary.json").read_text())["results"]) == 3


def test_a_folder_named_like_an_earlier_rows_folder_gets_a_row_of_its_own(spread_cls_bert, tmp_path):
    """HEAD named both LocalBEIR-toy: evaluating b/toy after a/toy into one folder replaced a/toy's row and mteb
    result file without a word, and no row said which folder it came from."""
    first = builders.write_beir(tmp_path / "a" / "toy")
    second = builders.write_beir(tmp_path / "b" / "toy", splits=(("dev", range(12, 15)),))
    out = tmp_path / "eval"
    evaluate_folder(spread_cls_bert, beir_folders=[first], split="dev", output_dir=out)
    evaluate_folder(spread_cls_bert, beir_folders=[second], split="dev", output_dir=out)
    rows = json.loads((out / "summary.json").read_text())["results"]
    assert [(r["dataset_name"], r["queries"]) for r in rows] == [("toy (local BEIR)", 6), ("b/toy (local BEIR)", 3)]
    assert [r["beir_folder"] for r in rows] == [str(first.resolve()), str(second.resolve())]
    assert len(list((out / "mteb").rglob("LocalBEIR-toy*.json"))) == 2
    evaluate_folder(spread_cls_bert, beir_folders=[first], split="dev", output_dir=out)  # scored again: replaced
    rows = json.loads((out / "summary.json").read_text())["results"]
    assert [(r["dataset_name"], r["queries"]) for r in rows] == [("b/toy (local BEIR)", 3), ("a/toy (local BEIR)", 6)]
    assert _result_files(out) == {r["mteb_file"] for r in rows}  # a/toy's file under its old task name is gone


def _result_files(out) -> set[str]:
    """The mteb result JSON files under out/mteb, relative to out."""
    return {path.relative_to(out).as_posix() for path in (out / "mteb").rglob("*.json") if path.name != "model_meta.json"}


def test_another_models_rows_are_not_kept_with_overwrite(spread_cls_bert, tiny_beir, tmp_path):
    """The rows merged are the same model's only: `--overwrite` over another model's summary replaces it."""
    copy = shutil.copytree(spread_cls_bert, tmp_path / "copy")
    other = builders.write_beir(tmp_path / "other")
    evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=tmp_path / "eval")
    evaluate_folder(copy, beir_folders=[other], split="dev", output_dir=tmp_path / "eval", overwrite=True)
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert [r["dataset_name"] for r in summary["results"]] == ["other (local BEIR)"]
    assert _result_files(tmp_path / "eval") == {summary["results"][0]["mteb_file"]}  # the first model's file is gone
    # and its folder: mteb's own records (model_meta.json, run_settings.jsonl) kept it before
    assert [path.name for path in (tmp_path / "eval" / "mteb" / "results").iterdir()] == ["local__copy"]


def test_an_overwrite_that_fails_midway_leaves_no_row_of_the_replaced_model(spread_cls_bert, tiny_beir, tmp_path,
                                                                             monkeypatch):
    """HEAD kept the other model's rows until the new summary was written: an evaluation that failed after mteb had
    rewritten a task's file left a row reporting the old score beside a file holding the new model's."""
    copy = shutil.copytree(spread_cls_bert, tmp_path / "copy")
    out = tmp_path / "eval"
    evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=out)
    summary = json.loads((out / "summary.json").read_text())
    summary["results"].append({**summary["results"][0], "mteb_file": ["not", "a", "path"]})  # hand-edited: ignored
    (out / "summary.json").write_text(json.dumps(summary))

    def fail(*args, **kwargs):
        raise RuntimeError("stopped midway")

    monkeypatch.setattr(mteb_module, "evaluate_model", fail)
    with pytest.raises(RuntimeError, match="stopped midway"):
        evaluate_folder(copy, beir_folders=[tiny_beir], split="dev", output_dir=out, overwrite=True)
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["model_path"], summary["results"]) == (str(copy.resolve()), [])
    assert _result_files(out) == set()


def test_rows_of_a_model_folder_whose_weights_changed_are_not_kept(spread_cls_bert, minilm_dir, tiny_beir, tmp_path):
    """HEAD kept them: after `finetune --overwrite` into the same folder, the summary mixed two models' rows."""
    model = shutil.copytree(spread_cls_bert, tmp_path / "model")
    other = builders.write_beir(tmp_path / "other")
    out = tmp_path / "eval"
    evaluate_folder(model, beir_folders=[tiny_beir], split="dev", output_dir=out)
    (model / "model.safetensors").unlink()
    shutil.copy(minilm_dir / "model.safetensors", model / "model.safetensors")  # the same path, other weights
    shutil.copy(minilm_dir / "config.json", model / "config.json")
    with pytest.raises(ValueError, match=re.escape(f"--output-dir {out} holds the results of {model} as it was before "
                                                   "its weights or modules changed (summary.json); choose another "
                                                   "--output-dir, or pass --overwrite")):
        evaluate_folder(model, beir_folders=[other], split="dev", output_dir=out)
    evaluate_folder(model, beir_folders=[other], split="dev", output_dir=out, overwrite=True)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["dataset_name"] for r in summary["results"]] == ["other (local BEIR)"]
    assert summary["model_digest"] == model_digest(model)
    assert _result_files(out) == {summary["results"][0]["mteb_file"]}  # HEAD kept the old weights' result file
    with pytest.raises(ValueError, match="as it was before its weights or modules changed"):  # another pooling
        evaluate_folder(model, beir_folders=[other], split="dev", output_dir=out, pooling="mean")


def test_a_changed_module_makes_another_model(minilm_dir, tmp_path):
    """HEAD's digest read the weights only: a folder whose pooling was switched kept the other pooling's rows."""
    model = shutil.copytree(minilm_dir, tmp_path / "model")
    before = model_digest(model)
    (model / "README.md").write_text("an edited card")  # `--update-card` rewrites it: still the same model
    assert model_digest(model) == before
    pooling = model / "1_Pooling" / "config.json"
    pooling.write_text(pooling.read_text().replace('"pooling_mode_mean_tokens": true', '"pooling_mode_mean_tokens": false'))
    assert model_digest(model) != before


def test_a_summary_md_evaluate_did_not_write_is_kept_without_overwrite(spread_cls_bert, tiny_beir, tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "summary.md").write_text("my own notes\n")
    with pytest.raises(ValueError, match=re.escape(f"--output-dir {out} holds a summary.md that evaluate did not "
                                                   "write; choose another --output-dir, or pass --overwrite")):
        evaluate_folder(spread_cls_bert, beir_folders=[tiny_beir], split="dev", output_dir=out)
    assert (out / "summary.md").read_text() == "my own notes\n"
