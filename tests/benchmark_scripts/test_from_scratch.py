"""benchmarks/from_scratch.py (issue 33): the results JSON and table built from the ledger, the step budget from a
probe, the arms' flags, the device scripts; and a --tiny smoke run of two arms end to end (`make smoke`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

from ..builders import benchmark_script, fake_clock

DEVICE = Path(__file__).resolve().parents[2] / "benchmarks" / "device"


@pytest.fixture(scope="module")
def fs() -> ModuleType:
    return benchmark_script("from_scratch")


def arm_ledger(arm: str, ndcg: dict[int, float], variants: tuple[str, ...] | None = None) -> dict:
    """An arm's ledger as run_arm writes it: pre-training, coverage, zero-shot and scored seeds of each variant."""
    def entry(result, seconds=1.0):
        return {"key": "k", "seconds": seconds, "result": result, "hardware": "CPU here"}

    done = {"init_weights": entry("abc"), "pretrain": entry("out/x", 100.0), "pretrain_weights": entry("def"),
            "pretraining_record": entry({"steps": 500, "seconds_per_step": 0.2, "tokens_seen": 500 * 128 * 256,
                                         "encoder_mlm_accuracy": 0.4125}),
            "coverage": entry({"10": 0.1, "20": 0.2, "50": 0.3, "100": 0.4}),
            "coverage_lm_head": entry({"10": 0.5, "20": 0.6, "50": 0.7, "100": 0.8})}
    for variant in variants or (arm,):
        offset = 0.05 if variant.endswith("hybrid") else 0.0
        done[f"zeroshot_{variant}"] = entry({"ndcg_at_10": 0.1 + offset, "mrr_at_10": 0.09, "recall_at_100": 0.3})
        for seed, value in ndcg.items():
            done[f"finetune_{variant}_s{seed}"] = entry({"stages": {}}, 20.0)
            done[f"evaluate_{variant}_s{seed}"] = entry({"ndcg_at_10": value + offset, "mrr_at_10": value - 0.01,
                                                         "recall_at_100": 0.8, "queries": 200})
    return done


def test_results_json_names_every_arm_with_its_seeds(fs, tmp_path):
    """from_scratch.json holds arms by name (mlm, retromae, dupmae, ...), each with `seeds` [{seed, ndcg@10, ...}],
    its zero-shot scores, coverage and tokens; DupMAE's hybrid sits beside its [CLS]; an arm not run is absent."""
    ledger = tmp_path / "from_scratch_ledger"
    ledger.mkdir()
    fs.write_json(ledger / "mlm.phases.json", arm_ledger("mlm", {42: 0.30, 43: 0.32, 44: 0.31}))
    fs.write_json(ledger / "retromae.phases.json", arm_ledger("retromae", {42: 0.40, 43: 0.41, 44: 0.42}))
    fs.write_json(ledger / "dupmae.phases.json", arm_ledger("dupmae", {42: 0.35, 43: 0.36}, fs.VARIANTS["dupmae"]))
    _, cfg = fs.settings(fs.parse_args(["--seeds", "42,43,44"]))
    payload = fs.report(tmp_path, ledger, cfg, {"preset": "gpu", "command": "c", "date": "d"})
    saved = json.loads((tmp_path / "from_scratch.json").read_text(encoding="utf-8"))
    assert list(saved["arms"]) == ["mlm", "retromae", "dupmae"] and set(saved["arms"]) <= set(fs.ARMS)
    mlm = saved["arms"]["mlm"]
    assert [s["seed"] for s in mlm["seeds"]] == [42, 43, 44]
    assert set(mlm["seeds"][0]) >= {"seed", "ndcg@10", "mrr@10", "recall@100"}
    assert mlm["ndcg@10"] == pytest.approx(0.31) and mlm["ndcg@10_std"] == pytest.approx(0.01)
    assert mlm["zero_shot"]["ndcg@10"] == pytest.approx(0.1) and mlm["pretraining"]["tokens_seen"] == 500 * 128 * 256
    assert mlm["coverage_lm_head"]["10"] == 0.5 and mlm["init_weights"] == "abc"
    dupmae = saved["arms"]["dupmae"]
    assert [s["seed"] for s in dupmae["seeds"]] == [42, 43] and dupmae["label"] == "DupMAE [CLS]"
    assert dupmae["hybrid"]["ndcg@10"] == pytest.approx(0.405) and dupmae["hybrid"]["zero_shot"]["ndcg@10"] == pytest.approx(0.15)
    # vs MLM only: seed by seed, and the bar (more than twice the larger seed std)
    retromae = next(d for d in saved["versus_mlm"] if d["label"] == fs.LABELS["retromae"])
    assert retromae["ndcg@10_diff_by_seed"] == pytest.approx({"42": 0.10, "43": 0.09, "44": 0.11})
    assert retromae["beats_mlm_by_2x_spread"] is True and retromae["zero_shot_ndcg@10_diff"] == pytest.approx(0)
    table = payload["table_markdown"]
    assert "DupMAE [CLS] (2 of 3 seeds)" in table and "DupMAE hybrid" in table and "prove nothing" not in table
    assert "1,000,000 steps x 256 x L 512" in table and "500 steps x 128 sequences x L 256" in table
    assert "| MLM accuracy, last step |" in table and "| 0.4125 | 500 |" in table
    assert (tmp_path / "from_scratch_ndcg.png").stat().st_size > 0


