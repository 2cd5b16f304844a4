#!/bin/bash
# Issue 32's GPU part in one call of at most 8 minutes (benchmarks/device/README.md, "Throughput"): installs what the
# device lacks from the carried wheels, then, each stage under `timeout` and in order of importance, the bf16 table at
# BERT-base L=512, the official code side by side, the table at MiniLM L=512, the CUDA-only tests, the other length.
# Every result lands in $OUT as soon as its stage (or its (size, L)) is done, with the names it will have in
# benchmarks/results/; the log is $OUT/throughput.log; a summary is printed last.
#   DEVICE_SMOKE=1 benchmarks/device/throughput.sh   here, on CPU: the same stages with the --tiny presets (proves
#                                                    nothing about speed), CUDA-only parts skipped,
#                                                    $OUT=out/throughput_smoke
# Knobs: BUDGET (s, default 470), SBS_SIZES (official side by side, default base), EXTRA_LENGTHS (default 128),
# ATTN2 (a second attn_implementation of ours for base L=512, e.g. flash_attention_2; default none), WORKERS, ONLY
# (some stages, for a rerun: below).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib.sh
source benchmarks/device/lib.sh
init_run throughput tp
SBS_SIZES=${SBS_SIZES:-base}; EXTRA_LENGTHS=${EXTRA_LENGTHS:-128}; ATTN2=${ATTN2:-}
WORKERS=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}

echo "== workers=$WORKERS"
start_ours
TABLE=$OUT/pretrain_throughput_${SLUG}_bf16.json
SBS=$OUT/official_side_by_side_${SLUG}.json
# (no spaces in these paths: the option strings are split on spaces)
if [ "$SMOKE" = 1 ]; then
  PT="benchmarks/pretrain_throughput.py --tiny --table --merge --output $TABLE"
  SB="benchmarks/official_side_by_side.py --tiny --workers 2 --output $SBS"
else
  PT="benchmarks/pretrain_throughput.py --table --device cuda --batch-size 32 --steps 30 --burn-in 5 --merge"
  PT="$PT --output $TABLE"
  SB="benchmarks/official_side_by_side.py --device cuda --length 512 --batch-size 32 --workers $WORKERS --burn-in 5"
  SB="$SB --steps 28 --output $SBS"
fi

# ---- the stages, most important first (ONLY=key,key runs some: table_base, official, attn2, table_minilm, tests,
# extra; a rerun then merges the table into the copy of the first call's file in benchmarks/results/, if there) ----
if [ -n "${ONLY:-}" ] && [ -f "benchmarks/results/$(basename "$TABLE")" ]; then
  cp "benchmarks/results/$(basename "$TABLE")" "$TABLE" && echo "== merging into benchmarks/results/$(basename "$TABLE")"
fi
if [ "$SMOKE" = 1 ]; then
  want table_base && stage "bf16 table (tiny)" 150 $PY $PT
else
  want table_base && stage "bf16 table: base L=512" 150 $PY $PT --sizes base --lengths 512
fi
want official && stage "set-up: official env" 60 setup_official && \
  stage "official side by side: $SBS_SIZES" 200 $PY $SB --sizes "$SBS_SIZES" --official-site $W/official_site \
    --official-src .dev/official
if [ "$SMOKE" != 1 ]; then
  if [ -n "$ATTN2" ] && want attn2; then
    stage "bf16 table: base L=512, ours on $ATTN2" 120 $PY benchmarks/pretrain_throughput.py --table --device cuda \
      --batch-size 32 --steps 30 --burn-in 5 --sizes base --lengths 512 --attn-implementation "$ATTN2" \
      --output "$OUT/pretrain_throughput_${SLUG}_bf16_${ATTN2}.json"
  fi
  want table_minilm && stage "bf16 table: minilm L=512" 100 $PY $PT --sizes minilm --lengths 512
fi
# the tests that skip without CUDA: the skipif-marked tests of the test files that test for it
CUDA_TEST_FILES=$(grep -lE "not torch\.cuda\.is_available\(\)|requires_cuda" tests/*.py tests/*/*.py | tr '\n' ' ')
want tests && stage "CUDA-only tests ($CUDA_TEST_FILES)" 90 $PY -m pytest -q -rs -p no:cacheprovider \
  --continue-on-collection-errors -m "skipif and not experiment and not slow" $CUDA_TEST_FILES
if [ "$SMOKE" != 1 ] && [ -n "$EXTRA_LENGTHS" ] && want extra; then
  stage "bf16 table: base, minilm L=$EXTRA_LENGTHS" 150 $PY $PT --sizes base,minilm --lengths "$EXTRA_LENGTHS"
fi

# ---- summary ----
echo "== summary ($(( $(date +%s) - START )) s)"
printf '  %s\n' "${STATUS[@]}"
$PY - "$TABLE" "$SBS" <<'PY'
import json, sys
from pathlib import Path
table, sbs = (Path(p) for p in sys.argv[1:3])
if table.is_file():
    report = json.loads(table.read_text())
    env = report["environment"]
    print(f"{table.name}: {env['device_name']}, {env['dtype']}, batch {env['batch_size']}, "
          f"partial={report.get('partial')}")
    for r in report.get("rows", []):
        mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        goal = r.get("issue32_target")
        goal = f"  target >= {goal:g}: {'met' if r['ratio'] >= goal else 'MISSED'}" if goal else ""
        stretch = r.get("issue32_mfu_stretch")
        if stretch and r["mfu"] is not None:
            goal += f"; MFU stretch {stretch:.0%}: {'met' if r['mfu'] >= stretch else 'missed'}"
        print(f"  {r['size']:>6} L={r['length']:<4} {r['variant']:<9} {r['samples_per_s']:8.1f} samples/s  "
              f"x{r['ratio']:.2f}  MFU {mfu}{goal}")
if sbs.is_file():
    report = json.loads(sbs.read_text())
    print(f"{sbs.name}: partial={report.get('partial')}")
    for r in report["rows"]:
        print(f"  {r['size']:>6} L={r['length']:<4} official {r['official_samples_per_s']:.1f}  ours "
              f"{r['ours_samples_per_s']:.1f} samples/s  x{r['ratio']:.2f}  target >= 3: "
              f"{'met' if r['ratio'] >= 3 else 'MISSED'}")
PY
ls -la "$OUT"
[ "$SMOKE" = 1 ] && echo "DEVICE_SMOKE: the tiny presets on CPU prove only that the stages run; no number here" \
  "means anything"
exit 0
