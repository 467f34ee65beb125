#!/usr/bin/env bash
# device call 3: tests on the GPU, train bench (eager), translate bench against CTranslate2, train bench (compile)
set -uo pipefail
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
mkdir -p ../shared && ln -sfn "$PWD/.carry/data" ../shared/data
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ct2site .whl/ctranslate2-*.whl
CUB=$(dirname "$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)")
mkdir -p /tmp/cu12 && ln -sf "$CUB/libcublas.so.13" /tmp/cu12/libcublas.so.12 && ln -sf "$CUB/libcublasLt.so.13" /tmp/cu12/libcublasLt.so.12
export LD_LIBRARY_PATH=/tmp/cu12:$CUB:${LD_LIBRARY_PATH:-}
echo "cublas 13 from $CUB, shimmed as .so.12 for CTranslate2"
make install > "$OUT/install.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/install.log"; }
timeout 200 .venv/bin/python -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda.py tests/test_train_loss.py \
  tests/test_train.py tests/test_docs.py -rfEs --tb=short > "$OUT/tests.log" 2>&1; echo "tests rc=$? at ${SECONDS}s"
grep -E "passed|failed|FAILED|ERROR|SKIPPED" "$OUT/tests.log" | tail -12
timeout 150 .venv/bin/python bench/train.py --sections base --seconds 8 --window 4 --profile big > "$OUT/train.log" 2>&1
echo "train bench rc=$? at ${SECONDS}s"; grep -E "^GPU |ms/update|updates on|^profile |failed" "$OUT/train.log"
timeout 230 .venv/bin/python bench/translate.py --device cuda --sections small,base --nmt fp32,bf16,fp16,fp16-top \
  --repeat 1 --ct2-site /tmp/ct2site --profile > "$OUT/translate.log" 2>&1
echo "translate bench rc=$? at ${SECONDS}s"; grep -vE "^ *(aten|cuda|void|Self|Name|---|[a-z_]+::)" "$OUT/translate.log" | grep -v "^$" | tail -40
left=$((565 - SECONDS))
timeout $left .venv/bin/python bench/train.py --sections base --presets big --gpu-max-tokens 25000 --compile \
  --seconds 8 --window 4 > "$OUT/compile.log" 2>&1; echo "compile bench rc=$? at ${SECONDS}s"; grep -E "ms/update|failed" "$OUT/compile.log"
