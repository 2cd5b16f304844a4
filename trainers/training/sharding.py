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
- `--save-on-each-node` with `--fsdp`: the whole weights are gathered on the main process only;
- `--eval-beir-folder` with `--fsdp` or `--deepspeed`: the retrieval validation encodes on the main process alone,
  and a sharded forward needs every process (a deadlock);
- `--deepspeed` with ZeRO stage 3 (weights partitioned; gathering them through DeepSpeed is not implemented), with
  the head warm-up (ZeRO partitions the gradients, so dropping the encoder's gradients would not freeze it), and the
  recipe's learning-rate groups with a DeepSpeed config that names its own optimizer (built with one rate, ignoring
  the groups).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.tensor import DTensor
from transformers.training_args import ParallelMode


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of `tensor`: a `DTensor`'s local shard (no communication), any other tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def is_sharded(model: nn.Module) -> bool:
    """Whether `model`'s parameters are sharded across processes (FSDP2 `DTensor`s, or FSDP1 flat parameters)."""
    return any(isinstance(param, DTensor) or type(param).__name__ == "FlatParameter" for param in model.parameters())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state dict with whole tensors. Unsharded: `model.state_dict()`, no communication. Sharded (FSDP):
    a collective, call it on every process; the main process (rank 0) gets every tensor whole, on the CPU, the others
    an empty dict (`torch.distributed.checkpoint.state_dict.get_model_state_dict`, full_state_dict, cpu_offload)."""
    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


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


def check_sharding(args: Any, *, validation: bool = False, head_warmup: bool = False,
                   recipe_groups: bool = False) -> None:
    """Refuse, in one line, a sharding option that would be ignored or would break the run (see the module's
    docstring). `args`: the TrainingArguments; `validation`: `--eval-beir-folder` is on; `head_warmup`: the recipe's
    head warm-up is on; `recipe_groups`: the recipe sets the optimizer's learning-rate groups."""
    fsdp, deepspeed = bool(getattr(args, "fsdp", None)), bool(getattr(args, "deepspeed", None))
    if fsdp and deepspeed:
        raise ValueError("--fsdp and --deepspeed cannot be combined: each shards the model its own way; choose one")
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
        config = deepspeed_config(args)
        stage = int((config.get("zero_optimization") or {}).get("stage", 0) or 0)
        if stage == 3:
            raise ValueError("--deepspeed with ZeRO stage 3 is not supported yet: it partitions the weights, and "
                             "retromae's final save, export and divergence check read whole weights, which it gathers "
                             "for FSDP only; use ZeRO stage 1 or 2, or --fsdp")
        if head_warmup:
            raise ValueError("--head-warmup-steps with --deepspeed is not supported: ZeRO partitions the gradients, "
                             "so the warm-up cannot hold the encoder still; use --fsdp or DDP, or drop "
                             "--head-warmup-steps")
        if recipe_groups and "optimizer" in config:
            raise ValueError("--encoder-lr-scale / --layer-lr-decay with a --deepspeed config that names an "
                             "optimizer: DeepSpeed builds it with one learning rate and ignores the recipe's groups; "
                             "remove the config's \"optimizer\" section (the Trainer's AdamW then carries them)")


__all__ = ["check_sharding", "deepspeed_config", "full_state_dict", "is_sharded", "local_tensor"]
