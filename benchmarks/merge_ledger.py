"""Merge what an experiment-v2 arm ran on another machine into this checkout's ledger.

A lent GPU machine runs one repository copy per seed (`benchmarks/device/run.sh`), so each seed's ledger comes back
on its own. This takes the exports, fine-tunings and evaluations from those ledgers, marks each with the machine it
ran on (ledgers written before `Phases` recorded it lack that) and adds them to
`benchmarks/results/scifact_experiment_v2_ledger/ARM.phases.json`; the phases this checkout has already
(pre-training, coverage) stay as they are. `--as` files a
variant under another name (the base fine-tuned on the GPU is `none_h200`, beside the CPUs' `none`).

    python benchmarks/merge_ledger.py dupmae --hardware "..." phases42.json phases43.json phases44.json
    python benchmarks/merge_ledger.py none --as none_h200 --hardware "..." phases42.json ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import RESULTS_DIR, read_json, write_json

MERGED = ("export_", "finetune_", "evaluate_")


def renamed(name: str, arm: str, variant: str | None) -> str:
    """`finetune_none_s42` filed as `finetune_none_h200_s42` when `variant` is given."""
    for stage in ("finetune_", "evaluate_"):
        if variant and name.startswith(f"{stage}{arm}_s"):
            return f"{stage}{variant}_s{name[len(stage) + len(arm) + 2:]}"
    return name


def merge(target: dict, sources: list[dict], arm: str, variant: str | None, hardware: str, replace: bool) -> list[str]:
    """Add the sources' merged phases to `target`; returns the names added. The same phase from two sources must
    agree (the export every seed made), and a phase `target` holds already is replaced only with `replace`."""
    added: dict[str, dict] = {}
    for source in sources:
        for name, entry in source.items():
            if not name.startswith(MERGED):
                continue
            name, entry = renamed(name, arm, variant), {"hardware": hardware, **entry}
            if name in added:
                if added[name]["result"] != entry["result"] or added[name]["key"] != entry["key"]:
                    raise SystemExit(f"{name}: the sources disagree ({added[name]['result']} vs {entry['result']})")
                continue
            if name in target and not replace:
                raise SystemExit(f"{name} is in the ledger already; pass --replace to take the merged run's")
            added[name] = entry
    target.update(added)
    return sorted(added)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("arm")
    p.add_argument("sources", nargs="+", type=Path, help="the per-seed ledgers (ARM.phases.json) of the other machine")
    p.add_argument("--hardware", required=True, help="the machine they ran on, as the run's report names it")
    p.add_argument("--as", dest="variant", help="file the arm's fine-tunings under this variant name")
    p.add_argument("--replace", action="store_true", help="replace phases the ledger holds already")
    p.add_argument("--ledger", type=Path, default=RESULTS_DIR / "scifact_experiment_v2_ledger")
    args = p.parse_args(argv)
    file = args.ledger / f"{args.arm}.phases.json"
    target = read_json(file) if file.is_file() else {}
    names = merge(target, [read_json(s) for s in args.sources], args.arm, args.variant, args.hardware, args.replace)
    write_json(file, target)
    print(f"{file}: merged {len(names)} phases: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
