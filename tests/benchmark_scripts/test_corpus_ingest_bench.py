"""benchmarks/corpus_ingest.py's tokenising, streaming and resume parts on tiny corpora, in this process: they run and
their results hold together (the timings themselves are the benchmark's). The workers' smoke (real data, the
tokenizer) is `experiment` (`make smoke`); the table and the options are checked in every run."""

from __future__ import annotations

from types import ModuleType

import pytest

from ..builders import benchmark_script

pytestmark = pytest.mark.usefixtures("datasets_cache")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return benchmark_script("corpus_ingest")


@pytest.fixture(scope="module")
def corpus(bench, shared_data, tmp_path_factory) -> dict:
    return bench.write_jsonl(0.2, tmp_path_factory.mktemp("ingest") / "corpus.jsonl")


@pytest.mark.experiment
def test_the_corpus_has_the_size_asked(corpus):
    assert corpus["rows"] > 500 and 0.18 <= corpus["text_mb"] <= 0.2


@pytest.mark.experiment
def test_tokenize_and_stream_workers_count_every_row(bench, corpus):
    tokenized = bench.tokenize_worker(corpus["path"], 1, corpus["text_mb"])
    assert tokenized["sequences"] == tokenized["passages"] == corpus["rows"] and tokenized["peak_rss_mb"] > 0
    everything = bench.stream_worker(corpus["path"], 100, mark_rows=10)
    assert everything["rows"] == corpus["rows"] and everything["peak_rss_mb_at_mark"] > 0
    assert bench.stream_worker(corpus["path"], 0, limit=50)["rows"] == 50


@pytest.mark.experiment
def test_resume_gives_the_batch_replay_gives(bench, corpus):
    run = bench.resume_worker(corpus["path"], 3)
    assert run["batch_equal"] and run["resume_batches"] == 3


def test_render_shows_every_part_and_only_is_checked(bench):
    memory = {"rows": 9, "mark_rows": 5, "peak_rss_mb": 400.0, "peak_rss_mb_at_mark": 399.0}
    report = {"tokenize": {"environment": {"date": "d"}, "corpus": {"text_mb": 1.0, "rows": 9}, "max_seq_length": 256,
                           "rows": [{"processes": 1, "seconds": 1.0, "mb_per_s": 1.0, "sequences_per_s": 9.0,
                                     "peak_rss_mb": 400.0}]},
              "streaming": {"environment": {"date": "d"}, "sizes_mb": [1024, 2048], "rss_spread": 0.01,
                            "runs": {"memory": {"1gb": memory, "2gb": memory}}, "resume_batches": 10,
                            "replay_s": 2.0, "resume_s": 0.1, "resume_speedup": 20.0, "resume_batch_equal": True,
                            "shuffle_buffer": 10000, "shuffle_rows": 9, "shuffle_samples_per_s": 1.0,
                            "no_shuffle_samples_per_s": 2.0,
                            "targets": {"rss_within_10_percent": True, "resume_10x_at_10000": False}}}
    table = bench.render(report)
    assert "| 1 | 1.0 | 1.0 | 9.0 | 400.0 |" in table and "2048 MB corpus" in table and "MISSED" in table
    assert bench.parse_args(["--only", "tokenize"]).parts == ["tokenize"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--only", "tokenise"])
