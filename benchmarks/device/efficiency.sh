#!/bin/bash
# GPU efficiency in one call of at most 8 minutes (benchmarks/device/README.md, "Efficiency"): our step under its
# fast paths against stock and compiled HF MLM, where the step's time goes, and whether each path keeps eager mode's
# losses and gradients. Installs what the device lacks from the carried wheels (throughput_prep.sh stages them), then,
# each stage under `timeout` and in order of importance:
#   1. the target table, base L=512, batch $BATCH: every method under each path of $PATHS, stock HF MLM and HF MLM
#      under torch.compile with fused AdamW -> pretrain_throughput_<device>_bf16.json (a failure, e.g. out of
#      memory, reruns it at batch 32)
#   2. the step breakdown, base then MiniLM, L=512 -> step_breakdown_<device>.json (written after every row)
#   3. the fast paths against eager mode on the GPU (bf16, MiniLM) -> fast_path_check_<device>.json
#   4. the target table at MiniLM L=512, merged into the file of stage 1
#   5. (.dev/official carried) the official code side by side: training compute only (batches built in advance),
#      then data-fed with the official README's 6 workers -> official_side_by_side_<device>_{prebuilt,6w}.json
# Every result lands in $OUT as soon as it exists, with the name it will have in benchmarks/results/; the log is
# $OUT/efficiency.log; a summary is printed last.
#   DEVICE_SMOKE=1 benchmarks/device/efficiency.sh   here, on CPU: the same stages with the --tiny presets (proves
#                                                    nothing about speed), $OUT=out/efficiency_smoke
# Knobs: BUDGET (s, default 470), BATCH (default 64), PATHS, BREAKDOWN_PATHS and CHECK_PATHS (our fast-path sets,
# defaults below),
# ONLY (some stages: table, breakdown, check, minilm, official).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib.sh
source benchmarks/device/lib.sh
init_run efficiency eff
BATCH=${BATCH:-$([ "$SMOKE" = 1 ] && echo 2 || echo 64)}
# today's CUDA default against the cut-cross-entropy kernels (exact, filtered) on the same compiled layers
DEFAULT_PATH=pad_vocab+compile_layers+compile_loss+fused_adamw
PATHS=${PATHS:-$DEFAULT_PATH,cce+compile_layers+fused_adamw,cce_filtered+compile_layers+fused_adamw}
BREAKDOWN_PATHS=${BREAKDOWN_PATHS:-$DEFAULT_PATH}
# the exactness check of the paths not yet checked on a GPU, each alone (no compiled layers to blur it)
CHECK_PATHS=${CHECK_PATHS:-cce,cce_filtered}

echo "== batch=$BATCH paths=$PATHS breakdown paths=$BREAKDOWN_PATHS check paths=$CHECK_PATHS"
start_ours
TABLE=$OUT/pretrain_throughput_${SLUG}_bf16.json
PT="benchmarks/pretrain_throughput.py --table --paths $PATHS --compiled-baseline"
if [ "$SMOKE" = 1 ]; then
  RUN="--tiny"; BASE="--sizes tiny --lengths 64"; MINILM=$BASE; SMALL_BATCH=2
else
  RUN="--device cuda --steps 15 --burn-in 3"; BASE="--sizes base --lengths 512"; MINILM="--sizes minilm --lengths 512"
  SMALL_BATCH=32
fi

if want table; then
  stage "target table: base L=512, batch $BATCH" 200 $PY $PT $RUN $BASE --batch-size "$BATCH" --output "$TABLE"
  rc=$?
  if (( rc != 0 && rc != 124 && rc != 137 )); then  # failed (out of memory?), not out of time: a smaller batch
    BATCH=$SMALL_BATCH
    stage "target table: base L=512, batch $BATCH (the larger batch failed)" 150 $PY $PT $RUN $BASE \
      --batch-size "$BATCH" --output "$TABLE"
  fi
fi
PT_BREAKDOWN="benchmarks/pretrain_throughput.py --table --paths $BREAKDOWN_PATHS --compiled-baseline"
want breakdown && stage "step breakdown: base, MiniLM L=512" 150 $PY $PT_BREAKDOWN $RUN --breakdown --steps 5 --burn-in 3 \
  $([ "$SMOKE" = 1 ] && echo "$BASE" || echo "--sizes base,minilm --lengths 512") --batch-size "$BATCH" \
  --output "$OUT/step_breakdown_${SLUG}.json"
want check && stage "fast paths vs eager: MiniLM L=512" 90 $PY benchmarks/pretrain_throughput.py --paths "$CHECK_PATHS" \
  $RUN --check-paths $MINILM --batch-size 8 \
  --output "$OUT/fast_path_check_${SLUG}.json"
if want minilm && [ "$SMOKE" != 1 ]; then
  stage "target table: MiniLM L=512, batch $BATCH" 100 $PY $PT $RUN $MINILM --batch-size "$BATCH" --merge \
    --output "$TABLE"
fi
if want official && [ -d .dev/official/pretrain ]; then
  if [ "$SMOKE" = 1 ]; then
    SB="benchmarks/official_side_by_side.py --tiny"; SB6="--workers 2"
  else
    SB="benchmarks/official_side_by_side.py --device cuda --sizes base --length 512 --batch-size 32 --burn-in 5"
    SB="$SB --steps 28"; SB6="--workers 6"
  fi
  SB="$SB --official-site $W/official_site --official-src .dev/official"
  stage "set-up: official env" 60 setup_official && {
    stage "official side by side: prebuilt batches" 120 $PY $SB --feed prebuilt --workers 6 \
      --output "$OUT/official_side_by_side_${SLUG}_prebuilt.json"
    stage "official side by side: 6 workers" 120 $PY $SB $SB6 --output "$OUT/official_side_by_side_${SLUG}_6w.json"
  }
fi

echo "== summary ($(( $(date +%s) - START )) s)"
printf '  %s\n' "${STATUS[@]}"
$PY benchmarks/efficiency_summary.py "$OUT"
ls -la "$OUT"
[ "$SMOKE" = 1 ] && echo "DEVICE_SMOKE: the tiny presets on CPU prove only that the stages run; no number here" \
  "means anything"
exit 0