def test_bm25_is_reported_for_scale_beside_the_arms(fs, tmp_path):
    """The hybrid's OT channel is lexical, so the table and plot carry BM25 on the same queries, when it was
    computed (not on the GPU machine, which lacks bm25s)."""
    ledger = tmp_path / "from_scratch_ledger"
    ledger.mkdir()
    fs.write_json(ledger / "mlm.phases.json", arm_ledger("mlm", {42: 0.30, 43: 0.32}))
    _, cfg = fs.settings(fs.parse_args(["--seeds", "42,43"]))
    meta = {"preset": "gpu", "command": "c", "date": "d"}
    assert "lexical retrieval" not in fs.report(tmp_path, ledger, cfg, meta)["table_markdown"]
    bm25 = {"label": "BM25 (bm25s, k1 1.5, b 0.75)", "ndcg@10": 0.6334, "mrr@10": 0.5928, "recall@100": 0.899}
    table = fs.report(tmp_path, ledger, cfg, meta, bm25)["table_markdown"]
    assert ("For scale, lexical retrieval on the same dev queries: BM25 (bm25s, k1 1.5, b 0.75), NDCG@10 0.6334, "
            "MRR@10 0.5928, Recall@100 0.8990.") in table
    assert json.loads((tmp_path / "from_scratch.json").read_text(encoding="utf-8"))["bm25"] == bm25


def test_seeds_from_two_pre_trainings_are_named(fs, tmp_path):
    """An arm pre-trained again on a new machine (its first checkpoint gone) fine-tunes its missing seeds from other
    weights: the report says which seeds used which."""
    ledger = tmp_path / "from_scratch_ledger"
    ledger.mkdir()
    retromae = arm_ledger("retromae", {42: 0.40, 43: 0.41, 44: 0.42})
    for seed, digest in ((42, "aaa"), (43, "aaa"), (44, "bbb")):
        retromae[f"finetune_retromae_s{seed}"]["start_weights"] = digest
    fs.write_json(ledger / "retromae.phases.json", retromae)
    fs.write_json(ledger / "mlm.phases.json", arm_ledger("mlm", {42: 0.30}))
    _, cfg = fs.settings(fs.parse_args(["--seeds", "42,43,44"]))
    payload = fs.report(tmp_path, ledger, cfg, {"preset": "gpu", "command": "c", "date": "d"})
    assert [s["start_weights"] for s in payload["arms"]["retromae"]["seeds"]] == ["aaa", "aaa", "bbb"]
    table = payload["table_markdown"]
    assert "RetroMAE (enhanced): its seeds were fine-tuned from 2 pre-training runs of the same settings (aaa: seeds " \
           "42, 43; bbb: seeds 44)" in table
    assert "MLM only: its seeds" not in table


