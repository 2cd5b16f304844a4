"""Side by side: the official RetroMAE pre-training code and ours, samples/s with collation included.

The official code is github.com/staoxiao/RetroMAE, ``src/pretrain`` (``pretrain.data.RetroMAECollator``,
``pretrain.modeling.RetroMAEForPretraining``), under transformers 4.44.2 in its own environment. It is not part of
this repository: ``benchmarks/device/official_setup.sh`` copies it into ``.dev/official/`` and installs that
environment (transformers 4.44.2, tokenizers 0.19.1, huggingface_hub 0.24.6) into its own ``--target`` folder.

Both sides, one after the other on the same device, same model size (random initialisation, vocabulary 30522), same
rows (the built-in corpus packed to exactly L tokens with the all-MiniLM-L6-v2 tokenizer; the official collator gets
each row without its first [CLS] and last [SEP] and adds them back), batch B, bf16 autocast with fp32 weights, AdamW
(lr 1e-4, weight decay 0.01), the same number of DataLoader workers (default: CPU cores - 2) with pinned memory:

- ``official``: ``RetroMAECollator(encoder_mlm_probability=0.3, decoder_mlm_probability=0.5)`` in the workers (its
  whole collation: 256 whole-word masks and an L x L decoder mask per row, in Python), its ``RetroMAEForPretraining``
  around a ``BertForMaskedLM`` (SDPA encoder, its own eager decoder layer). Run in a subprocess whose ``PYTHONPATH``
  holds only ``--official-site`` and ``--official-src`` (so transformers 4.44.2); ``datasets``, which the official
  ``data.py`` imports for a dataset class not used here, is replaced by an empty stand-in module.
- ``ours``: ``PretrainingCollator(mask_ratio=0.3).pad`` in the workers and ``mask_batch`` in the training process on
  the device, as ``RetroMAETrainer`` does; ``RetroMAEForPretraining`` with enhanced decoding, decoder_mask_ratio 0.5
  (``--attn-implementation``, default sdpa).

The HF Trainer is not used on either side (the official ``PreTrainer`` only changes logging and saving): each side
runs the same loop of forward, backward and AdamW step, so gradient clipping and the learning-rate schedule are left
out of both. No host sync inside the loop (the Trainer's loop has none either); the device is synchronised at the
window's ends. Timing: the first W batches (W workers: the first wave, worker start-up) and at least ``--burn-in``
steps are untimed; then a window of a multiple of W steps, so that with round-robin workers every worker delivers the
same number of batches inside it. samples/s = window steps x B / window seconds.

``--feed workers`` (the default) is a data-fed ratio: it depends on how many CPU cores collate for the GPU (the
official collator is Python). ``--feed prebuilt`` collates, masks and moves every batch to the device before the
window, so both sides time training compute only.

Writes ``benchmarks/results/official_side_by_side_<device>.json``: ``environment`` {device_name, dtype, date, ...}
and ``rows`` [{size, length, official_samples_per_s, ours_samples_per_s, ratio}], after every size (``partial``
true until the end). ``--tiny`` (a 64-wide 2-layer model, L=64, CPU, fp32: bf16 matmuls are slow on most CPUs) only
proves that both sides run.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

for _key, _value in (("OMP_WAIT_POLICY", "PASSIVE"), ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1"),
                     ("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1")):
    os.environ.setdefault(_key, _value)  # as common.py does; that module is not importable on the official side

import torch  # noqa: E402

VOCAB_SIZE = 30522
SHAPES: dict[str, dict[str, int]] = {
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128},
}
ENCODER_MASK, DECODER_MASK = 0.3, 0.5  # the official README's pre-training flags, our enhanced defaults


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------------
# The training loop both sides share
# ---------------------------------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, optimizer, batch: dict[str, torch.Tensor], device: torch.device, loss_of,
               bf16: bool) -> torch.Tensor:
    """forward (bf16 autocast, fp32 weights, or plain fp32) + backward + AdamW step; the detached loss."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = loss_of(model(**batch))
    loss.backward()
    optimizer.step()
    return loss.detach()


def window(workers: int, burn_in: int, steps: int) -> tuple[int, int]:
    """Untimed steps (at least one wave of W batches) and timed steps (a multiple of W, at least ``steps``)."""
    wave = max(workers, 1)
    return max(burn_in, wave), wave * math.ceil(steps / wave)


