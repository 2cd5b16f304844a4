"""benchmarks/collation_speed.py with a few repeats, in this process: both ways are timed on every layout and the
table and JSON hold together; two ways that pad differently are refused before timing. The timings are the
benchmark's."""

from __future__ import annotations

import json
import sys

import pytest

from ..builders import benchmark_script

pytestmark = pytest.mark.usefixtures("datasets_cache")


@pytest.fixture(scope="module")
def bench():
    return benchmark_script("collation_speed")


def test_both_ways_are_timed_and_reported(bench, tmp_path, monkeypatch, capsys):
    output = tmp_path / "collation.json"
    monkeypatch.setattr(sys, "argv", ["collation_speed.py", "--lengths", "16,40", "--batch-sizes", "4",
                                      "--burn-in", "1", "--repeats", "3", "--output", str(output)])
    bench.main()
    report = json.loads(output.read_text())
    assert [(r["layout"], r["length"]) for r in report["rows"]] == [
        ("packed", 16), ("packed", 40), ("padded", 16), ("padded", 40)]
    for row in report["rows"]:
        assert all(len(row["seconds"][way]) == 3 for way in ("numpy rows", "arrow batch"))
        assert row["speedup"] == pytest.approx(row["ms_per_batch"]["numpy rows"] / row["ms_per_batch"]["arrow batch"])
    assert report["table_markdown"] in capsys.readouterr().out and report["environment"]["threads"] == 1


def test_ways_that_pad_differently_are_not_timed(bench, tokenizer, monkeypatch):
    dataset = bench.token_dataset(16, "padded", len(tokenizer))
    ways = bench.readers(dataset)
    monkeypatch.setattr(bench, "readers", lambda _: {**ways, "arrow batch": dataset.with_format("numpy").select(
        range(1, len(dataset)))})  # every row one off
    args = type("Args", (), {"burn_in": 1, "repeats": 1})()
    with pytest.raises(SystemExit, match="pad batch .* differently"):
        bench.time_row(bench.PretrainingCollator(tokenizer), dataset, 4, args)
