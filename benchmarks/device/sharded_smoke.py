"""The runs of benchmarks/device/sharded_smoke.sh and their summary.

  python -m torch.distributed.run --nproc_per_node 1 benchmarks/device/sharded_smoke.py run RESULT.json \\
      --engine fsdp --phase trained --output-dir DIR --export-dir DIR -- ARGS...
      one `retromae pretrain --output-dir DIR --export-dir DIR ARGS...` in this process, with the Trainer's
      samples/s and the peak GPU memory; the main process writes RESULT.json (also when the run is refused). When
      pretrain's own export refuses the sharded model (its caller did not pass the gathered weights), the final
      save is exported with `retromae export` and the record says so.
  python benchmarks/device/sharded_smoke.py summary OUT.json RESULT.json...
      the rows {engine, method, trained, resumed, export_max_abs_diff_vs_plain, export_rows_complete,
      peak_memory_gib, samples_per_s} against the plain engine's trained export, and the environment.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common

import common  # noqa: E402  (before torch: its environment defaults)

ERROR_PREFIX = "retromae "


class Tee(io.TextIOBase):
    """stderr as it is, keeping the lines a command refuses with (`retromae <command>: error: ...`)."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.refusals, self._line = stream, [], ""

    def write(self, text: str) -> int:
        self.stream.write(text)
        self._line += text
        *lines, self._line = self._line.split("\n")
        self.refusals += [line for line in lines if line.startswith(ERROR_PREFIX) and ": error: " in line]
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def run(options: argparse.Namespace, argv: list[str]) -> int:
    import torch
    from retromae.trainers.cli import main
    from retromae.trainers.training.trainer import RetroMAETrainer

    logged: dict[str, float] = {}
    original = RetroMAETrainer.log

    def log(self, logs, start_time=None):  # the Trainer's end-of-training metrics (train_samples_per_second, ...)
        logged.update({key: value for key, value in logs.items() if key.startswith("train_")})
        return original(self, logs, start_time)

    RetroMAETrainer.log = log
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    tee = Tee(sys.stderr)
    sys.stderr = tee
    started = time.time()
    try:
        code = main(["pretrain", "--output-dir", options.output_dir, "--export-dir", options.export_dir, *argv])
    finally:
        sys.stderr = tee.stream
    record = {
        "engine": options.engine, "phase": options.phase, "argv": argv, "exit": code,
        "wall_s": round(time.time() - started, 1), "errors": tee.refusals,
        "samples_per_s": logged.get("train_samples_per_second"),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "output_dir": options.output_dir, "export_dir": options.export_dir, "export_by": "pretrain",
    }
    if code != 0 and any("export_from_model got a sharded" in line for line in tee.refusals):
        record["export_by"] = f"retromae export (pretrain's own export refused: {tee.refusals[-1]})"
        if int(os.environ.get("RANK", "0")) == 0:
            record["export_exit"] = main(["export", options.output_dir, options.export_dir])
    if int(os.environ.get("RANK", "0")) == 0:
        common.write_json(Path(options.result), record)
    return code


def export_weights(folder: str) -> tuple[dict, int | None]:
    from safetensors.torch import load_file

    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        return {}, None
    config = json.loads((Path(folder) / "config.json").read_text())
    return load_file(str(path)), config.get("vocab_size")


def summary(out: str, results: list[str]) -> None:
    import torch

    records = [json.loads(Path(path).read_text()) for path in results]
    by = {(r["engine"], r["phase"]): r for r in records}
    reference, _ = export_weights(by.get(("plain", "trained"), {}).get("export_dir", ""))
    rows = []
    for engine in sorted(dict.fromkeys(r["engine"] for r in records), key=lambda name: name != "plain"):
        trained, resumed = by.get((engine, "trained"), {}), by.get((engine, "resumed"), {})
        diffs, complete = [], []
        for record in (trained, resumed):
            weights, vocab = export_weights(record.get("export_dir", "")) if record else ({}, None)
            rows_ = weights.get("embeddings.word_embeddings.weight")
            complete.append(None if rows_ is None else rows_.shape[0] == vocab)
            if weights and reference and weights.keys() == reference.keys():
                diffs.append(max(float((weights[k].float() - reference[k].float()).abs().max()) for k in weights))
            else:
                diffs.append(None)

        def outcome(record):
            if not record:
                return "not run"
            return "ok" if record["exit"] == 0 or record.get("export_exit") == 0 else (
                f"exit {record['exit']}: {record['errors'][-1] if record['errors'] else 'see the log'}")

        rows.append({
            "engine": engine, "method": os.environ.get("METHOD", "retromae"), "trained": outcome(trained),
            "resumed": outcome(resumed), "export_max_abs_diff_vs_plain": {"trained": diffs[0], "resumed": diffs[1]},
            "export_rows_complete": {"trained": complete[0], "resumed": complete[1]},
            "export_by": {"trained": trained.get("export_by"), "resumed": resumed.get("export_by")},
            "peak_memory_gib": trained.get("peak_memory_gib"), "samples_per_s": trained.get("samples_per_s"),
        })
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    environment = {**common.machine_facts(device), "hardware": common.hardware_summary(),
                   "smoke": os.environ.get("SMOKE") == "1"}
    for package in ("torch", "transformers", "accelerate", "safetensors"):
        environment[package] = __import__(package).__version__
    common.write_json(Path(out), {"environment": environment, "rows": rows, "runs": records})
    for row in rows:
        print(json.dumps(row))


def parse() -> None:
    argv = sys.argv[1:]
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run")
    one.add_argument("result")
    for flag in ("--engine", "--phase", "--output-dir", "--export-dir"):
        one.add_argument(flag, required=True)
    total = commands.add_parser("summary")
    total.add_argument("out")
    total.add_argument("results", nargs="+")
    options = parser.parse_args(argv)
    if options.command == "run":
        sys.exit(run(options, rest))
    summary(options.out, options.results)


if __name__ == "__main__":
    parse()
