"""benchmarks/merge_ledger.py: the per-seed ledgers of a run on another machine join this checkout's ledger."""

from __future__ import annotations

import json

import pytest

from ..builders import benchmark_script


@pytest.fixture(scope="module")
def merge_ledger():
    return benchmark_script("merge_ledger")


def seed_ledger(seed: int, ndcg: float) -> dict:
    entry = {"key": f"k{seed}", "seconds": 40.0, "result": {"ndcg_at_10": ndcg}}
    return {"coverage": {"key": "c", "result": {"at_10": 0.1}},
            "export_cls": {"key": "e", "result": "out/x/export-cls"},
            f"finetune_none_s{seed}": {**entry, "result": {"in-batch": {"steps": 1}}}, f"evaluate_none_s{seed}": entry}


def test_seeds_join_under_their_variant_with_the_machine_named(merge_ledger, tmp_path):
    ledger = tmp_path / "none.phases.json"
    ledger.write_text(json.dumps({"coverage": {"key": "c", "result": {"at_10": 0.2}},
                                  "evaluate_none_s42": {"key": "cpu", "result": {"ndcg_at_10": 0.61}}}))
    sources = []
    for seed, ndcg in ((42, 0.62), (43, 0.63)):
        sources.append(tmp_path / f"phases{seed}.json")
        sources[-1].write_text(json.dumps(seed_ledger(seed, ndcg)))
    merge_ledger.main(["none", *map(str, sources), "--as", "none_h200", "--hardware", "H200",
                       "--ledger", str(tmp_path)])
    merged = json.loads(ledger.read_text())
    assert merged["coverage"]["result"] == {"at_10": 0.2}  # this checkout's phases stay
    assert merged["evaluate_none_s42"]["result"] == {"ndcg_at_10": 0.61}  # the CPU seed is not touched
    assert merged["evaluate_none_h200_s43"] == {"hardware": "H200", "key": "k43", "seconds": 40.0,
                                                "result": {"ndcg_at_10": 0.63}}
    assert {"finetune_none_h200_s42", "export_cls"} <= set(merged)


def test_a_phase_the_ledger_has_is_replaced_only_when_asked(merge_ledger):
    target = {"evaluate_none_s42": {"key": "cpu", "result": {"ndcg_at_10": 0.61}}}
    with pytest.raises(SystemExit, match="pass --replace"):
        merge_ledger.merge(target, [seed_ledger(42, 0.62)], "none", None, "H200", replace=False)
    merge_ledger.merge(target, [seed_ledger(42, 0.62)], "none", None, "H200", replace=True)
    assert target["evaluate_none_s42"]["result"] == {"ndcg_at_10": 0.62}


def test_sources_that_disagree_on_a_shared_phase_are_refused(merge_ledger):
    first, second = seed_ledger(42, 0.62), seed_ledger(43, 0.63)
    second["export_cls"]["result"] = "out/y/export-cls"
    with pytest.raises(SystemExit, match="export_cls: the sources disagree"):
        merge_ledger.merge({}, [first, second], "none", None, "H200", replace=False)
