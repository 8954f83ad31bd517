#!/usr/bin/env bash
# GPU training check, one call of about 7 minutes on a lent GPU machine (PyTorch with CUDA and transformers
# installed, nothing to download): CUDA graphs over fixed-shape batches against today's eager path.
#
#   1. the CUDA cases of the fixed-shape tests: graphs give eager's losses; every layer kind captures
#   2. bench/train_speed.py at transformer-base, bf16, 4k, 16k and 32k tokens an update: multibranch (graphs),
#      multibranch-eager (every batch its own shape, no graphs) and Hugging Face MarianMTModel, each in its
#      own process, every timed batch seen before the clock starts (--prewarm), MFU from torch's FLOP counter,
#      and 5 updates profiled once more (torch.profiler: the time some kernel ran / wall time, "GPU busy")
#   3. the IWSLT-shape standard model (`transformer` preset) on Multi30k with graphs for --minutes (updates/s)
#   4. (SECTIONS="jobs", a call of its own: about 4 minutes) bench/jobs_speed.py: 1, 2, 4 and 8 such runs side by
#      side on the GPU, aggregate updates/s (what bench/reproduce.py --jobs N gets)
#
# Needs runs/bench/m30k-data-8000 (made here by `python -c "from bench.common import multi30k_data;
# multi30k_data()"` with MULTIBRANCH_BENCH_DIR=runs/bench), carried with the call. Writes under $OUT:
# progress.log, pytest.log, train_speed.log, gpu_train_speed.json, train_m30k.log, metrics.jsonl, jobs_speed.log,
# gpu_jobs_speed.json.
#
#   OUT=/tmp/gpu bash bench/gpu_train.sh            # SECTIONS="tests speed m30k" (the default)
#   OUT=/tmp/gpu SECTIONS=jobs bash bench/gpu_train.sh
#   DEVICE=cpu SIZE=tiny MINUTES=0.3 bash bench/gpu_train.sh   # the dry run on a CPU (the CUDA tests skip)
#   DEVICE=cpu SECTIONS=jobs JOBS="1 2" JOBS_SECONDS=25 JOBS_SKIP=5 JOBS_LOG_EVERY=2 JOBS_PRESET=transformer-tiny bash bench/gpu_train.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-train}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MULTIBRANCH_CPU_KERNELS=0
export MULTIBRANCH_BENCH_DIR="$PWD/runs/bench"
sections=${SECTIONS:-tests speed m30k}
DEVICE=${DEVICE:-cuda}
has() { [[ " $sections " == *" $1 "* ]]; }
stamp() { echo "== $(date +%T) $*" | tee -a "$OUT/progress.log"; }

stamp env
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU', 'transformers', transformers.__version__)" \
  >> "$OUT/progress.log" 2>&1

if has tests; then
  stamp tests
  timeout "${TESTS_TIMEOUT:-60}" python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib \
    -rfE -k "cuda" tests/train/test_fixed_shapes.py > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$? $(tail -n 1 "$OUT/pytest.log")" >> "$OUT/progress.log"
fi

if has speed; then
  stamp speed
  timeout "${SPEED_TIMEOUT:-300}" python3 bench/train_speed.py --device "$DEVICE" --size "${SIZE:-base}" --amp bf16 \
    --systems multibranch multibranch-eager hf-marian --max-tokens ${SPEED_TOKENS:-4096 16384 32768} --steps 20 \
    --warmup 3 --prewarm --profile-updates 5 --rounds 1 --threads 4 --name gpu_train_speed > "$OUT/train_speed.log" 2>&1
  echo "train_speed rc=$?" >> "$OUT/progress.log"
  cp bench/results/gpu_train_speed.json "$OUT/" 2>/dev/null
fi

if has m30k; then
  stamp m30k
  rm -rf runs/gpu-m30k
  timeout "${M30K_TIMEOUT:-110}" python3 -m multibranch train --preset transformer --data runs/bench/m30k-data-8000 \
    --out runs/gpu-m30k --device "$DEVICE" --amp bf16 --max-minutes "${MINUTES:-1.2}" --valid-every 100000 \
    --set train.valid_max_sentences=300 --log-every 100 --no-progress > "$OUT/train_m30k.log" 2>&1
  echo "train_m30k rc=$?" >> "$OUT/progress.log"
  cp runs/gpu-m30k/metrics.jsonl "$OUT/" 2>/dev/null
fi
if has jobs; then
  stamp jobs
  timeout "${JOBS_TIMEOUT:-330}" python3 bench/jobs_speed.py --device "$DEVICE" --amp bf16 \
    --preset "${JOBS_PRESET:-transformer}" --jobs ${JOBS:-1 2 4 8} --seconds "${JOBS_SECONDS:-45}" \
    --skip "${JOBS_SKIP:-12}" --log-every "${JOBS_LOG_EVERY:-50}" --name gpu_jobs_speed > "$OUT/jobs_speed.log" 2>&1
  echo "jobs_speed rc=$?" >> "$OUT/progress.log"
  cp bench/results/gpu_jobs_speed.json "$OUT/" 2>/dev/null
fi
stamp done
cat "$OUT/progress.log"
grep -A6 "^max_tokens" "$OUT/train_speed.log" 2>/dev/null
grep -E "batches:|graphs|train \| step|valid \||stopped" "$OUT/train_m30k.log" 2>/dev/null | tail -n 8
cat "$OUT/jobs_speed.log" 2>/dev/null
