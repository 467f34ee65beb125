#!/usr/bin/env bash
# A GPU check in one run of ~9 minutes (docs/results.md, GPU): the CUDA tests, decoding against CTranslate2, training
# MFU (big and base, eager, with a profile of big), and a real Multi30k run of a base-sized model with early stopping
# in the time left (GPU_CHECK=1 runs bench/tools/gpu_check.sh instead). Each step writes its log to $OUT as it ends.
# For a machine without network, put the wheels and the data beside the checkout first:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl ctranslate2==4.8.5 sacremoses==0.1.1 setuptools==80.9.0 pytest-xdist==3.8.0 execnet==2.1.2 \
#     hypothesis==6.170.17 sortedcontainers==2.4.0 build==1.6.1 pyproject_hooks==1.2.0 langcodes==3.5.1
#   mkdir -p .carry/data && cp -r ../shared/data/multi30k ../shared/data/wmt14_newstest_ende .carry/data/
# then: OUT=DIR bash bench/tools/gpu_session.sh 2>&1 | tee DIR/summary.log   (BUDGET=seconds: 540 by default)
# Where a big update's time goes (eager, bf16: top kernels), ~2 minutes:
#   PYTHONUNBUFFERED=1 .venv/bin/python bench/train.py --sections base --presets big --gpu-max-tokens 25000 \
#     --seconds 8 --window 4 --profile big
# The compiled training benchmark (~5.5 minutes a preset: 12 shapes compiled first):
#   PYTHONUNBUFFERED=1 .venv/bin/python bench/train.py --sections base --presets big --compile-too \
#     --gpu-max-tokens 25000 --seconds 16 --window 8 [--compile-shapes dynamic: one compilation, no bucket padding]
set -uo pipefail
OUT=${OUT:-runs/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl
mkdir -p ../shared && { test -e ../shared/data || ln -sfn "$PWD/.carry/data" ../shared/data; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ct2site .whl/ctranslate2-*.whl
# CTranslate2's wheel is built for CUDA 12; the image has CUDA 13's cuBLAS, linked under the name it asks for
CUB=$(dirname "$(find / -xdev -name 'libcublas.so.13' 2>/dev/null | head -1)")
mkdir -p /tmp/cu12 && ln -sf "$CUB/libcublas.so.13" /tmp/cu12/libcublas.so.12 && ln -sf "$CUB/libcublasLt.so.13" /tmp/cu12/libcublasLt.so.12
export LD_LIBRARY_PATH=/tmp/cu12:$CUB:${LD_LIBRARY_PATH:-}
make install > "$OUT/install.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/install.log"; exit 1; }
echo "installed at ${SECONDS}s"
# 1. the CUDA tests, the CUDA-graph ones first (nothing else counts if they fail)
timeout 60 .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_cuda.py -k graph -rfEs --tb=short -x \
  > "$OUT/graph_tests.log" 2>&1; echo "graph tests rc=$? at ${SECONDS}s"; tail -15 "$OUT/graph_tests.log"
#    (SIGINT at the time limit: pytest still prints its failures; -v names each test as it ends; the torchrun test,
#    the slowest (it compiles), runs on its own after step 3)
XDIST=$(.venv/bin/python -c "import xdist" 2>/dev/null && echo "-n 4")  # pytest-xdist where the image has it
timeout -s INT -k 20 180 .venv/bin/python -m pytest -v $XDIST -p no:cacheprovider tests/test_cuda.py -k "not torchrun" \
  -rfEs --tb=short > "$OUT/cuda_tests.log" 2>&1; echo "cuda tests rc=$? at ${SECONDS}s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/cuda_tests.log" | tail -25
# 2. decoding: graphs (the default) against graphs with SDPA's attention and no graphs, in one process,
#    then against CTranslate2 on base and big (fp16-graph and fp16: graphs on and off, --no-cuda-graphs)
timeout 60 .venv/bin/python bench/tools/graph_ab.py --precision fp16 > "$OUT/graph_ab.log" 2>&1
echo "graph A/B rc=$? at ${SECONDS}s"; tail -9 "$OUT/graph_ab.log"
#    (base also profiled with graphs: the GPU's busy share and its top kernels, where the gap to CTranslate2 is)
for section in base big; do
  PROFILE=$([ $section = base ] && echo --profile)
  timeout 150 .venv/bin/python bench/translate.py --device cuda --sections $section $PROFILE \
    --nmt fp16-graph,fp16,bf16-graph,fp32-graph --ct2 float16,float32 --repeat 1 --ct2-site /tmp/ct2site \
    > "$OUT/translate_$section.log" 2>&1; echo "translate bench ($section) rc=$? at ${SECONDS}s"
  grep -E "^(base|big)|^  (nmt|CTranslate2|identical)|^profile|error" "$OUT/translate_$section.log" | head -20
done
#    (both engines at batches of 16000 tokens instead of 6000: does either gain more from a fuller GPU?)
[ $SECONDS -lt 330 ] && timeout 90 .venv/bin/python bench/translate.py --device cuda --sections base --max-tokens 16000 \
  --nmt fp16-graph --ct2 float16 --repeat 1 --ct2-site /tmp/ct2site > "$OUT/translate_base_16000.log" 2>&1 \
  && grep -E "^  (nmt|CTranslate2)" "$OUT/translate_base_16000.log"
echo "translate bench (base, 16000 tokens) done at ${SECONDS}s"
# 3. training: big and base at 25000-token updates, bf16, eager (MFU), and where a big update's time goes
[ $SECONDS -lt 380 ] && timeout 150 .venv/bin/python bench/train.py --sections base --presets big,base \
  --gpu-max-tokens 25000 --seconds 12 --window 6 --profile big > "$OUT/train.log" 2>&1
echo "train bench done at ${SECONDS}s"; grep -E "^(GPU|big|base) |^profile|failed" "$OUT/train.log" | cut -c1-260
#    (step 1's last test: torchrun on one GPU, compiled, validation with BLEU)
[ $SECONDS -lt 460 ] && timeout -s INT -k 10 100 .venv/bin/python -m pytest -v -p no:cacheprovider tests/test_cuda.py \
  -k torchrun -rfEs --tb=short > "$OUT/torchrun_test.log" 2>&1; echo "torchrun test rc=$? at ${SECONDS}s"
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/torchrun_test.log" | tail -5
# 4. the command line on one GPU: a real run (Multi30k, base-sized model, at most 10 minutes, early stopping on
#    validation, averaging, test BLEU), or GPU_CHECK=1: gpu_check.sh (train bf16/fp16, translate fp32/bf16/fp16
#    against the CPU)
left=$((${BUDGET:-540} - SECONDS))
if [ "${GPU_CHECK:-0}" = 1 ] && [ $left -gt 60 ]; then
  CHECK_DIR=runs/gpu_check timeout $left bash bench/tools/gpu_check.sh > "$OUT/gpu_check.log" 2>&1
  echo "gpu_check rc=$? at ${SECONDS}s"; grep -E "^==|BLEU" "$OUT/gpu_check.log" | head -16
elif [ $left -gt 150 ]; then
  # at most 10 minutes, fewer where the call's time would not hold prepare, averaging and translation (~110 s)
  MIN=$(python3 -c "print(f'{min(10, max(1, ($left - 110) / 60)):.1f}')")
  MODEL="--d-model 512 --d-ff 2048 --heads 8 --layers 6 --dropout 0.3" MINUTES=$MIN PRECISION=bf16 WARMUP=1000 \
    LR=0.0005 MAX_TOKENS=8192 SAVE_MIN=0.25 AVG=5 TRAIN_EXTRA="--patience 10" TRANSLATE_PRECISIONS=bf16 \
    MODELS="checkpoint_best averaged" RUN_DIR=runs/multi30k_gpu timeout $left bash bench/multi30k.sh \
    > "$OUT/multi30k.log" 2>&1
  echo "multi30k rc=$? at ${SECONDS}s"; grep -E "^==|^done|\.de +[0-9]" "$OUT/multi30k.log" | head -20
  cp runs/multi30k_gpu/run/metrics.jsonl "$OUT/multi30k_metrics.jsonl" 2>/dev/null
  # CUDA graphs (the default on a GPU) against --no-cuda-graphs on real, variable-length outputs
  M=runs/multi30k_gpu/run/averaged.pt
  for round in 1 2; do for flag in --cuda-graphs --no-cuda-graphs; do
    [ -f $M ] && [ $SECONDS -lt $((${BUDGET:-540} + 5)) ] || continue
    start=$(date +%s.%N)
    .venv/bin/nmt translate -m $M --precision fp16 $flag < runs/multi30k_gpu/data/raw/test.en > /tmp/out$flag.de
    echo "round $round: nmt translate fp16 $flag, 1000 test lines: $(python3 -c "import time; print(f'{time.time() - $start:.2f}')") s wall, process included"
  done; done 2>&1 | tee -a "$OUT/multi30k.log"
  [ -f /tmp/out--cuda-graphs.de ] && echo "identical lines: $(paste -d '\t' /tmp/out--cuda-graphs.de /tmp/out--no-cuda-graphs.de | awk -F'\t' '$1==$2' | wc -l)/1000" | tee -a "$OUT/multi30k.log"
else
  echo "step 4 skipped: ${left}s left (run it in a call of its own)"
fi
# the files that come back from a device machine are few (8): every log in one archive (summary.log, the tee of
# this script's output where the caller keeps one, stays beside it)
tar czf /tmp/gpu_logs.tgz -C "$OUT" --exclude ./summary.log . && find "$OUT" -type f ! -name summary.log -delete \
  && mv /tmp/gpu_logs.tgz "$OUT/logs.tgz"
