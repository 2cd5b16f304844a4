"""Sharded training: whole weights for every save and export, and the sharding combinations retromae refuses.

Under FSDP2 (`torch.distributed.fsdp.fully_shard`, which accelerate applies for `--fsdp` on GPUs under torchrun) every
parameter is a `DTensor` holding one process's rows only: `model.state_dict()` on the main process is its share of
each matrix. `full_state_dict` gathers the whole tensors (a collective: every process calls it; the main process gets
them, on the CPU). What retromae has not made work under sharding is refused before training, in one line
(`check_sharding`), rather than accepted and ignored or run into a deadlock:

- `--fsdp` where accelerate would not shard: on the CPU (it trains plain DDP there, or refuses one process), or in a
  single process not started by torchrun / accelerate launch;
- FSDP1 (`--fsdp_config '{"version": 1}'`): the gathering and the head warm-up's freeze are written and tested for
  FSDP2 (transformers' default) only;
- `--save-on-each-node` with `--fsdp` or ZeRO-3: the whole weights are gathered on the main process only;
- `--eval-beir-folder` with `--fsdp` or `--deepspeed`: the retrieval validation encodes on the main process alone,
  and a sharded forward needs every process (a deadlock);
- `--deepspeed` with the head warm-up (ZeRO reduces and partitions each gradient during the backward pass, so
  dropping the encoder's gradients afterwards would not freeze it), the recipe's learning-rate groups with a
  DeepSpeed config that names its own optimizer (built with one rate, ignoring the groups), and, under ZeRO-3,
  `--extend-position-embeddings` (it would grow the table from partitioned placeholders);
- a DeepSpeed config without a batch size, or with values that disagree with the options (DeepSpeed and
  transformers refuse them on every process, after the model is built).

DeepSpeed ZeRO-3 partitions the weights too: each parameter's `data` is an empty placeholder and `ds_tensor` holds
this process's flat slice. `full_state_dict` gathers them module by module (`deepspeed.zero.GatheredParameters`, so
at most one module's weights are whole at a time, as DeepSpeed's own `_zero3_consolidated_16bit_state_dict`), and
needs no `stage3_gather_16bit_weights_on_model_save`. ZeRO-1/2 keep whole weights on every process.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from retromae.modeling.backbones import is_zero3_parameter
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from transformers.integrations import deepspeed as hf_deepspeed
from transformers.training_args import ParallelMode


def has_zero3_parameters(model: nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned `model`'s parameters."""
    return any(is_zero3_parameter(param) for param in model.parameters())


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of `tensor`, without communication: a `DTensor`'s local shard, the values of a ZeRO-3
    parameter's partition (its `data` is an empty placeholder), any other tensor itself."""
    if isinstance(tensor, DTensor):
        return tensor.to_local()
    if not is_zero3_parameter(tensor):
        return tensor
    # the last partitions of a size the world does not divide end in padding DeepSpeed leaves uninitialised
    partition = tensor.ds_tensor
    start = partition.numel() * torch.distributed.get_rank(group=tensor.ds_process_group)
    return partition.narrow(0, 0, min(partition.numel(), max(0, tensor.ds_numel - start)))


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are sharded across processes (FSDP2 `DTensor`s, FSDP1 flat parameters, or
    DeepSpeed ZeRO-3 partitions)."""
    return any(isinstance(param, DTensor) or type(param).__name__ == "FlatParameter" or is_zero3_parameter(param)
               for param in model.parameters())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state dict with whole tensors. Unsharded: `model.state_dict()`, no communication. Sharded (FSDP or
    ZeRO-3): a collective, call it on every process; the main process (rank 0) gets every tensor whole, on the CPU,
    the others an empty dict (FSDP: `torch.distributed.checkpoint.state_dict.get_model_state_dict`, full_state_dict,
    cpu_offload; ZeRO-3: `zero3_state_dict`)."""
    if not is_sharded(model):
        return model.state_dict()
    if has_zero3_parameters(model):
        return zero3_state_dict(model)
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def zero3_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole tensors of a ZeRO-3 model, keyed as `model.state_dict()` names them (a tied weight under each of its
    names), on the CPU of rank 0; {} elsewhere. A collective: every process walks the modules in the same order and
    gathers each module's own parameters, then releases them (`GatheredParameters`, modifier_rank None: read only)."""
    import deepspeed  # deepspeed.zero is an attribute of the package, not an importable module

    main = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    state: dict[str, torch.Tensor] = {}
    copies: dict[int, torch.Tensor] = {}  # one copy per parameter: save_pretrained finds tied weights by storage

    def visit(module: nn.Module, prefix: str) -> None:
        own = [param for param in module._parameters.values() if param is not None]
        with deepspeed.zero.GatheredParameters(own, modifier_rank=None):
            if main:
                for name, param in module._parameters.items():
                    if param is not None:
                        state[prefix + name] = copies.setdefault(id(param), param.detach().cpu().clone())
        if main:  # ZeRO-3 partitions parameters only: buffers are whole on every process
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent_buffers_set:
                    state[prefix + name] = buffer.detach().cpu().clone()
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{name}.")

    visit(model, "")
    return state


