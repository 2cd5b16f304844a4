#!/bin/bash
# Sharded pre-training on a lent GPU, one call of at most 8 minutes: `retromae pretrain` under torchrun
# (--nproc_per_node 1) on a MiniLM-size model (all-MiniLM-L6-v2's architecture, random weights: the carried
# .dev/tp/minilm holds its config and tokenizer only), $STEPS steps, plain, under FSDP2
# (--fsdp "full_shard auto_wrap", every BertLayer / TwoStreamBertLayer its own unit) and under DeepSpeed ZeRO-2 and
# ZeRO-3 (configs/deepspeed-zero{2,3}.json). Each engine: train with a
# checkpoint at $SAVE and the export at the end, then resume a copy of checkpoint-$SAVE to $STEPS and export again.
# The exports are compared with the plain run's (max abs difference, every word-embedding row present).
# Result: $OUT/sharded_smoke_<device>.json {environment, rows: [{engine, method, trained, resumed,
# export_max_abs_diff_vs_plain, export_rows_complete, export_by, peak_memory_gib, samples_per_s}], runs}; each run's
# record in $OUT/runs/ as soon as it ends; the log is $OUT/sharded_smoke.log.
#
#   bash benchmarks/device/sharded_smoke.sh                   on the GPU (carry .dev/tp: the wheels and MiniLM's config)
#   DEVICE_SMOKE=1 bash benchmarks/device/sharded_smoke.sh    here, on CPU, a tiny model: the plain runs train and
#       resume, the FSDP runs are refused (accelerate shards only on GPUs); proves only that the flow runs
# Knobs: BUDGET (s, default 470), STEPS (30), SAVE (20), METHOD (retromae), BATCH (32; smoke 4), FSDP_CONFIG
# (configs/fsdp-bert.json),
# ONLY (engines, comma-separated, of plain, fsdp, zero2, zero3; the summary compares with a plain export only when one exists in $OUT/runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib.sh
source benchmarks/device/lib.sh
init_run sharded_smoke shd
STEPS=${STEPS:-30}
SAVE=${SAVE:-20}
export METHOD=${METHOD:-retromae}
# the shipped preset: every BertLayer / TwoStreamBertLayer its own FSDP unit (a JSON file or inline JSON both work)
FSDP_CONFIG=${FSDP_CONFIG:-configs/fsdp-bert.json}
if [ "$SMOKE" = 1 ]; then
  BATCH=${BATCH:-4}
  SHAPE=(--max-seq-length 32 --config-overrides
         "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=37")
  PRECISION=(--use-cpu true)
  # DupMAE's default d' is the paper's 384, above the tiny model's hidden size of 32
  [ "$METHOD" = dupmae ] && SHAPE+=(--method-options '{"dense_dim": 16}')
else
  BATCH=${BATCH:-32}
  SHAPE=(--max-seq-length 128)
  PRECISION=(--bf16 true)
fi
start_ours
export SMOKE
mkdir -p "$W" "$OUT/runs"
$PY - "$W/corpus.txt" <<'PY'
import random, sys
words = ("retrieval dense sparse passage query encoder decoder masked token vector index corpus model train "
         "embedding sentence document relevant score rank negative positive batch layer attention").split()
rng = random.Random(0)
with open(sys.argv[1], "w") as f:
    for _ in range(4000):
        f.write(" ".join(rng.choice(words) for _ in range(rng.randint(12, 60))) + "\n")
PY
COMMON=(--model "$REPO/.dev/tp/minilm" --from-scratch true "${SHAPE[@]}" --corpus "$W/corpus.txt"
        --method "$METHOD" --max-steps "$STEPS" --save-steps "$SAVE" --logging-steps 10 --seed 7
        --per-device-train-batch-size "$BATCH" --disable-tqdm true --dataloader-num-workers 2 "${PRECISION[@]}")
FSDP=(--fsdp "full_shard auto_wrap" --fsdp_config "$FSDP_CONFIG")
PORT=$((29500 + RANDOM % 2000))
# one pretrain under torchrun: RESULT.json --engine E --phase P --output-dir D --export-dir D -- ARGS (sharded_smoke.py)
DRIVER=("$PY" -m torch.distributed.run --nproc_per_node 1 --master_port "$PORT" benchmarks/device/sharded_smoke.py run)

# ZeRO-2 / ZeRO-3 through the shipped presets; DeepSpeed comes from the carried wheel (.dev/tp/whl)
[ "$SMOKE" = 1 ] && export DS_ACCELERATOR=cpu
for engine in plain fsdp zero2 zero3; do
  flags=()
  [ "$engine" = fsdp ] && flags=("${FSDP[@]}")
  [[ "$engine" == zero* ]] && flags=(--deepspeed "configs/deepspeed-$engine.json")
  want "$engine" || continue
  rm -rf "${W:?}/$engine"
  stage "$engine: train $STEPS steps (checkpoint at $SAVE), export" 150 "${DRIVER[@]}" "$OUT/runs/${engine}_trained.json" \
    --engine "$engine" --phase trained --output-dir "$W/$engine/run" --export-dir "$W/$engine/export" -- \
    "${COMMON[@]}" "${flags[@]}"
  if [ -d "$W/$engine/run/checkpoint-$SAVE" ]; then
    mkdir -p "$W/$engine/resumed" && cp -r "$W/$engine/run/checkpoint-$SAVE" "$W/$engine/resumed/"
    stage "$engine: resume checkpoint-$SAVE to $STEPS, export" 120 "${DRIVER[@]}" "$OUT/runs/${engine}_resumed.json" \
      --engine "$engine" --phase resumed --output-dir "$W/$engine/resumed" --export-dir "$W/$engine/resumed_export" \
      -- "${COMMON[@]}" "${flags[@]}" --resume-from-checkpoint last
  else
    echo "== $engine: no checkpoint-$SAVE, nothing to resume"
  fi
done

echo "== summary ($(( $(date +%s) - START )) s)"
printf '  %s\n' "${STATUS[@]}"
ls "$OUT"/runs/*.json >/dev/null 2>&1 && $PY benchmarks/device/sharded_smoke.py summary \
  "$OUT/sharded_smoke_${SLUG}.json" "$OUT"/runs/*.json
ls -la "$OUT"
[ "$SMOKE" = 1 ] && echo "DEVICE_SMOKE: a tiny model on CPU, where --fsdp is refused; proves only that the flow runs"
exit 0
