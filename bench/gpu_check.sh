#!/usr/bin/env bash
# The GPU checks in one run, for a lent GPU machine with PyTorch (CUDA) and transformers
# installed and nothing to download: training speed at transformer-base size against Hugging Face Marian (bf16,
# same batches, MFU), a transformer trained on Multi30k on the GPU, beam-search speed of that model against HF
# `generate` and CTranslate2 (bf16, fp16, CTranslate2's int8_float16; batches of 32 and 128), and the test suite
# with CUDA present (the `device` fixture's tests run on cuda too; tests_decode: only the decoding tests' cuda cases).
#
# Needs, relative to the repository root: runs/bench/m30k-data-8000 (made here by `python -c "from bench.common
# import multi30k_data; multi30k_data()"`), the real corpora under $MULTIBRANCH_SHARED_DATA (for the tests), and
# wheels of any package the machine lacks in .whl/ (fastapi, pydantic, uvicorn for the serve tests).
# Everything it writes goes under $OUT (default runs/gpu-check): logs and one results tarball.
#
#   OUT=runs/gpu-check MULTIBRANCH_SHARED_DATA=/path/to/data [DECODE_CKPT=CKPT] bash bench/gpu_check.sh [sections...]
#   sections: env train_speed train_m30k tests tests_decode decode (default: all but tests_decode, in that order;
#   train_m30k and tests overlap); decode uses DECODE_CKPT (default: the model train_m30k wrote) and the test set
#   in DECODE_DATA (default runs/bench/m30k-data-8000)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-check}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the same commands on the CPU (with small budgets, see gpu_decode.sh)
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MULTIBRANCH_BENCH_DIR="$PWD/runs/bench"
sections=${*:-env train_speed train_m30k tests decode}
has() { [[ " $sections " == *" $1 "* ]]; }
stamp() { echo "== $(date +%T) $*" | tee -a "$OUT/progress.log"; }
workers() { python3 -c "import xdist" 2>/dev/null && echo "-n $1"; }  # pytest-xdist where installed

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

if has env; then
  stamp env
  { nvidia-smi; python3 -c "import sys, torch, transformers; print(sys.version); print('torch', torch.__version__,
'cuda', torch.version.cuda, torch.cuda.get_device_name()); print('transformers', transformers.__version__)"
    echo "libcublas.so.12/13 (CTranslate2 4.8 opens .12):"; find /usr /opt -name 'libcublas.so.1[23]*' 2>/dev/null | head -3
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
  # the IWSLT-size transformer preset on Multi30k, TRAIN_MINUTES (2) of bf16 training (shorter warm-up for so short
  # a run)
  timeout 200 python3 -m multibranch train --preset transformer --data runs/bench/m30k-data-8000 \
    --out runs/gpu-m30k --device "$DEVICE" --max-minutes "${TRAIN_MINUTES:-2}" --set train.amp=bf16 --set train.lr.warmup=1000 \
    --set train.valid_every=600 --threads 2 > "$OUT/train_m30k.log" 2>&1 &
  train_pid=$!
fi

if has tests; then
  stamp tests
  OMP_NUM_THREADS=1 timeout 230 python3 -m pytest -q $(workers 12) -p no:cacheprovider --timeout 200 -o addopts="" \
    -m "not slow" --import-mode=importlib -rfE --junitxml "$OUT/junit.xml" tests > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/progress.log"
fi

if has tests_decode; then
  stamp tests_decode
  # the decoding tests' CUDA cases only (beam search, candidates, decoder state, layer contract, Translator)
  OMP_NUM_THREADS=1 timeout 150 python3 -m pytest -q $(workers 8) -p no:cacheprovider --timeout 120 -o addopts="" \
    --import-mode=importlib -rfE -k "${DECODE_TESTS:-cuda}" tests/inference tests/modules tests/models tests/tasks/translation \
    > "$OUT/pytest_decode.log" 2>&1
  echo "pytest (decode, cuda) rc=$?" >> "$OUT/progress.log"
fi

if [ -n "$train_pid" ]; then
  wait "$train_pid"
  echo "train_m30k rc=$?" >> "$OUT/progress.log"
  cp runs/gpu-m30k/metrics.jsonl "$OUT/" 2>/dev/null
fi

DECODE_CKPT=${DECODE_CKPT:-runs/gpu-m30k/best.pt}  # or a checkpoint (or export directory) trained elsewhere,
# carried along: `multibranch convert export --ckpt best.pt --out .gpu/release --dtype fp16` halves what is carried
DECODE_DATA=${DECODE_DATA:-runs/bench/m30k-data-8000}  # test.src.txt / test.tgt.txt: the 2016 Flickr test set

if has decode && [ -e "$DECODE_CKPT" ]; then
  stamp decode
  # CTranslate2 4.8's CUDA build opens CUDA 12's cuBLAS by name (dlopen "libcublas.so.12") and calls only
  # cublasCreate/Destroy/SetStream, cublasGemmEx, cublasGemmStridedBatchedEx, cublasSgemm(StridedBatched) and
  # two getters, which cuBLAS 13 keeps as they were. Where only cuBLAS 13 is installed (this image), a
  # libcublas.so.12 link to it is tried; if CTranslate2 still cannot run, its rows are reported as left out.
  shim=/tmp/cublas12
  mkdir -p "$shim"
  cublas13=$(ls /usr/local/cuda*/lib64/libcublas.so.13 "$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' \
    2>/dev/null)"/cu*/lib/libcublas.so.13 2>/dev/null | head -1)
  if [ -n "$cublas13" ]; then
    ln -sf "$cublas13" "$shim/libcublas.so.12"
    ln -sf "$(dirname "$cublas13")/libcublasLt.so.13" "$shim/libcublasLt.so.13"
    export LD_LIBRARY_PATH="$shim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  python3 -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__, 'cuda devices',
ctranslate2.get_cuda_device_count(), ctranslate2.get_supported_compute_types('cuda'))" >> "$OUT/progress.log" 2>&1
  timeout "${DECODE_TIMEOUT:-330}" python3 bench/ct2_decode.py --ckpt "$DECODE_CKPT" --src "$DECODE_DATA/test.src.txt" \
    --ref "$DECODE_DATA/test.tgt.txt" --device "$DEVICE" --batch 32 128 --sentences "${DECODE_SENTENCES:-1000}" \
    --rounds "${DECODE_ROUNDS:-3}" --threads 4 --name "${DECODE_NAME:-decode_gpu}" > "$OUT/decode.log" 2>&1
  echo "decode rc=$?" >> "$OUT/progress.log"
  cp "bench/results/${DECODE_NAME:-decode_gpu}.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/decode_workers.tgz" runs/bench/ct2_decode/*.stderr 2>/dev/null
fi

stamp done
tar czf "$OUT/results.tgz" bench/results/train_speed_gpu.json 2>/dev/null
ls -la "$OUT"