def time_loop(model, loader, prepare, loss_of, device: torch.device, args) -> dict[str, Any]:
    """Burn-in, then a timed window of steps, each fed by the DataLoader (collation included). ``loader_wait_s``:
    host time spent waiting for batches inside the window (near the window's length: the collation is the limit)."""
    untimed, timed = window(args.workers, args.burn_in, args.steps)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    losses, waits, start, started = [], [], time.perf_counter(), 0.0
    batches = iter(loader)
    for index in range(untimed + timed):
        if index == untimed:
            synchronize(device)
            started = time.perf_counter()
        tick = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            raise RuntimeError(f"the loader ran dry after {index} batches; {untimed + timed} needed")
        waits.append(time.perf_counter() - tick)
        losses.append(train_step(model, optimizer, prepare(batch), device, loss_of, args.dtype == "bf16"))
    synchronize(device)
    seconds = time.perf_counter() - started
    del batches  # shuts the workers down
    values = torch.stack(losses).float().cpu()
    if not torch.isfinite(values).all():
        raise RuntimeError(f"non-finite loss: {values.tolist()}")
    return {"samples_per_s": timed * loader.batch_size / seconds, "window_s": seconds, "timed_steps": timed,
            "untimed_steps": untimed, "burn_in_s": started - start, "loader_wait_s": sum(waits[untimed:]),
            "first_batch_s": waits[0], "first_loss": float(values[0]), "last_loss": float(values[-1])}


def make_loader(items: list[dict[str, Any]], collate, batch_size: int, workers: int, device: torch.device):
    return torch.utils.data.DataLoader(items, batch_size=batch_size, shuffle=False, collate_fn=collate,
                                       num_workers=workers, pin_memory=device.type == "cuda", drop_last=True)


class Prebuilt:
    """`count` batches for the timed loop, cycled from `distinct` batches collated, prepared and moved to the device
    in advance (``--feed prebuilt``): a step's compute depends on the batch's shape, not its tokens, and the official
    collator builds about 3 samples/s per worker, too slow to build every batch of a timed run."""

    def __init__(self, loader, prepare, count: int, distinct: int = 8):
        self.batches = [prepare(batch) for batch in itertools.islice(loader, min(count, distinct))]
        self.count, self.batch_size = count, loader.batch_size

    def __iter__(self):
        return itertools.islice(itertools.cycle(self.batches), self.count)


def feed(args, loader, prepare):
    """What `time_loop` iterates and the `prepare` it applies: the loader itself (``--feed workers``: collation
    timed), or every batch built in advance (``--feed prebuilt``: training compute only)."""
    if args.feed == "workers":
        return loader, prepare
    untimed, timed = window(args.workers, args.burn_in, args.steps)
    return Prebuilt(loader, prepare, untimed + timed), lambda batch: batch


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


def dataset_items(rows: list[dict[str, Any]], batch_size: int, workers: int, burn_in: int, steps: int) -> list:
    """Enough rows, cycled, for every step plus what the workers prefetch."""
    untimed, timed = window(workers, burn_in, steps)
    needed = (untimed + timed + 2 * max(workers, 1) + 1) * batch_size
    return [rows[i % len(rows)] for i in range(needed)]


# ---------------------------------------------------------------------------------------------------------------------
# The official side (its own interpreter: transformers 4.44.2)
# ---------------------------------------------------------------------------------------------------------------------


def stand_in_datasets() -> None:
    """An empty ``datasets`` module: the official data.py imports ``Dataset`` for a class this benchmark skips."""
    stub = types.ModuleType("datasets")
    stub.__spec__ = importlib.util.spec_from_loader("datasets", loader=None)
    stub.Dataset = object
    sys.modules["datasets"] = stub


def official_side(args) -> dict[str, Any]:
    stand_in_datasets()
    import transformers
    from pretrain.arguments import ModelArguments
    from pretrain.data import RetroMAECollator
    from pretrain.modeling import RetroMAEForPretraining
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    transformers.logging.set_verbosity_error()
    device, rows = torch.device(args.device), json.loads(Path(args.rows).read_text())
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    collator = RetroMAECollator(tokenizer, encoder_mlm_probability=ENCODER_MASK,
                                decoder_mlm_probability=DECODER_MASK, max_seq_length=args.length)
    examples = [{"token_ids": row["input_ids"][1:-1]} for row in rows]
    torch.manual_seed(args.seed)
    bert = BertForMaskedLM(BertConfig(vocab_size=VOCAB_SIZE, **SHAPES[args.size]))
    model = RetroMAEForPretraining(bert, ModelArguments(pretrain_method="retromae")).to(device).train()
    items = dataset_items(examples, args.batch_size, args.workers, args.burn_in, args.steps)
    loader = make_loader(items, collator, args.batch_size, args.workers, device)
    result = time_loop(model, *feed(args, loader, lambda b: to_device(b, device)), lambda out: out[0], device, args)
    return {**result, "transformers": transformers.__version__, "tokenizer_class": type(tokenizer).__name__,
            "encoder_attn_implementation": bert.config._attn_implementation}