DEEPSPEED_DEFAULT_CLIPPING = 1.0  # what DeepSpeed clips the gradient norm at when its config names no value


def deepspeed_config(args: Any) -> dict[str, Any]:
    """The `--deepspeed` config of `args` (TrainingArguments): transformers' parsed copy when DeepSpeed is installed,
    else read from the dict, JSON text or file given; {} without `--deepspeed` or when it cannot be read."""
    parsed = getattr(getattr(args, "hf_deepspeed_config", None), "config", None)
    if isinstance(parsed, dict):
        return parsed
    given = getattr(args, "deepspeed", None)
    if isinstance(given, dict):
        return given
    if not isinstance(given, str) or not given:
        return {}
    try:
        text = Path(given).read_text(encoding="utf-8") if Path(given).is_file() else given
        config = json.loads(text)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def zero_stage(config: dict[str, Any]) -> int:
    """The ZeRO stage of a `--deepspeed` config (`deepspeed_config`; 0 for {})."""
    return int((config.get("zero_optimization") or {}).get("stage", 0) or 0)


def start_deepspeed_comm(args: Any) -> None:
    """Under ZeRO-3, `from_pretrained` builds the model already partitioned (`deepspeed.zero.Init`), which counts the
    processes through `deepspeed.comm`. On the CPU (`--use-cpu`) accelerate starts torch.distributed but not
    `deepspeed.comm`, so zero.Init would count one process and refuse the batch sizes transformers filled in for all:
    wrap the running process group (a no-op where accelerate already did, e.g. on GPUs)."""
    if zero_stage(deepspeed_config(args)) != 3 or not torch.distributed.is_initialized():
        return
    import deepspeed

    if not deepspeed.comm.is_initialized():
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())


def keep_loaded_names(model: nn.Module) -> None:
    """Under ZeRO-3 transformers' loading records every weight renaming it knows as applied (the legacy LayerNorm
    `gamma` / `beta` ones included), and each `save_pretrained` then reverts them: checkpoints of `LayerNorm.gamma`
    where the loaded model had `LayerNorm.weight`. Forget that record, so that saves keep the model's own names, as
    without ZeRO-3 (transformers then reverts only its non-legacy conversions). A model without ZeRO-3 parameters
    is left as it is."""
    if not has_zero3_parameters(model):
        return
    for module in model.modules():
        if getattr(module, "_weight_conversions", None) is not None:
            module._weight_conversions = None


@contextmanager
def without_zero3_init():
    """Build models unpartitioned while a ZeRO-3 run is configured, where transformers would build each inside
    `deepspeed.zero.Init`. For a load on the main process alone (DupMAE's export, the summary's example): zero.Init's
    partitioning is a collective, which would hang waiting for the others. For `--from-scratch`: under zero.Init the
    same seed draws other initial weights than an unsharded run. Without ZeRO-3: nothing changes."""
    kept = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = kept


def _check_deepspeed_config(args: Any, config: dict[str, Any]) -> None:
    """Refuse what DeepSpeed or transformers would refuse on every process after the model is built: no batch size,
    and values that disagree with the TrainingArguments (transformers lists them in `hf_deepspeed_config.mismatches`
    when it parses the config). The ZeRO section is checked before the TrainingArguments are built
    (`config_files.check_zero_section`)."""
    given = getattr(args, "deepspeed", None)
    source = (f"--deepspeed {given}" if isinstance(given, str) and not given.lstrip().startswith("{")
              else "the --deepspeed config")
    if "train_micro_batch_size_per_gpu" not in config and "train_batch_size" not in config:
        raise ValueError(f'{source} names no batch size; add "train_micro_batch_size_per_gpu": "auto" (the Trainer '
                         "fills it from --per-device-train-batch-size; the shipped presets have it)")
    mismatches = getattr(getattr(args, "hf_deepspeed_config", None), "mismatches", None)
    if mismatches:
        found = "; ".join(" ".join(line.lstrip("- ").split()) for line in mismatches)
        raise ValueError(f'{source} disagrees with the options ({found}); set those config values to "auto" (the '
                         "Trainer fills them in from the options) or change the options")


