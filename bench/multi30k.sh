#!/usr/bin/env bash
# Real-data quality benchmark: Multi30k en->de on this machine under a fixed wall-time budget.
#   prepare (8000 joint BPE) -> train a small model for exactly $MINUTES minutes -> average the last $AVG
#   checkpoints -> translate valid and test (beam 4, length penalty 0.6) -> sacreBLEU with signature.
# Usage: bash bench/multi30k.sh   (env: SHARED, RUN_DIR, MINUTES, PRECISION, WARMUP, LR, MAX_TOKENS, AVG, SAVE_MIN,
#        MODEL (model options; default the small d_model 256 model), TRANSLATE_PRECISIONS,
#        STEPS (a fixed number of updates instead of MINUTES: the same model on a busy or slow machine),
#        TRAIN_EXTRA (more `nmt train` options, e.g. "--patience 10"), MODELS (the checkpoints translated))
# On a GPU, a base-sized model:
#   MODEL="--d-model 512 --d-ff 2048 --heads 8 --layers 6 --dropout 0.3" MINUTES=10 TRANSLATE_PRECISIONS="bf16 fp32" \
#   bash bench/multi30k.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NMT=${NMT:-.venv/bin/nmt}
SHARED=${SHARED:-../shared/data}
DATA=$SHARED/multi30k
OUT=${RUN_DIR:-runs/multi30k}
MINUTES=${MINUTES:-20}
PRECISION=${PRECISION:-bf16}
WARMUP=${WARMUP:-1000}
LR=${LR:-0.001}
MAX_TOKENS=${MAX_TOKENS:-4096}
AVG=${AVG:-5}
SAVE_MIN=${SAVE_MIN:-0.5}
MODEL=${MODEL:---d-model 256 --d-ff 1024 --heads 4 --layers 3 --dropout 0.1}
TRANSLATE_PRECISIONS=${TRANSLATE_PRECISIONS:-fp32 bf16}
TRAIN_EXTRA=${TRAIN_EXTRA:-}
MODELS=${MODELS:-checkpoint_last averaged}
STEPS=${STEPS:-}
if [ -n "$STEPS" ]; then
  STOP="--max-steps $STEPS"; SAVE="--save-every $((STEPS / 10))"; MINUTES="(fixed $STEPS updates)"
else
  STOP="--max-time $MINUTES"; SAVE="--save-every-minutes $SAVE_MIN"
fi
[ -f "$DATA/train.en" ] || { echo "error: $DATA/train.en not found; set SHARED=path/to/shared/data" >&2; exit 1; }
mkdir -p "$OUT"

echo "== prepare"
$NMT prepare custom --src-lang en --tgt-lang de --train "$DATA/train" --valid "$DATA/valid" --test "$DATA/test" \
  --vocab-size 8000 -o "$OUT/data"

echo "== train: $MODEL, ls 0.1, warmup $WARMUP, peak lr $LR,"
echo "   $MAX_TOKENS tokens/update, $PRECISION, $MINUTES minutes, checkpoint every $SAVE_MIN min, average last $AVG"
rm -rf "$OUT/run"
# shellcheck disable=SC2086
$NMT train "$OUT/data" -o "$OUT/run" --preset base $MODEL \
  --label-smoothing 0.1 --warmup "$WARMUP" --lr "$LR" --max-tokens "$MAX_TOKENS" --update-freq 1 \
  $STOP --precision "$PRECISION" $SAVE --keep-last "$AVG" \
  --average-last "$AVG" --valid-every 200 --no-resume $TRAIN_EXTRA

for split in valid test; do
  for model in $MODELS; do
    for prec in $TRANSLATE_PRECISIONS; do
      start=$(date +%s.%N)
      $NMT translate -m "$OUT/run/$model.pt" --beam 4 --lenpen 0.6 --precision $prec \
        < "$OUT/data/raw/$split.en" > "$OUT/$split.$model.$prec.de"
      secs=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
      echo "== $split, $model.pt, translate $prec (beam 4): ${secs}s wall for $(wc -l < "$OUT/data/raw/$split.en") sentences"
      $NMT score "$OUT/$split.$model.$prec.de" -r "$OUT/data/raw/$split.de"
    done
  done
done
python3 - "$OUT/run/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
train = [r for r in rows if r.get("kind") == "train"]
end = [r for r in rows if r.get("kind") == "end"][-1]
tps = sum(r["tgt_tokens_per_s"] for r in train[1:]) / max(1, len(train) - 1) if len(train) > 1 else float("nan")
print(f"== training: {end['step']} updates in {end['elapsed'] / 60:.1f} min, ~{tps:.0f} target tokens/s "
      f"(mean of logged intervals after the first), stopped by {end['stopped_by']}")
PY