def test_a_tiny_report_says_it_proves_nothing(fs, tmp_path):
    ledger = tmp_path / "from_scratch_ledger"
    ledger.mkdir()
    fs.write_json(ledger / "mlm.phases.json", arm_ledger("mlm", {42: 0.3}))
    _, cfg = fs.settings(fs.parse_args(["--tiny"]))
    payload = fs.report(tmp_path, ledger, cfg, {"preset": "tiny", "command": "c", "date": "d"})
    assert payload["note"] == fs.TINY_NOTE and payload["table_markdown"].startswith(f"**{fs.TINY_NOTE}**")
    assert payload["versus_mlm"] == []


def test_steps_from_the_probe_fit_the_slowest_arm(fs, tmp_path):
    probe = tmp_path / "probe.json"
    fs.write_json(probe, {"hardware": "GPU", "arms": {"mlm": {"seconds_per_step": 0.1},
                                                      "seed": {"seconds_per_step": 0.27}}})
    steps, how = fs.steps_from_probe(probe, 200)
    assert steps == 740 and how["slowest_seconds_per_step"] == 0.27  # 200 / 0.27 = 740.7, down to a multiple of 10
    assert fs.steps_from_probe(probe, 1)[0] == 10
    assert fs.parse_groups("mlm,retromae/dupmae,bow,seed", ["mlm", "seed"]) == [["mlm"], ["seed"]]


def test_arm_flags_are_identical_but_for_the_method(fs, tmp_path):
    """Every arm gets the same init, corpus, steps, batch, L, schedule and seed; mlm is the encoder's MLM alone; the
    tiny DupMAE projects [CLS] to at most the hidden size; the flags are `retromae pretrain` options."""
    _, cfg = fs.settings(fs.parse_args([]))
    flags = {arm: fs.pretrain_args(arm, tmp_path / "init", tmp_path / "corpus", cfg, 100) for arm in fs.ARMS}

    def shared(args: list[str]) -> list[str]:
        start = args.index("--model")
        return args[start:]

    assert len({tuple(shared(f)) for f in flags.values()}) == 1
    assert "--packing" in flags["mlm"] and "--bf16" in flags["mlm"]
    assert json.loads(flags["mlm"][flags["mlm"].index("--method_options") + 1]) == {"bow_loss_weight": 0.0}
    assert "enhanced" in flags["retromae"]
    _, tiny = fs.settings(fs.parse_args(["--tiny"]))
    dupmae = fs.pretrain_args("dupmae", tmp_path, tmp_path, tiny, 3)
    assert json.loads(dupmae[dupmae.index("--method_options") + 1])["dense_dim"] == fs.SIZES["tiny"]["hidden_size"]
    from retromae.trainers.cli import main

    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])


def test_phases_run_side_by_side_keep_their_own_seconds_and_every_entry(fs, tmp_path, monkeypatch):
    """Seeds fine-tuned side by side share their arm's ledger (`common.Phases`): each thread's nested phase (a
    pre-training made inside a fine-tune) keeps its own seconds, and the ledger file holds every thread's entry."""
    work = fake_clock(monkeypatch)  # one clock per thread
    phases, seeds = fs.Phases(tmp_path, "arm"), (42, 43, 44, 45)
    together = threading.Barrier(len(seeds), timeout=60)  # every fine-tune is running when the pre-trainings start

    def pretrain(seed: int) -> str:
        together.wait()
        return work(10, f"ckpt{seed}")

    def one_seed(seed: int) -> str:
        return phases.run(f"finetune_s{seed}", "k",
                          lambda: work(2, "") + phases.run(f"pretrain_s{seed}", "k", lambda: pretrain(seed)))

    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        assert list(pool.map(one_seed, seeds)) == [f"ckpt{seed}" for seed in seeds]
    # per thread as in one: the fine-tune's clock runs from 0 to 15, the pre-training's inside it from 3 to 14
    expected = {name: value for s in seeds for name, value in ((f"finetune_s{s}", 4.0), (f"pretrain_s{s}", 11.0))}
    assert phases.seconds() == expected
    assert fs.Phases(tmp_path, "arm").seconds() == expected  # read back from disk: no thread's write was lost


