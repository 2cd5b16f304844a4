"""DeepSpeed ZeRO-2 and ZeRO-3 on the CPU: `retromae pretrain --deepspeed configs/deepspeed-zeroN.json` under
torchrun with 2 processes (DeepSpeed's CPU accelerator, `DS_ACCELERATOR=cpu`, on gloo), through the HF Trainer and
accelerate as a user runs it, compared with the same run under plain DDP: the per-step losses, the checkpoint's, the
final save's and the export's weights (every row of the word embeddings), and a resume from the checkpoint.

Every run starts the CLI in two fresh processes (about 20 s each on two cores), so those comparisons are `long`.
The gather and the divergence check are also driven directly, on a model `deepspeed.initialize` partitions in two
gloo processes (`test_sharding.in_two_processes`)."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ..builders import pretrain_args
from ..conftest import _run_cli_in_two_processes  # the fixture's function: the DDP runs are module-scoped
from .test_sharding import in_two_processes, minilm_tokenizer, tiny_retromae

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="deepspeed is not installed (pip install deepspeed; on the CPU it runs "
                                            "with DS_ACCELERATOR=cpu)")
VOCAB = 30522  # tiny_bert keeps the real vocabulary: each ZeRO-3 process holds about half of its rows
PORTS = {"ddp": 29561, "zero2": 29563, "zero3": 29565}  # apart from the other tests' (29517-29541)


def train_and_resume(run_cli, tiny_bert, corpus, folder: Path, engine: str, method: str = "retromae",
                     port: int | None = None, resume: bool = True, method_options: str = "{}") -> Path:
    """`folder/run`: 4 steps of `method`, checkpoints at 2 and 4, the export; `folder/resumed` (with `resume`):
    checkpoint-2 resumed to step 4. The runs use `port` and `port + 1` (default: the engine's)."""
    flags = ["--method", method, "--method-options", method_options]
    if engine != "ddp":
        flags += ["--deepspeed", str(CONFIGS / f"deepspeed-{engine}.json")]
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    port = port or PORTS[engine]
    result = run_cli(pretrain_args(tiny_bert, corpus, folder / "run", *flags), port, env)
    assert result.returncode == 0, result.stderr[-3000:]
    if not resume:
        return folder
    (folder / "resumed").mkdir()
    shutil.copytree(folder / "run" / "checkpoint-2", folder / "resumed" / "checkpoint-2")
    result = run_cli(pretrain_args(tiny_bert, corpus, folder / "resumed", *flags, "--resume-from-checkpoint", "last"),
                     port + 1, env)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


def step_losses(checkpoint: Path) -> dict[int, dict[str, float]]:
    """Each logged step's loss and its parts (every `*_loss` the method logs)."""
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: {k: v for k, v in entry.items() if k == "loss" or k.endswith("_loss")}
            for entry in history if "loss" in entry}


def max_difference(ours: Path, reference: Path) -> float:
    """The largest absolute difference between two safetensors files of the same tensors (every row present)."""
    mine, theirs = load_file(ours), load_file(reference)
    assert mine.keys() == theirs.keys(), sorted(mine.keys() ^ theirs.keys())
    for name, tensor in mine.items():
        assert tensor.shape == theirs[name].shape, (name, tensor.shape, theirs[name].shape)
    return max(float((tensor - theirs[name]).abs().max()) for name, tensor in mine.items())


