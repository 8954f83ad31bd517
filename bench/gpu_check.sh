#!/usr/bin/env bash
# The GPU checks of issues 21 and 22 in one run, for a lent GPU machine with PyTorch (CUDA) and transformers
# installed and nothing to download: training speed at transformer-base size against Hugging Face Marian (bf16,
# same batches, MFU), a transformer trained on Multi30k on the GPU, beam-search speed of that model against HF
# `generate` (bf16 and fp16, batches of 32 and 128), and the test suite with CUDA present (the `device`
# fixture's tests run on cuda too).
#
# Needs, relative to the repository root: runs/bench/m30k-data-8000 (made here by `python -c "from bench.common
# import multi30k_data; multi30k_data()"`), the real corpora under $MULTIBRANCH_SHARED_DATA (for the tests), and
# wheels of any package the machine lacks in .whl/ (fastapi, pydantic, uvicorn for the serve tests).
# Everything it writes goes under $OUT (default runs/gpu-check): logs and one results tarball.
#
#   OUT=runs/gpu-check MULTIBRANCH_SHARED_DATA=/path/to/data [DECODE_CKPT=CKPT] bash bench/gpu_check.sh [sections...]
#   sections: env train_speed train_m30k tests decode (default: all, in that order; train_m30k and tests overlap);
#   decode uses DECODE_CKPT (default: the model train_m30k wrote)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MULTIBRANCH_BENCH_DIR="$PWD/runs/bench"
sections=${*:-env train_speed train_m30k tests decode}
has() { [[ " $sections " == *" $1 "* ]]; }
stamp() { echo "== $(date +%T) $*" | tee -a "$OUT/progress.log"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

if has env; then
  stamp env
  { nvidia-smi; python3 -c "import sys, torch, transformers; print(sys.version); print('torch', torch.__version__,
'cuda', torch.version.cuda, torch.cuda.get_device_name()); print('transformers', transformers.__version__)"
    echo "libcublas.so.12 (CTranslate2's CUDA build needs it):"; find / -name 'libcublas.so.12*' 2>/dev/null | head -3
    ls /usr/local/cuda*/lib64/libcublas.so* 2>/dev/null
    python3 -c "import nvidia.cublas, os; print(os.listdir(os.path.join(nvidia.cublas.__path__[0], 'lib')))"
    ls -d /root/.cache/huggingface/hub/* 2>/dev/null | head; } > "$OUT/env.txt" 2>&1
fi

if has train_speed; then
  stamp train_speed
  timeout 240 python3 bench/train_speed.py --device cuda --size base --amp bf16 --systems hf-marian multibranch \
    --max-tokens 4096 16384 --steps 30 --warmup 10 --rounds 1 --threads 4 --name train_speed_gpu \
    > "$OUT/train_speed.log" 2>&1
  echo "train_speed rc=$?" >> "$OUT/progress.log"
fi

train_pid=""
if has train_m30k; then
  stamp train_m30k
  rm -rf runs/gpu-m30k
  # the IWSLT-size transformer preset on Multi30k, 2 minutes of bf16 training (shorter warm-up for so short a run)
  timeout 200 python3 -m multibranch train --preset transformer --data runs/bench/m30k-data-8000 \
    --out runs/gpu-m30k --device cuda --max-minutes 2 --set train.amp=bf16 --set train.lr.warmup=1000 \
    --set train.valid_every=600 --threads 2 > "$OUT/train_m30k.log" 2>&1 &
  train_pid=$!
fi

if has tests; then
  stamp tests
  OMP_NUM_THREADS=1 timeout 230 python3 -m pytest -q -n 12 -p no:cacheprovider --timeout 200 -o addopts="" \
    -m "not slow" --import-mode=importlib -rfE --junitxml "$OUT/junit.xml" tests > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/progress.log"
fi

if [ -n "$train_pid" ]; then
  wait "$train_pid"
  echo "train_m30k rc=$?" >> "$OUT/progress.log"
  cp runs/gpu-m30k/metrics.jsonl "$OUT/" 2>/dev/null
fi

DECODE_CKPT=${DECODE_CKPT:-runs/gpu-m30k/best.pt}  # or a checkpoint trained elsewhere, carried along
if has decode && [ -f "$DECODE_CKPT" ]; then
  stamp decode
  timeout 200 python3 bench/decode_speed.py --ckpt "$DECODE_CKPT" --device cuda --precision bf16 fp16 \
    --batch 32 128 --split test --sentences 1000 --rounds 1 --threads 4 --name decode_gpu > "$OUT/decode.log" 2>&1
  echo "decode rc=$?" >> "$OUT/progress.log"
fi

stamp done
tar czf "$OUT/results.tgz" bench/results/train_speed_gpu.json bench/results/decode_gpu.json 2>/dev/null
ls -la "$OUT"