def test_settings_keys_hold_on_another_machine(fs):
    here = [str(fs.ROOT / "out" / "x"), str(fs.common.DATA / "scifact")]
    assert fs.settings_hash(here) == fs.settings_hash(["<repo>/out/x", "<data>/scifact"])


def test_device_scripts_parse_and_their_run_calls_fit(tmp_path):
    """The device scripts are valid bash; the run calls the prep script prints fit the tool (a command of at most
    2,000 characters, at most 8 carried paths, 600 s), cover the five arms, and the two of one session fit its 900 s
    of device time with a minute to start."""
    for script in ("from_scratch.sh", "from_scratch_prep.sh"):
        assert subprocess.run(["bash", "-n", str(DEVICE / script)], check=False).returncode == 0
    prep = (DEVICE / "from_scratch_prep.sh").read_text(encoding="utf-8")
    calls = re.findall(r'run\(command="DEADLINE=(\d+) ([^"]+)", carry=\[([^\]]*)\], timeout_s=(\d+)\)', prep)
    assert len(calls) == 3
    for deadline, command, carry, timeout in calls:
        assert len(command) <= 2000 and len(carry.split(",")) <= 8 and int(deadline) < int(timeout) <= 600
    assert int(calls[0][0]) + int(calls[1][0]) <= 900 - 60
    arms = {a for _, command, _, _ in calls for a in command.split()[-1].split(",")}
    assert arms == {"mlm", "retromae", "dupmae", "bow", "seed"}


def test_a_warm_machine_takes_back_its_last_calls_ledger(tmp_path):
    """from_scratch.sh, at its start: a ledger the machine kept from its last call replaces the tree's copy when it
    holds every phase the tree's holds (a committed ledger that grew on the machine), and never a fuller one."""
    script = (DEVICE / "from_scratch.sh").read_text(encoding="utf-8")
    merge = script.split('"$KEPT" "$L" <<\'PY\'\n', 1)[1].split("\nPY\n", 1)[0]
    kept, tree = tmp_path / "kept", tmp_path / "tree"
    kept.mkdir()
    tree.mkdir()
    phases = {"a": {"pretrain": 1, "finetune_a_s42": 2}, "b": {"pretrain": 1}, "c": {"pretrain": 1}}
    for arm, done in phases.items():
        (kept / f"{arm}.phases.json").write_text(json.dumps(done))
    (tree / "a.phases.json").write_text(json.dumps({"pretrain": 1}))
    (tree / "b.phases.json").write_text(json.dumps({"pretrain": 1, "finetune_b_s42": 2}))
    subprocess.run([sys.executable, "-c", merge, str(kept), str(tree)], check=True)
    got = {f.stem.split(".")[0]: json.loads(f.read_text()) for f in tree.glob("*.phases.json")}
    assert got == {"a": phases["a"], "b": {"pretrain": 1, "finetune_b_s42": 2}, "c": phases["c"]}


def test_the_reported_metrics_come_from_the_evaluate_summary(fs, tmp_path):
    summary = tmp_path / "summary.json"
    fs.write_json(summary, {"model": "m", "search": "exact", "results": [
        {"task": "t", "split": "dev", "queries": 20, "ndcg_at_10": 0.5, "mrr_at_10": 0.4, "recall_at_100": 0.9,
         "recall_at_1000": 1.0, "main_score": 0.5}]})
    assert fs.scores(summary) == {"ndcg_at_10": 0.5, "mrr_at_10": 0.4, "recall_at_100": 0.9, "queries": 20}


