#!/usr/bin/env bash
# One GPU call (CALL_MINUTES, default 9.3) for a lent GPU machine: first the checks of the GPU paths that no GPU
# has run yet (about 3 minutes), then bench/reproduce.py with every minute left.
#
#   1. env: nvidia-smi, torch, CUDA
#   2. the CUDA cases of the fixed-shape tests (training graphs give eager's losses, with update_freq 1 and 2; every
#      layer kind captures; if they fail, the reproduction trains without graphs) and of the decoding tests (the
#      fixed-shape beam search and sampler replay CUDA graphs and equal the eager search; if they fail, the
#      reproduction decodes with decode.fixed_shapes=off)
#   3. bench/train_speed.py at transformer-base, bf16, 4096 tokens an update: multibranch (graphs),
#      multibranch-eager and Hugging Face MarianMTModel, 5 updates profiled (GPU busy / wall)
#   4. bench/reproduce.py: SYSTEMS (default `standard`) x SEEDS (1 2 3), JOBS (3) runs side by side on the GPU, with
#      the papers' analyses of every finished run; --budget is what is left of CALL_MINUTES. The plan of calls that
#      finishes the table is in docs/reproduction.md.
#
# Carry runs/bench/m30k-data-8000 (made here by `python -c "from bench.common import multi30k_data;
# multi30k_data()"` with MULTIBRANCH_BENCH_DIR=runs/bench): the prepared Multi30k that bench/reproduce.py also
# trains on. The device copy has no .git, so pass MULTIBRANCH_COMMIT. Writes 7 files under $OUT (8 come back at
# most): progress.log, pytest.log, train_speed.log, gpu_call_train_speed.json, reproduce.log, reproduce.json,
# reproduce_hyps.json. Commit the JSON as bench/results/reproduce_<gpu>_<n>.json (+ _hyps.json), then
# `python bench/reproduce_report.py --docs docs/reproduction.md` here.
#
#   MULTIBRANCH_COMMIT=<sha> OUT=$OUT bash bench/gpu_call.sh
#   MULTIBRANCH_COMMIT=<sha> OUT=$OUT SKIP_CHECKS=1 SYSTEMS="drophead weighted" JOBS=6 bash bench/gpu_call.sh
#   DEVICE=cpu CALL_MINUTES=6 SPEED_SIZE=tiny REPRODUCE_ARGS="--tiny --valid-sentences 40 --analysis-sentences 40" \
#     OUT=/tmp/gpu-call bash bench/gpu_call.sh
#       (the dry run on a CPU: the CUDA tests skip, the reproduction trains --tiny models on the carried data)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-call}
DEVICE=${DEVICE:-cuda}
CALL_MINUTES=${CALL_MINUTES:-9.3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 MULTIBRANCH_CPU_KERNELS=0
export MULTIBRANCH_BENCH_DIR="$PWD/runs/bench"
DATA=runs/bench/m30k-data-8000
GRAPHS=${GRAPHS:-auto}  # train.graphs of the reproduction; off when the CUDA graph tests fail
FIXED_SHAPES=${FIXED_SHAPES:-auto}  # decode.fixed_shapes of the reproduction; off when the CUDA decoding tests fail
stamp() { echo "== $(date +%T) +${SECONDS}s $*" | tee -a "$OUT/progress.log"; }
left_minutes() { python3 -c "print(f'{$CALL_MINUTES - $SECONDS / 60:.2f}')"; }

stamp env
{ nvidia-smi 2>/dev/null | head -n 15; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"; } >> "$OUT/progress.log" 2>&1
[ -f "$DATA/data.json" ] || { echo "no $DATA: carry it (see the top of this script)" | tee -a "$OUT/progress.log"; exit 2; }

if [ -z "${SKIP_CHECKS:-}" ]; then
  stamp tests
  timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib -rfE \
    -k cuda tests/train/test_fixed_shapes.py > "$OUT/pytest.log" 2>&1
  rc=$?
  echo "pytest (training, cuda) rc=$rc $(tail -n 1 "$OUT/pytest.log")" >> "$OUT/progress.log"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then  # graphs that do not give eager's losses must not train the table
    GRAPHS=off
    echo "the CUDA graph tests failed: the reproduction trains eagerly (train.graphs=off)" >> "$OUT/progress.log"
  fi
  OMP_NUM_THREADS=1 timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    --import-mode=importlib -rfE -k cuda tests/inference/test_static_beam.py tests/inference/test_static_sampling.py \
    >> "$OUT/pytest.log" 2>&1
  rc=$?
  echo "pytest (decoding, cuda) rc=$rc $(tail -n 1 "$OUT/pytest.log")" >> "$OUT/progress.log"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then  # a search that differs from the CPU's must not score the table
    FIXED_SHAPES=off
    echo "the CUDA decoding tests failed: the reproduction decodes without fixed shapes" >> "$OUT/progress.log"
  fi

  stamp speed
  timeout "${SPEED_TIMEOUT:-110}" python3 bench/train_speed.py --device "$DEVICE" --size "${SPEED_SIZE:-base}" \
    --amp bf16 --systems multibranch multibranch-eager hf-marian --max-tokens 4096 --steps 20 --warmup 3 --prewarm \
    --profile-updates 5 --rounds 1 --threads 4 --name gpu_call_train_speed > "$OUT/train_speed.log" 2>&1
  echo "train_speed rc=$?" >> "$OUT/progress.log"
  # it comes back through $OUT; the copy in bench/results goes, so that a dry run changes no committed file
  mv bench/results/gpu_call_train_speed.json "$OUT/" 2>/dev/null
fi

budget=$(left_minutes)
stamp "reproduce (budget $budget minutes)"
# the harness ends its trainings in time (--max-minutes) and keeps --reserve for scoring and the analyses;
# the outer timeout only guards against a hang
timeout "$(python3 -c "print(int(max(30, $budget * 60 + 20)))")" python3 bench/reproduce.py --device "$DEVICE" \
  --amp bf16 --data "$DATA" --work runs/reproduce --systems ${SYSTEMS:-standard} --seeds ${SEEDS:-1 2 3} \
  --jobs "${JOBS:-3}" --budget "$budget" --save-hyps --out "$OUT" --name reproduce --set "train.graphs=$GRAPHS" \
  --set "decode.fixed_shapes=$FIXED_SHAPES" \
  ${REPRODUCE_ARGS:-} \
  > "$OUT/reproduce.log" 2>&1
echo "reproduce rc=$?" >> "$OUT/progress.log"

stamp done
cat "$OUT/progress.log"
grep -A6 "^max_tokens" "$OUT/train_speed.log" 2>/dev/null
tail -n 25 "$OUT/reproduce.log"