def deepspeed_on_gloo():
    """DeepSpeed with its CPU accelerator and plain gloo collectives. Left alone, the CPU accelerator JIT-compiles a
    shared-memory allreduce (a C++ build of a minute or more on a fresh machine) whose waits spin: under the test
    suite's load one test took 113 s instead of 14."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # read by deepspeed.comm when it starts
    return deepspeed


def zero3_gather_and_divergence(rank: int, folder: Path) -> dict:
    """A tiny RetroMAE partitioned by `deepspeed.initialize` (ZeRO-3): what each process holds, the gathered state
    dict and the export from it against the unpartitioned weights, then a NaN in rank 1's slice of the word
    embeddings only."""
    deepspeed = deepspeed_on_gloo()
    from retromae.trainers.export.sentence_transformer import export_from_model
    from retromae.trainers.training.divergence import divergence_on_any_process
    from retromae.trainers.training.sharding import full_state_dict, is_sharded

    model = tiny_retromae()
    reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
    embeddings = model.bert.embeddings.word_embeddings.weight
    result = {"sharded": is_sharded(model), "placeholder_rows": embeddings.data.numel(),
              "local_values": embeddings.ds_tensor.numel()}
    gathered = full_state_dict(model)  # every process: a collective
    result["gathered_keys"] = len(gathered)
    if rank == 0:
        export_from_model(model, minilm_tokenizer(), folder / "export", state_dict=gathered)
        exported = load_file(folder / "export" / "model.safetensors")
        result.update(missing=sorted(reference.keys() - gathered.keys()), extra=sorted(gathered.keys() - reference.keys()),
                      unequal=sorted(k for k in reference.keys() & gathered.keys()
                                     if not torch.equal(gathered[k], reference[k])),
                      exported_rows=exported["embeddings.word_embeddings.weight"].shape[0],
                      exported_unequal=sorted(k for k, v in exported.items() if not torch.equal(v, reference[f"bert.{k}"])))
    bias = model.bert.encoder.layer[0].intermediate.dense.bias  # 37 values: rank 1 holds 18 and one of padding
    result["bias_values"] = bias.ds_tensor.numel()
    if rank == 1:
        with torch.no_grad():
            bias.ds_tensor[-1] = float("nan")  # DeepSpeed leaves the padding uninitialised: any value may lie there
    result["finite"] = divergence_on_any_process(model, [])
    if rank == 1:
        with torch.no_grad():
            embeddings.ds_tensor[0] = float("nan")
    result["nan"] = divergence_on_any_process(model, [{"loss": float("nan"), "step": 3}])
    engine.destroy()
    return result


@needs_deepspeed
def test_zero3_weights_are_gathered_whole_and_a_nan_in_one_slice_stops_both(tmp_path):
    """Under ZeRO-3 each parameter's `data` is an empty placeholder and each process holds half of its values:
    `full_state_dict` gives rank 0 every tensor of the unpartitioned model, bit-identical (before: the
    placeholders, no rows at all), the export from it writes all 30,522 rows, and the divergence check reads each
    process's slice without its padding (before: the empty placeholders, so a NaN went unseen)."""
    ranks = in_two_processes(zero3_gather_and_divergence, tmp_path)
    assert all(r["sharded"] and r["placeholder_rows"] == 0 for r in ranks)
    assert [r["local_values"] for r in ranks] == [VOCAB * 32 // 2] * 2
    assert ranks[1]["gathered_keys"] == 0
    main_rank = ranks[0]
    assert main_rank["missing"] == main_rank["extra"] == main_rank["unequal"] == []
    assert main_rank["exported_rows"] == VOCAB and main_rank["exported_unequal"] == []
    assert [r["bias_values"] for r in ranks] == [19, 19]
    assert [r["finite"] for r in ranks] == [None, None]  # before: a NaN in the padding stopped the run at random
    assert ranks[1]["nan"] == "1 weight tensor(s) are NaN or infinite, the logged losses first at step 3"
    assert ranks[0]["nan"] == "the weights of 1 other process(es) are NaN or infinite"


def built_under_zero3_and_unsharded(rank: int, folder: Path) -> dict:
    """Each way `pretrain` builds a model that edits weights after building, from the same seed with a ZeRO-3 config
    live (transformers builds inside `deepspeed.zero.Init`, partitioned) and without: the largest difference of the
    gathered weights, on rank 0."""
    from types import SimpleNamespace

    from retromae.modeling.modeling_retromae import RetroMAEForPretraining
    from retromae.trainers.methods import get_method
    from retromae.trainers.training.pretraining import scratch_model
    from retromae.trainers.training.sharding import full_state_dict
    from transformers import set_seed
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    deepspeed = deepspeed_on_gloo()
    deepspeed.init_distributed(dist_backend="gloo")
    bases = json.loads((folder / "bases.json").read_text())
    ways = {
        "copy_last_layer": lambda: RetroMAEForPretraining.from_encoder_checkpoint(bases["bert"],
                                                                                  decoder_init="copy_last_layer"),
        "modernbert_head": lambda: RetroMAEForPretraining.from_encoder_checkpoint(bases["modernbert"]),
        "from_scratch": lambda: scratch_model(bases["bert"], get_method("retromae"), {}, None,
                                              SimpleNamespace(config_overrides=None, tokenizer=None), None),
    }
    result = {}
    for way, build in ways.items():
        set_seed(7)
        unsharded = build().state_dict()
        zero3 = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
        set_seed(7)
        gathered = full_state_dict(build())  # every process: a collective
        unset_hf_deepspeed_config()
        del zero3
        if rank == 0:
            assert gathered.keys() == unsharded.keys(), way
            result[way] = max(float((gathered[k] - v).abs().max()) for k, v in unsharded.items())
    return result


@needs_deepspeed
def test_zero3_builds_the_weights_an_unsharded_run_builds(tiny_bert, tiny_modernbert, tmp_path):
    """Under ZeRO-3 a model is built partitioned, each process holding empty placeholders. The edits after building
    now gather what they read and write: the decoder copied from the encoder's last layer (before: the copy read
    placeholders, the decoder stayed random, 0.11 off) and a ModernBERT base's MLM head (before: 0.09 off). A
    `--from-scratch` model is built unpartitioned (before: zero.Init drew other weights from the same seed, 0.14 off)."""
    (tmp_path / "bases.json").write_text(json.dumps({"bert": str(tiny_bert), "modernbert": str(tiny_modernbert)}))
    assert in_two_processes(built_under_zero3_and_unsharded, tmp_path)[0] == {
        "copy_last_layer": 0.0, "modernbert_head": 0.0, "from_scratch": 0.0}


def methods_train_under_zero3(rank: int, folder: Path) -> dict:
    """Three SGD steps of each method's tiny model on one batch, unsharded and partitioned by
    `deepspeed.initialize` (ZeRO-3; both processes see the batch, so the averaged gradient is that batch's): the
    per-step losses and the largest difference of the gathered weights after the steps, on rank 0."""
    deepspeed = deepspeed_on_gloo()
    from retromae.trainers.training.sharding import full_state_dict

    from ..builders import masked_batch
    from .test_sharding import method_models

    # SGD: a step is linear in the gradient (AdamW divides by its root, which turns float noise in a near-zero
    # gradient into a step of the learning rate's size)
    SGD = functools.partial(torch.optim.SGD, lr=0.1)
    config = {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}  # DeepSpeed clips at 1 unasked
    batch = masked_batch()
    result = {}
    for method, build in method_models().items():
        torch.manual_seed(0)
        model = build().eval()  # no dropout: both runs see the same numbers
        optimizer = SGD(model.parameters())
        plain = []
        for _ in range(3):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            plain.append(loss.item())
        reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        torch.manual_seed(0)
        model = build().eval()
        engine, *_ = deepspeed.initialize(model=model, optimizer=SGD(model.parameters()), config=config)
        zero3 = []
        for _ in range(3):
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
            zero3.append(loss.item())
        gathered = full_state_dict(model)  # every process: a collective
        engine.destroy()
        if rank == 0:
            result[method] = {"plain": plain, "zero3": zero3, "keys_equal": gathered.keys() == reference.keys(),
                              "worst": sorted((float((gathered[k] - v).abs().max()), k) for k, v in reference.items())[-4:],
                              "weights_max_diff": max(float((gathered[k] - v).abs().max())
                                                      for k, v in reference.items())}
    return result


@needs_deepspeed
def test_every_method_trains_under_zero3_as_unsharded(tmp_path):
    """RetroMAE, DupMAE, SEED and BoW under ZeRO-3, where each process holds part of every weight and the forward
    gathers a module's weights only inside that module: three optimizer steps give the unsharded losses and the
    unsharded weights (the tied MLM head and DupMAE's OT head read outside their modules' forward included)."""
    main_rank = in_two_processes(methods_train_under_zero3, tmp_path)[0]
    assert sorted(main_rank) == ["bow", "dupmae", "retromae", "seed"]
    for method, seen in main_rank.items():
        assert seen["zero3"] == pytest.approx(seen["plain"], rel=1e-5, abs=1e-6), method
        assert seen["plain"][0] != seen["plain"][-1], method  # the steps moved the weights
        assert seen["keys_equal"], method
        assert seen["weights_max_diff"] < 1e-6, (method, seen["worst"])  # measured: 6e-8; the steps move 1e-2


@pytest.fixture(scope="module")
def ddp_runs(tiny_bert, corpus, tmp_path_factory) -> Path:
    """The unsharded reference: the same two processes under DDP."""
    return train_and_resume(_run_cli_in_two_processes, tiny_bert, corpus, tmp_path_factory.mktemp("ddp"), "ddp")


@needs_deepspeed
@pytest.mark.long
@pytest.mark.parametrize("engine", ["zero2", "zero3"])
def test_deepspeed_trains_saves_exports_and_resumes_as_ddp(engine, ddp_runs, run_cli_in_two_processes, tiny_bert,
                                                           corpus, tmp_path):
    """ZeRO-2 shards the optimizer state and gradients, ZeRO-3 the weights too: the losses of every step, of the
    resumed steps as well, are DDP's within float rounding, and the checkpoint's, the final save's and the export's
    weights are whole (all 30,522 word-embedding rows) and DDP's within rounding. Before the ZeRO-3 gather, ZeRO-3
    was refused in one line (exit 2)."""
    ours = train_and_resume(run_cli_in_two_processes, tiny_bert, corpus, tmp_path, engine)
    reference = step_losses(ddp_runs / "run" / "checkpoint-4")
    assert sorted(reference) == [1, 2, 3, 4]
    for run in ("run", "resumed"):  # the resumed run's history: checkpoint-2's steps 1-2, then its own 3-4
        losses = step_losses(ours / run / "checkpoint-4")
        assert losses.keys() == reference.keys(), (run, sorted(losses))
        for step, values in losses.items():
            assert values == pytest.approx(reference[step], abs=1e-5), (run, step)  # measured: 2e-6 (float sums)
    for weights in ("run/checkpoint-2/model.safetensors", "run/model.safetensors", "run/encoder/model.safetensors",
                    "resumed/model.safetensors", "resumed/encoder/model.safetensors"):
        assert max_difference(ours / weights, ddp_runs / weights) < 1e-6, weights  # measured 6e-8; training moves 2e-4
    exported = load_file(ours / "run" / "encoder" / "model.safetensors")
    assert exported["embeddings.word_embeddings.weight"].shape == (VOCAB, 32)
    assert torch.isfinite(exported["embeddings.word_embeddings.weight"]).all()


@needs_deepspeed
@pytest.mark.long
@pytest.mark.parametrize(("method", "options", "port"), [("dupmae", '{"dense_dim": 16}', 29571), ("seed", "{}", 29576),
                                                     ("bow", "{}", 29581)])
def test_other_methods_train_resume_and_export_under_zero_as_ddp(method, options, port, run_cli_in_two_processes,
                                                                tiny_bert, corpus, tmp_path):
    """`retromae pretrain --method M --deepspeed configs/deepspeed-zero{2,3}.json` (2 processes): the losses of every
    step, trained and resumed, and the checkpoint's, final save's and export's weights equal DDP's within rounding,
    with every word-embedding row (a resume under DDP is bit-identical to the run, so DDP runs once). Before, DupMAE's
    export failed under ZeRO-3."""
    ddp = train_and_resume(run_cli_in_two_processes, tiny_bert, corpus, tmp_path / "ddp", "ddp", method, port,
                           resume=False, method_options=options)
    reference = step_losses(ddp / "run" / "checkpoint-4")
    assert sorted(reference) == [1, 2, 3, 4] and len(reference[1]) > 1, reference  # the method's parts are logged
    for engine, engine_port in (("zero3", port + 1), ("zero2", port + 3)):
        ours = train_and_resume(run_cli_in_two_processes, tiny_bert, corpus, tmp_path / engine, engine, method,
                                engine_port, method_options=options)
        for run in ("run", "resumed"):
            losses = step_losses(ours / run / "checkpoint-4")
            assert losses.keys() == reference.keys(), (engine, run, sorted(losses))
            for step, values in losses.items():
                assert values == pytest.approx(reference[step], abs=1e-5), (engine, run, step)
        for ours_weights, reference_weights in [("run/checkpoint-2", "run/checkpoint-2"), ("run", "run"),
                                                ("run/encoder", "run/encoder"), ("resumed", "run"),
                                                ("resumed/encoder", "run/encoder")]:
            difference = max_difference(ours / ours_weights / "model.safetensors",
                                        ddp / reference_weights / "model.safetensors")
            assert difference < 1e-6, (engine, ours_weights, difference)  # measured: 6e-8 (ZeRO-3)
        exported = load_file(ours / "run" / "encoder" / "model.safetensors")
        assert exported["embeddings.word_embeddings.weight"].shape == (VOCAB, 32), engine