@pytest.mark.experiment
def test_tiny_two_arms_end_to_end(fs, shared_data, tmp_path):
    """--tiny for mlm and dupmae: random init, pre-training (3 steps), coverage, zero-shot, fine-tuning of every
    seed and variant, evaluation; then --report-only rebuilds the same table from the ledger. Proves the plumbing."""
    out = tmp_path / "fs"
    common = ["--tiny", "--output-dir", str(out)]
    assert fs.main([*common, "--arms", "mlm,dupmae"]) == 0
    saved = json.loads((out / "from_scratch.json").read_text(encoding="utf-8"))
    assert list(saved["arms"]) == ["mlm", "dupmae"] and "prove nothing" in saved["table_markdown"]
    for arm in ("mlm", "dupmae"):
        rec = saved["arms"][arm]
        assert [s["seed"] for s in rec["seeds"]] == [42, 43]
        assert all(0 <= s["ndcg@10"] <= 1 for s in rec["seeds"]) and rec["zero_shot"] is not None
        assert rec["pretraining"]["steps"] == 3 and rec["pretraining"]["tokens_seen"] > 0
        assert set(rec["coverage"]) == set(rec["coverage_lm_head"]) == {"10", "20", "50", "100"}
    assert [s["seed"] for s in saved["arms"]["dupmae"]["hybrid"]["seeds"]] == [42, 43]
    assert saved["arms"]["mlm"]["init_weights"] == saved["arms"]["dupmae"]["init_weights"]  # one random init
    table = saved["table_markdown"]
    assert fs.main([*common, "--report-only"]) == 0
    again = json.loads((out / "from_scratch.json").read_text(encoding="utf-8"))
    assert again["arms"] == saved["arms"] and table.split("Report:")[0] == again["table_markdown"].split("Report:")[0]