def check_sharding(args: Any, *, validation: bool = False, head_warmup: bool = False,
                   recipe_groups: bool = False, grow_positions: bool = False) -> None:
    """Refuse, in one line, a sharding option that would be ignored or would break the run (see the module's
    docstring). `args`: the TrainingArguments; `validation`: `--eval-beir-folder` is on; `head_warmup`: the recipe's
    head warm-up is on; `recipe_groups`: the recipe sets the optimizer's learning-rate groups; `grow_positions`:
    `--extend-position-embeddings` grows the loaded position table."""
    fsdp, deepspeed = bool(getattr(args, "fsdp", None)), bool(getattr(args, "deepspeed", None))
    if fsdp and deepspeed:
        raise ValueError("--fsdp and --deepspeed cannot be combined: each shards the model its own way; choose one")
    if getattr(args, "fsdp_config", None) and not fsdp:
        raise ValueError("--fsdp-config configures --fsdp, which this run does not set; add --fsdp true "
                         "(FSDP2, under torchrun on GPUs), or drop --fsdp-config")
    if fsdp or deepspeed:
        engine = "--fsdp" if fsdp else "--deepspeed"
        if validation:
            raise ValueError(f"--eval-beir-folder with {engine} is not supported: the retrieval validation encodes on "
                             "the main process alone, and a sharded model needs every process in each forward (it "
                             "would hang); drop --eval-beir-folder and score the saved checkpoints with `retromae "
                             "evaluate`")
    if fsdp:
        version = int((getattr(args, "fsdp_config", None) or {}).get("version", 2))
        if getattr(args.device, "type", "cpu") == "cpu":
            raise ValueError("--fsdp shards the model only on GPUs, and this run is on the CPU, where accelerate would "
                             "train plain DDP (or refuse a single process); drop --fsdp (torchrun gives DDP)")
        if args.parallel_mode != ParallelMode.DISTRIBUTED:
            raise ValueError("--fsdp needs a run started by torchrun or accelerate launch (one process per GPU); in "
                             "a single process it would not shard: launch with torchrun --nproc_per_node N")
        if version != 2:
            raise ValueError(f"--fsdp_config version {version} (FSDP1) is not supported: retromae gathers the "
                             "weights and freezes the encoder the FSDP2 way; use version 2 (the default)")
        if getattr(args, "save_on_each_node", False):
            raise ValueError("--save-on-each-node with --fsdp is not supported: the whole weights are gathered on the "
                             "main process only; drop --save-on-each-node")
    if deepspeed:
        if args.parallel_mode != ParallelMode.DISTRIBUTED:  # DeepSpeed would look for MPI, after the model is built
            raise ValueError("--deepspeed needs a run started by torchrun (or the deepspeed launcher); launch with "
                             "torchrun --nproc_per_node N -m retromae.trainers.cli pretrain ...")
        config = deepspeed_config(args)
        _check_deepspeed_config(args, config)
        stage = zero_stage(config)
        if head_warmup:
            raise ValueError("--head-warmup-steps with --deepspeed is not supported: ZeRO partitions the gradients, "
                             "so the warm-up cannot hold the encoder still; use --fsdp or DDP, or drop "
                             "--head-warmup-steps")
        if getattr(args, "save_on_each_node", False) and stage == 3:
            raise ValueError("--save-on-each-node with ZeRO stage 3 is not supported: the whole weights are gathered "
                             "on the main process only; drop --save-on-each-node")
        if grow_positions and stage == 3:
            raise ValueError("--extend-position-embeddings with ZeRO stage 3 is not supported: the table is grown "
                             "from the loaded rows, which ZeRO-3 has already partitioned (each process holds an empty "
                             "placeholder); grow it in a run without --deepspeed or with ZeRO stage 2")
        clip = getattr(args, "max_grad_norm", 1.0)
        if "gradient_clipping" not in config and clip != DEEPSPEED_DEFAULT_CLIPPING:
            raise ValueError(f"--max-grad-norm {clip} with a --deepspeed config without \"gradient_clipping\": "
                             f"DeepSpeed would clip at its default, {DEEPSPEED_DEFAULT_CLIPPING}; add "
                             "\"gradient_clipping\": \"auto\" to the config (the shipped presets have it)")
        if recipe_groups and "optimizer" in config:
            raise ValueError("--encoder-lr-scale / --layer-lr-decay with a --deepspeed config that names an "
                             "optimizer: DeepSpeed builds it with one learning rate and ignores the recipe's groups; "
                             "remove the config's \"optimizer\" section (the Trainer's AdamW then carries them)")


__all__ = ["check_sharding", "deepspeed_config", "full_state_dict", "has_zero3_parameters", "is_sharded",
           "keep_loaded_names", "local_tensor", "start_deepspeed_comm", "without_zero3_init", "zero3_state_dict",
           "zero_stage"]