# ---------------------------------------------------------------------------------------------------------------------
# Our side
# ---------------------------------------------------------------------------------------------------------------------


def our_model(size: str, mask_token_id: int, seed: int, attn: str):
    from retromae.modeling.configuration_retromae import RetroMAEConfig
    from retromae.modeling.modeling_retromae import RetroMAEForPretraining

    torch.manual_seed(seed)
    config = RetroMAEConfig(vocab_size=VOCAB_SIZE, **SHAPES[size], decoding="enhanced", decoder_mask_ratio=DECODER_MASK,
                            encoder_mask_ratio=ENCODER_MASK, mask_token_id=mask_token_id, attn_implementation=attn)
    return RetroMAEForPretraining(config)


def ours_side(args, size: str, tokenizer, rows: list[dict[str, Any]]) -> dict[str, Any]:
    from retromae.modeling.configuration_retromae import hides_whole_words
    from retromae.trainers.data.collator import UNMASKED_KEY, PretrainingCollator, masking_generator

    device = torch.device(args.device)
    collator = PretrainingCollator(tokenizer, mask_ratio=ENCODER_MASK, whole_word_mask=True)
    model = our_model(size, tokenizer.mask_token_id, args.seed, args.attn_implementation).to(device).train()
    generator, whole_words = masking_generator(args.seed, 0), hides_whole_words(model.config)

    def prepare(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:  # RetroMAETrainer._mask_inputs
        batch = to_device(batch, device)
        masked = collator.mask_batch(batch, generator)
        if whole_words:
            masked["decoder_word_starts"] = batch[UNMASKED_KEY]
        return masked

    items = dataset_items(rows, args.batch_size, args.workers, args.burn_in, args.steps)
    loader = make_loader(items, collator.pad, args.batch_size, args.workers, device)
    result = time_loop(model, *feed(args, loader, prepare), lambda out: out.loss, device, args)
    import transformers

    return {**result, "transformers": transformers.__version__, "attn_implementation": args.attn_implementation}


def packed_rows(tokenizer, length: int) -> list[dict[str, list[int]]]:
    """The built-in corpus packed to exactly ``length`` tokens (input_ids and word_starts), as pretrain_throughput."""
    import datasets
    from retromae.trainers.data.builtin import builtin_corpus
    from retromae.trainers.data.tokenize import tokenize_corpus

    datasets.disable_progress_bars()
    tokenized = tokenize_corpus(builtin_corpus(), tokenizer, max_seq_length=length, packing=True)
    rows = [{"input_ids": r["input_ids"], "word_starts": r["word_starts"]} for r in tokenized.to_list()
            if len(r["input_ids"]) == length]
    if not rows:
        raise SystemExit(f"the built-in corpus gave no full row of {length} tokens")
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# Driver (our environment): rows, the official subprocess, our side, the result file
# ---------------------------------------------------------------------------------------------------------------------


def run_official(args, size: str, rows_path: Path, tokenizer_path: str, workdir: Path) -> dict[str, Any]:
    """The official side in a fresh interpreter whose PYTHONPATH holds only its own environment."""
    part = workdir / f"official_{size}.json"
    command = [sys.executable, os.path.abspath(__file__), "--side", "official", "--size", size, "--rows",
               str(rows_path), "--tokenizer", tokenizer_path, "--part-out", str(part), *shared_flags(args)]
    paths = [str(Path(p).resolve()) for p in (args.official_site, args.official_src) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run(command, env=env, check=False, timeout=args.official_timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the official side failed (exit {done.returncode}); its log is above")
    return json.loads(part.read_text())


def shared_flags(args) -> list[str]:
    return ["--device", args.device, "--length", str(args.length), "--batch-size", str(args.batch_size),
            "--workers", str(args.workers), "--burn-in", str(args.burn_in), "--steps", str(args.steps),
            "--seed", str(args.seed), "--dtype", args.dtype, "--feed", args.feed]


def default_output(args, device_name: str) -> Path:
    import common

    if args.tiny:
        return common.ROOT / "out" / "official_side_by_side_tiny.json"
    slug = "cpu" if args.device == "cpu" else common.device_slug(device_name)
    return common.RESULTS_DIR / f"official_side_by_side_{slug}.json"


def environment(args, device: torch.device) -> dict[str, Any]:
    import common
    import transformers

    return {**common.machine_facts(device), "dtype": args.dtype, "torch": torch.__version__,
            "transformers_ours": transformers.__version__, "batch_size": args.batch_size, "length": args.length,
            "workers": args.workers, "burn_in": args.burn_in, "steps": args.steps, "tiny": args.tiny,
            "attn_implementation_ours": args.attn_implementation, "feed": args.feed}


def write(report: dict[str, Any], output: Path, partial: bool) -> None:
    import common

    common.write_json(output, {**report, "partial": partial})


def render(report: dict[str, Any]) -> str:
    env = report["environment"]
    fed = ("collation included" if env.get("feed", "workers") == "workers" else
           "batches built in advance: training compute only")
    lines = [f"## Official RetroMAE code vs ours — {env['device_name']}, {env['dtype']}, batch {env['batch_size']}, "
             f"{env['workers']} DataLoader workers, {fed} ({env['date']})", "",
             "| size | L | official samples/s | ours samples/s | ours / official |", "|---|---:|---:|---:|---:|"]
    for row in report["rows"]:
        lines.append(f"| {row['size']} | {row['length']} | {row['official_samples_per_s']:.1f} | "
                     f"{row['ours_samples_per_s']:.1f} | {row['ratio']:.2f} |")
    return "\n".join(lines)


def driver(args) -> None:
    import tempfile

    import common

    device = torch.device(args.device)
    report: dict[str, Any] = {"environment": environment(args, device), "rows": [], "details": {}}
    output = Path(args.output) if args.output else default_output(args, report["environment"]["device_name"])
    if args.tiny:
        log("--tiny: a 64-wide 2-layer model at L=64: this run proves only that both sides run, nothing else")
    tokenizer = common.load_tokenizer()
    rows = packed_rows(tokenizer, args.length)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rows_path = workdir / "rows.json"
        rows_path.write_text(json.dumps(rows))
        for size in args.size_list:
            log(f"{size} L={args.length}: official side ({len(rows)} distinct rows)")
            official = run_official(args, size, rows_path, str(common.base_model_path()), workdir)
            log(f"  official {official['samples_per_s']:.2f} samples/s; our side")
            ours = ours_side(args, size, tokenizer, rows)
            log(f"  ours {ours['samples_per_s']:.2f} samples/s")
            report["rows"].append({"size": size, "length": args.length,
                                   "official_samples_per_s": official["samples_per_s"],
                                   "ours_samples_per_s": ours["samples_per_s"],
                                   "ratio": ours["samples_per_s"] / official["samples_per_s"]})
            report["details"][size] = {"official": official, "ours": ours}
            write(report, output, partial=True)
    report["table_markdown"] = render(report)
    print(report["table_markdown"])
    write(report, output, partial=False)
    log(f"wrote {output}")
    if args.tiny:
        print("--tiny: this run proves only that both sides run; its numbers mean nothing.")


# ---------------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--official-site", default="/tmp/official_site",
                        help="folder holding transformers 4.44.2 and its needs (official_setup.sh)")
    parser.add_argument("--official-src", default=".dev/official", help="folder holding the official `pretrain`")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--sizes", default="base", help=f"comma-separated, from {','.join(SHAPES)}")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: autocast, fp32 weights")
    parser.add_argument("--workers", type=int, default=None, help="DataLoader workers of both sides (cores - 2)")
    parser.add_argument("--burn-in", type=int, default=5, help="untimed steps (at least one wave of W batches)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (rounded up to a multiple of W)")
    parser.add_argument("--attn-implementation", default="sdpa", help="our model's attn_implementation")
    parser.add_argument("--feed", choices=("workers", "prebuilt"), default="workers",
                        help="workers: the DataLoader feeds each step (collation timed); prebuilt: every batch is "
                             "collated, masked and on the device before the window (training compute only)")
    parser.add_argument("--official-timeout", type=float, default=None, help="seconds for the official subprocess")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None,
                        help="default results/official_side_by_side_<device>.json (--tiny: out/...)")
    parser.add_argument("--tiny", action="store_true",
                        help="proves nothing: 64-wide 2-layer model, L=64, batch 4, 2 workers, CPU, fp32")
    parser.add_argument("--side", choices=("official",), help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--part-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        args.sizes, args.length, args.batch_size, args.device, args.dtype = "tiny", 64, 4, "cpu", "fp32"
        args.workers = 2 if args.workers is None else args.workers
        args.burn_in, args.steps = min(args.burn_in, 2), min(args.steps, 2)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.workers = max((os.cpu_count() or 3) - 2, 1) if args.workers is None else args.workers
    args.size_list = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.size_list if s not in SHAPES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {list(SHAPES)}")
    if not 8 < args.length <= 512:
        parser.error("--length must lie in (8, 512] (BERT position embeddings)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.side == "official":
        result = official_side(args)
        Path(args.part_out).write_text(json.dumps(result))
        return
    driver(args)


if __name__ == "__main__":
    main()
