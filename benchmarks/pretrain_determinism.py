"""Pre-training determinism: does the same `retromae pretrain` command give bit-identical weights, and what breaks it?

Runs one short pre-training (all-MiniLM-L6-v2 on the built-in corpus, `--max-steps` steps, fixed seed) several times,
each in a fresh process: twice as it is, then once under each of these changes of the machine's arithmetic, made
through the environment so that nothing else changes:

- ``aten_avx2``: torch's own CPU kernels limited to AVX2 (``ATEN_CPU_CAPABILITY=avx2``), as on a CPU without AVX512;
- ``blas_avx2``: MKL and oneDNN limited to AVX2 (``MKL_ENABLE_INSTRUCTIONS``, ``DNNL_MAX_CPU_ISA``);
- ``one_thread``: ``OMP_NUM_THREADS=1`` instead of the machine's cores.

Each run's weights are hashed (the digest the SciFact ledger records) and compared with the first run's: equal bits,
or the largest absolute difference of any parameter. The experiment v2 ledger found pre-trainings made again in later
sessions not bit-identical; this shows which differences between machines are enough for that.

    python benchmarks/pretrain_determinism.py            # ~80 s on 2 CPU cores
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import common  # before torch: environment defaults
from common import RESULTS_DIR, log

VARIANTS: dict[str, dict[str, str]] = {
    "reference": {},
    "same_again": {},
    "aten_avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "blas_avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2"},
    "one_thread": {"OMP_NUM_THREADS": "1"},
}


def pretrain(output: Path, env: dict[str, str], steps: int) -> Path:
    args = ["--model", str(common.base_model_path()), "--output-dir", str(output), "--max-steps", str(steps),
            "--max-seq-length", "64", "--per-device-train-batch-size", "8", "--save-steps", "1000", "--seed", "42",
            "--report-to", "none", "--disable-tqdm", "true"]
    common.retromae_cli("pretrain", args, output.parent / f"{output.name}.log", env=env)
    return output


def compare(model: Path, reference: Path) -> dict:
    """`model`'s weights digest, and the largest difference of any parameter from `reference` (model folders)."""
    from safetensors.torch import load_file

    mine, theirs = (load_file(folder / "model.safetensors") for folder in (model, reference))
    largest = max((mine[k].float() - theirs[k].float()).abs().max().item() for k in theirs)
    return {"digest": common.weights_digest(model), "max_abs_difference": largest}


def render(report: dict) -> str:
    lines = ["| run | environment | weights digest | bit-identical to reference | largest difference of a parameter |",
             "|---|---|---|---|---|"]
    reference = report["runs"]["reference"]["digest"]
    for name, row in report["runs"].items():
        env = ", ".join(f"{k}={v}" for k, v in row["env"].items()) or "-"
        lines.append(f"| {name} | {env} | {row['digest']} | {'yes' if row['digest'] == reference else 'no'} | "
                     f"{row['max_abs_difference']:.3g} |")
    return "\n".join(lines) + f"\n\n{report['environment']['hardware']}; {report['steps']} steps of RetroMAE.\n"


def main() -> None:
    parser = common.argument_parser(__doc__)
    parser.add_argument("--steps", type=int, default=6, help="pre-training steps per run")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "pretrain_determinism.json")
    args = parser.parse_args()
    started = time.perf_counter()
    report = {"steps": args.steps, "environment": {"hardware": common.hardware_summary(), "date": common.utc_now(),
                                                   "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
              "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        reference = None
        for name, env in VARIANTS.items():
            log(f"{name} ...")
            model = pretrain(Path(tmp) / name, env, args.steps)
            reference = reference or model
            report["runs"][name] = {"env": env, **compare(model, reference)}
    common.finish_report(report, started, render, args.output)


if __name__ == "__main__":
    main()
