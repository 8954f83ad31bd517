#!/usr/bin/env bash
# GPU beam search in one call of about 6 minutes on one H100: the IWSLT-size transformer trained on Multi30k for
# TRAIN_MINUTES (1.5) in bf16 while the decoding tests run on CUDA (the fixed-shape search, its CUDA graphs
# replayed, against today's search for every layer kind), then bench/ct2_decode.py on that model: 1,000 test
# sentences, batches of 32 and 128, our bf16/fp16 against CTranslate2 bfloat16 / float16 / int8_float16 and
# Hugging Face `generate` (bf16, fp16), each engine in its own process, 3 alternating rounds after a warm-up.
# Results: bench/results/gpu_decode.json (copied to $OUT with the logs).
#
# Carry: runs/bench/m30k-data-8000 (see bench/gpu_check.sh) and, in .whl/, the ctranslate2 wheel for the
# machine's Python (`pip download ctranslate2 --no-deps --only-binary=:all: --python-version 3.X -d .whl`).
#
#   OUT=$OUT bash bench/gpu_decode.sh
#   DEVICE=cpu TRAIN_MINUTES=0.2 DECODE_SENTENCES=24 DECODE_ROUNDS=1 DECODE_TESTS="cpu and static_beam" \
#     OUT=/tmp/gpu-decode-dry bash bench/gpu_decode.sh          # the dry run on the CPU
set -u
cd "$(dirname "$0")/.."
export TRAIN_MINUTES=${TRAIN_MINUTES:-1.5} DECODE_NAME=${DECODE_NAME:-gpu_decode} DECODE_TIMEOUT=${DECODE_TIMEOUT:-200}
bash bench/gpu_check.sh env train_m30k tests_decode decode
echo "== done"; cat "${OUT:-runs/gpu-check}/progress.log"; tail -n 25 "${OUT:-runs/gpu-check}/decode.log"
