#!/usr/bin/env bash
# device call 4: a real run (Multi30k, base-sized model, bf16) and nmt vs CTranslate2 on its weights
set -uo pipefail
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ct2site .whl/ctranslate2-*.whl
CUB=$(dirname "$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)")
mkdir -p /tmp/cu12 && ln -sf "$CUB/libcublas.so.13" /tmp/cu12/libcublas.so.12 && ln -sf "$CUB/libcublasLt.so.13" /tmp/cu12/libcublasLt.so.12
export LD_LIBRARY_PATH=/tmp/cu12:$CUB:${LD_LIBRARY_PATH:-}
make install > "$OUT/install.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/install.log"; }
RUN=runs/m30k_base
MODEL="--d-model 512 --d-ff 2048 --heads 8 --layers 6 --dropout 0.3" MINUTES=4 PRECISION=bf16 WARMUP=1000 LR=0.0005 \
  MAX_TOKENS=8192 SAVE_MIN=0.5 AVG=5 TRANSLATE_PRECISIONS=bf16 RUN_DIR=$RUN timeout 330 bash bench/multi30k.sh \
  > "$OUT/multi30k.log" 2>&1; echo "multi30k rc=$? at ${SECONDS}s"
grep -vE "━|^\s*$" "$OUT/multi30k.log" | grep -E "^==|BLEU|^runs|^done|^start|error" | tail -22
cp "$RUN/run/metrics.jsonl" "$OUT/metrics.jsonl"; cp "$RUN/run/config.json" "$OUT/config.json"
left=$((405 - SECONDS))
timeout $left .venv/bin/python bench/translate.py --device cuda --sections small --small-checkpoint "$RUN/run/averaged.pt" \
  --nmt fp16,bf16,fp32,fp16-top --ct2 float16,int8_float16,float32 --repeat 1 --profile > "$OUT/translate_trained.log" 2>&1
echo "translate bench rc=$? at ${SECONDS}s"
grep -E "^small|^  (nmt|CTranslate2|identical|BLEU)|^profile" "$OUT/translate_trained.log"
