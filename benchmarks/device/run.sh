#!/bin/bash
# The three seeds of one arm of experiment v2 (ARM, default dupmae) side by side on one GPU; ledgers and logs copied to $OUT every 10 s.
set -uo pipefail
ARM=${1:-dupmae}
if ls .dev/c4/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .dev/c4/*.whl
fi
export PYTHONPATH=/tmp/site:/tmp/shim HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=5
python3 -c "import faiss; print('faiss', faiss.__version__)"
L=benchmarks/results/scifact_experiment_v2_ledger
for s in 42 43 44; do
  (cd /w$s/main && python3 benchmarks/scifact_experiment_v2.py --arms $ARM --seeds $s --no-references \
     > /w$s/run.log 2>&1; echo "rc $?" >> /w$s/run.log) &
done
save() {
  for s in 42 43 44; do
    cp /w$s/main/$L/$ARM.phases.json $OUT/phases$s.json 2>/dev/null
    { tail -c 100000 /w$s/run.log; echo "==== retromae log"; tail -c 400000 /w$s/main/out/scifact_experiment_v2/$ARM/log.txt; } > $OUT/log$s.txt 2>/dev/null
  done
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv,noheader >> $OUT/gpu.csv
}
while [ -n "$(jobs -rp)" ]; do sleep 10; save; done
save
cat /w42/run.log | tail -5; cat /w43/run.log | tail -3; cat /w44/run.log | tail -3