@pytest.mark.experiment
def test_tiny_from_mlm_checkpoint_end_to_end(fs, shared_data, tmp_path):
    """--tiny --protocol from_mlm: the BERT (MLM alone, saved as BertForMaskedLM), then the control and RetroMAE with
    a second pre-training seed continue from it, each fine-tuned and scored. Proves the plumbing."""
    out = tmp_path / "fm"
    assert fs.main(["--tiny", "--output-dir", str(out), "--protocol", "from_mlm", "--arms", "mlm,retromae@43",
                    "--seeds", "42"]) == 0
    bert = next((out / "bert").glob("bert-*"))
    assert json.loads((bert / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    saved = json.loads((out / "from_mlm_checkpoint.json").read_text(encoding="utf-8"))
    assert sorted(saved["arms"]) == ["mlm", "retromae"]
    assert saved["arms"]["retromae"]["seeds"][0]["pretrain_seed"] == 43
    assert saved["arms"]["retromae"]["gain_over_control"] is None  # no shared (pre-training seed, seed) pair
    assert saved["arms"]["mlm"]["berts"] == saved["arms"]["retromae"]["berts"] == [fs.weights_digest(bert)]
    assert (out / "from_mlm_checkpoint_ledger" / "retromae_p43.phases.json").is_file()


def test_gpu_preset_fine_tunes_in_bf16_with_workers_and_the_tiny_one_in_fp32(fs, tmp_path, monkeypatch):
    """The `retromae finetune` command of the GPU preset carries `--bf16 true` (bf16 mixed precision) and DataLoader
    workers, which leave the fine-tuning's settings key as it was; the tiny preset's (CPU) carries neither, unless
    `--workers` asks."""
    commands = []

    def capture(command, args, log_file, timeout=None, **kwargs):
        commands.append((command, args))
        raise RuntimeError("captured")

    monkeypatch.setattr(fs, "run_cli", capture)
    flags = {}
    for preset in ([], ["--tiny"], ["--tiny", "--workers", "2"]):
        _, cfg = fs.settings(fs.parse_args(preset))
        with pytest.raises(RuntimeError, match="captured"):
            fs.finetune(tmp_path / "start", tmp_path / "data", tmp_path / "out", cfg, 42, tmp_path / "log")
        command, args = commands.pop()
        assert command == "finetune"
        flags[" ".join(preset)] = [args[args.index(f) + 1] if f in args else None
                                   for f in ("--bf16", "--dataloader_num_workers")]
    assert flags == {"": ["true", "2"], "--tiny": [None, None], "--tiny --workers 2": [None, "2"]}


def test_fine_tunings_start_first_and_a_finished_arm_runs_nothing(fs, tmp_path, monkeypatch):
    """run_arm: the pre-training, then the fine-tunings queued before the diagnostics (the pool starts them at once);
    an arm whose ledger holds every phase runs nothing, though its checkpoint is gone (another machine); a ledger
    short of one seed makes the checkpoint again and runs only that seed."""
    calls = []

    def fake_pretrain(arm, folder, args, logf, cfg):
        calls.append("pretrain")
        folder.mkdir(parents=True)
        (folder / fs.PRETRAIN_DONE).write_text("ok\n")
        return folder

    monkeypatch.setattr(fs, "pretrain", fake_pretrain)
    monkeypatch.setattr(fs, "weights_digest", lambda folder: "digest")
    monkeypatch.setattr(fs, "pretraining_record", lambda folder, cfg: calls.append("record") or {"steps": 3})
    monkeypatch.setattr(fs, "coverage", lambda model, data, out, cfg, p, logf: calls.append(f"coverage {p}") or {})
    monkeypatch.setattr(fs, "zero_shot", lambda model, data, out, cfg, logf: calls.append("zero-shot") or {})
    monkeypatch.setattr(fs, "finetune", lambda start, data, out, cfg, seed, logf: calls.append(f"finetune {seed}")
                        or {"dev": {"ndcg_at_10": 0.5}})
    _, cfg = fs.settings(fs.parse_args(["--tiny"]))
    cfg["parallel_seeds"] = 1  # one worker: the calls come in queue order
    out, ledger = tmp_path / "out", tmp_path / "ledger"
    run = lambda: fs.run_arm("mlm", out, ledger, tmp_path / "data", tmp_path / "init", tmp_path / "corpus", cfg, 3)  # noqa: E731

    run()
    assert calls == ["pretrain", "finetune 42", "finetune 43", "record", "coverage embeddings", "coverage lm_head",
                     "zero-shot"]
    calls.clear()
    shutil.rmtree(out)
    run()
    assert calls == []
    done = json.loads((ledger / "mlm.phases.json").read_text(encoding="utf-8"))
    (ledger / "mlm.phases.json").write_text(json.dumps({k: v for k, v in done.items() if not k.endswith("s43")}))
    run()
    assert calls == ["pretrain", "finetune 43"]


def test_an_arms_wall_time_counts_phases_side_by_side_once(fs):
    """wall_s: the union of the phases' spans. Two 100 s fine-tunings side by side after a 50 s pre-training are
    150 s, a phase in a later call adds its own 10 s and not the hour between, and an entry without a finish time
    adds its seconds."""
    done = {"pretrain": {"seconds": 50.0, "finished": "2026-11-26T10:00:50+00:00"},
            "finetune_a_s42": {"seconds": 100.0, "finished": "2026-11-26T10:02:30+00:00"},
            "finetune_a_s43": {"seconds": 90.0, "finished": "2026-11-26T10:02:20+00:00"},
            "finetune_a_s44": {"seconds": 10.0, "finished": "2026-11-26T11:00:10+00:00"},
            "command": {"seconds": 2.0}}
    assert fs.wall_seconds(done) == 150.0 + 10.0 + 2.0
    ledger = {**arm_ledger("mlm", {42: 0.4}), **done}  # its entries have no finish time: their seconds add
    loose = sum(e["seconds"] for e in ledger.values() if "finished" not in e)
    assert fs.arm_record(ledger, "mlm")["wall_s"] == 160.0 + loose


def test_from_mlm_report_pairs_each_arm_with_the_control_over_both_seeds(fs, tmp_path):
    """from_mlm_checkpoint.json: per variant its rows over pre-training seeds (`arm_pSEED` ledgers), the mean ± std
    over all and per pre-training seed, the gain over MLM only paired on (pre-training seed, seed), and the same
    variant's gain from random initialisation (from_scratch.json); the BERT's own ledger is not an arm."""
    ledger = tmp_path / "from_mlm_checkpoint_ledger"
    ledger.mkdir()
    fs.write_json(ledger / "bert.phases.json", {"pretrain": {"key": "k", "result": "out/bert"}})
    fs.write_json(ledger / "mlm.phases.json", arm_ledger("mlm", {42: 0.30, 43: 0.32}))
    fs.write_json(ledger / "mlm_p43.phases.json", arm_ledger("mlm", {42: 0.31, 43: 0.29}))
    fs.write_json(ledger / "retromae.phases.json", arm_ledger("retromae", {42: 0.40, 43: 0.43}))
    fs.write_json(ledger / "retromae_p43.phases.json", arm_ledger("retromae", {42: 0.41, 43: 0.42}))
    fs.write_json(ledger / "dupmae.phases.json", arm_ledger("dupmae", {42: 0.35}, fs.VARIANTS["dupmae"]))
    fs.write_json(tmp_path / "from_scratch.json", {"versus_mlm": [
        {"label": fs.LABELS["retromae"], "ndcg@10_diff_mean": 0.07}]})
    _, cfg = fs.settings(fs.parse_args(["--seeds", "42,43"]))
    fs.report_from_mlm(tmp_path, ledger, cfg, {"preset": "gpu", "command": "c", "date": "d"})
    saved = json.loads((tmp_path / "from_mlm_checkpoint.json").read_text(encoding="utf-8"))
    assert sorted(saved["arms"]) == ["dupmae", "dupmae_hybrid", "mlm", "retromae"]
    retromae = saved["arms"]["retromae"]
    assert [(r["pretrain_seed"], r["seed"]) for r in retromae["seeds"]] == [(42, 42), (42, 43), (43, 42), (43, 43)]
    assert retromae["ndcg@10"] == pytest.approx(0.415)
    assert retromae["by_pretrain_seed"]["43"]["ndcg@10"] == pytest.approx(0.415)
    gain = retromae["gain_over_control"]  # pairs: 0.10, 0.11, 0.10, 0.13
    assert gain["pairs"] == 4 and gain["mean"] == pytest.approx(0.11) and gain["paired_p"] < 0.01
    assert retromae["gain_from_scratch"] == pytest.approx(0.07)
    assert saved["arms"]["mlm"]["gain_over_control"] is None and saved["arms"]["dupmae"]["gain_from_scratch"] is None
    assert saved["arms"]["dupmae_hybrid"]["gain_over_control"]["pairs"] == 1  # one pair: no test
    assert saved["arms"]["dupmae_hybrid"]["gain_over_control"]["paired_p"] is None
    assert set(saved["environment"]) == {"device_name", "commit", "date"}
    assert "+0.1100 over 4 pairs" in (tmp_path / "from_mlm_checkpoint.md").read_text(encoding="utf-8")


def test_from_mlm_arms_name_a_second_pretraining_seed(fs):
    _, cfg = fs.settings(fs.parse_args([]))
    assert fs.parse_arm("retromae", cfg) == ("retromae", cfg["pretrain_seed"], "retromae")
    assert fs.parse_arm("retromae@43", cfg) == ("retromae", 43, "retromae_p43")
