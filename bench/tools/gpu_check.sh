#!/usr/bin/env bash
# The command line on one GPU: `nmt train --gpus 1` in bf16 and fp16 on the sample corpus, then
# `nmt translate --device cuda` in fp32/bf16/fp16 of the same checkpoint against the CPU's fp32 output, scored.
# Usage: bash bench/tools/gpu_check.sh   (env: NMT, CHECK_DIR, STEPS)
set -euo pipefail
cd "$(dirname "$0")/../.."
NMT=${NMT:-.venv/bin/nmt}
OUT=${CHECK_DIR:-runs/gpu_check}
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
$NMT prepare sample -o "$OUT/data" > /dev/null 2>&1
for prec in bf16 fp16; do
  echo "== nmt train --gpus 1 --precision $prec ($STEPS updates, tiny preset)"
  start=$(date +%s.%N)
  $NMT train "$OUT/data" -o "$OUT/run_$prec" --preset tiny --gpus 1 --precision "$prec" --max-steps "$STEPS" \
    --save-every $((STEPS / 5)) --average-last 5 --no-resume 2>&1 | grep -E "^(start|done|valid|error)|update $STEPS/" || true
  python3 - "$OUT/run_$prec" "$start" <<'PY'
import json, sys, time
rows = [json.loads(line) for line in open(sys.argv[1] + "/metrics.jsonl")]
train = [r for r in rows if r["kind"] == "train"]
end = [r for r in rows if r["kind"] == "end"][-1]
last = (f"last logged loss {train[-1]['loss']:.3f}, {train[-1]['tgt_tokens_per_s']:.0f} tgt tok/s" if train
        else "no train log line")
print(f"   {end['step']} updates, {end['overflows']} overflows, stopped by {end['stopped_by']}, "
      f"{time.time() - float(sys.argv[2]):.0f} s wall with start-up; {last}")
PY
done
test=$OUT/data/raw/test
for prec in bf16 fp16; do
  model=$OUT/run_$prec/averaged.pt
  $NMT translate -m "$model" --device cpu --precision fp32 < "$test.en" > "$OUT/$prec.cpu.fp32.de"
  for tprec in fp32 bf16 fp16; do
    start=$(date +%s.%N)
    $NMT translate -m "$model" --device cuda --precision "$tprec" < "$test.en" > "$OUT/$prec.cuda.$tprec.de"
    secs=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
    same=$(python3 -c "import sys; a=open(sys.argv[1]).read().splitlines(); b=open(sys.argv[2]).read().splitlines(); print(f'{sum(x == y for x, y in zip(a, b))}/{len(a)}')" \
      "$OUT/$prec.cpu.fp32.de" "$OUT/$prec.cuda.$tprec.de")
    bleu=$($NMT score "$OUT/$prec.cuda.$tprec.de" -r "$test.de" | awk 'NR==2 {print $2}')
    echo "== model trained in $prec, translate --device cuda --precision $tprec: BLEU $bleu, $same lines identical to CPU fp32, ${secs}s wall"
  done
  echo "   CPU fp32 BLEU: $($NMT score "$OUT/$prec.cpu.fp32.de" -r "$test.de" | awk 'NR==2 {print $2}')"
done
