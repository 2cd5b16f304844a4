"""The GPU-efficiency targets against the files of one efficiency call (benchmarks/device/efficiency.sh).

    python benchmarks/efficiency_summary.py FOLDER

FOLDER holds `pretrain_throughput_<device>_bf16.json` and, when their stages ran, `step_breakdown_<device>.json` and
`fast_path_check_<device>.json`. For each target the best path of the variant (highest samples/s) is reported,
with the path's name, and `met` or `MISSED`; a row the files lack is `not measured`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# (size, variant, figure, target): figures are `mfu`, `throughput_vs_hf_mlm`, `throughput_vs_hf_mlm_compiled`
TARGETS = (
    ("base", "enhanced", "mfu", 0.40), ("base", "enhanced", "throughput_vs_hf_mlm", 1.5),
    ("base", "enhanced", "throughput_vs_hf_mlm_compiled", 1.0), ("base", "dupmae", "mfu", 0.35),
    ("base", "seed", "mfu", 0.35), ("base", "bow", "mfu", 0.40), ("minilm", "enhanced", "mfu", 0.20),
)
COLLATION_TARGET = 0.03  # collation + masking share of the enhanced base step


def only_file(folder: Path, prefix: str) -> dict[str, Any] | None:
    files = sorted(folder.glob(f"{prefix}*.json"))
    return json.loads(files[0].read_text()) if files else None


def best_rows(table: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """The fastest row of each (size, variant) at L=512."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for row in table.get("rows", []):
        key = (row["size"], row["variant"])
        if row["length"] == 512 and (key not in best or row["samples_per_s"] > best[key]["samples_per_s"]):
            best[key] = row
    return best


def figure(value: float | None, name: str) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:.1f}%" if name == "mfu" else f"{value:.2f}x"


def summary_lines(folder: Path) -> list[str]:
    table = only_file(folder, "pretrain_throughput_")
    return (target_lines(table) if table else [f"no pretrain_throughput_*.json in {folder}"]) + side_lines(folder)


def target_lines(table: dict[str, Any]) -> list[str]:
    env = table["environment"]
    lines = [f"{env['device_name']}, torch {env['torch']}, transformers {env['transformers']}, batch "
             f"{env['batch_size']}, partial={table.get('partial')}"]
    best = best_rows(table)
    for size, variant, name, target in TARGETS:
        row = best.get((size, variant))
        if row is None:
            lines.append(f"  {size:>6} {variant:<9} {name:<29} not measured (target {figure(target, name)})")
            continue
        value = row.get(name)
        verdict = "n/a" if value is None else "met" if value >= target else "MISSED"
        lines.append(f"  {size:>6} {variant:<9} {name:<29} {figure(value, name):>7} (target {figure(target, name)}):"
                     f" {verdict}; path {'+'.join(row['path'])}")
    return lines


def side_lines(folder: Path) -> list[str]:
    """The collation target and the exactness checks, from the breakdown and check files when their stages ran."""
    lines = []
    breakdown = only_file(folder, "step_breakdown_")
    if breakdown is not None:
        rows = [r for r in breakdown["rows"] if r["size"] == "base" and r["variant"] == "enhanced"]
        if rows:
            fastest = min(rows, key=lambda r: r["ms_per_step"])
            share = fastest["collation_masking_share"]
            lines.append(f"  collation + masking, enhanced base step ({'+'.join(fastest['path'])}): {100 * share:.1f}%"
                         f" (target {100 * COLLATION_TARGET:.0f}%): {'met' if share <= COLLATION_TARGET else 'MISSED'}")
        differ = sorted({r["label"] for r in breakdown["rows"] if r.get("masks_equal_cpu") is False})
        checked = sum(r.get("masks_equal_cpu") is not None for r in breakdown["rows"])
        if checked:
            lines.append(f"  masks on the device vs the CPU's ({checked} rows): "
                         + ("all equal" if not differ else f"DIFFER: {', '.join(differ)}"))
    check = only_file(folder, "fast_path_check_")
    if check is not None:
        failed = [row["label"] for row in check["rows"] if not row["passed"]]
        lines.append(f"  fast paths vs eager ({len(check['rows'])} rows): "
                     + ("all passed" if not failed else f"FAILED: {', '.join(failed)}"))
    return lines


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    print("\n".join(summary_lines(Path(argv[0]))))


if __name__ == "__main__":
    main(sys.argv[1:])
