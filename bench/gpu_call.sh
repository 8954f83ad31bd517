#!/usr/bin/env bash
# One GPU call (CALL_MINUTES, default 9.3) for a GPU machine lent for a few minutes that keeps nothing afterwards:
# first the checks of the GPU paths that no GPU has run yet (about 3.5 minutes), then the reproduction with every
# minute left: what is left of the CPU recipe's table first, then the IWSLT recipe.
#
#   1. env: nvidia-smi, torch, CUDA
#   2. the CUDA cases of the fixed-shape tests (training graphs give eager's losses, with update_freq 1 and 2; every
#      layer kind captures; if they fail, the reproduction trains without graphs; the weights' moving average under
#      graphs is checked too, without deciding anything) and of the decoding tests (the
#      fixed-shape beam search and sampler replay CUDA graphs and equal the eager search; if they fail, the
#      reproduction decodes with decode.fixed_shapes=off)
#   3. bench/train_speed.py at transformer-base, bf16, 4096 tokens an update: multibranch (graphs),
#      multibranch-eager and Hugging Face MarianMTModel, 5 updates profiled (GPU busy / wall)
#   4. the CPU recipe (docs/reproduction.md#the-cpu-recipe): its number of updates first when bench/results has
#      none chosen yet (bench/reproduce_curve.py on the GPU), then every run of its table that bench/results does not
#      hold yet, CPU_JOBS (3) side by side, with their analyses; CPU_MINUTES (default: all that is left) of the call.
#      On an H200 the runs share the GPU almost without gain: 2 side by side trained 44-49 updates/s each, 3 about
#      29, 8 about 15: 3 finish a run of 6,250 updates in about 4 minutes with scoring, 8 none in 6 minutes.
#      CPU_RESERVE (1.2) minutes of it are kept for scoring and the analyses, which took at most 51 s there
#   5. bench/reproduce.py at the IWSLT recipe: SYSTEMS (default `standard`) x SEEDS (1 2 3), JOBS (3) runs side by
#      side on the GPU, with the papers' analyses of every finished run, for the rest of the call
#
# Carry runs/bench/m30k-data-8000 (made here by `python -c "from bench.common import multi30k_data;
# multi30k_data()"` with MULTIBRANCH_BENCH_DIR=runs/bench): the prepared Multi30k that bench/reproduce.py also
# trains on. The device copy has no .git, so pass MULTIBRANCH_COMMIT. Writes at most 7 files under $OUT (8 come back
# at most): progress.log, checks.log, gpu_call_train_speed.json, reproduce.log, reproduce_cpu_curve.json,
# reproduce_cpu.json, reproduce.json. Commit reproduce_cpu_curve.json as bench/results/reproduce_cpu_curve.json when
# bench/results has no chosen update count, the others as bench/results/reproduce_cpu_<gpu>_<n>.json and
# reproduce_<gpu>_<n>.json, then `python bench/reproduce_report.py --docs docs/reproduction.md` here.
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
    -k "cuda and not moving_average" tests/train/test_fixed_shapes.py > "$OUT/checks.log" 2>&1
  rc=$?
  echo "pytest (training, cuda) rc=$rc $(tail -n 1 "$OUT/checks.log")" >> "$OUT/progress.log"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then  # graphs that do not give eager's losses must not train the table
    GRAPHS=off
    echo "the CUDA graph tests failed: the reproduction trains eagerly (train.graphs=off)" >> "$OUT/progress.log"
  fi
  OMP_NUM_THREADS=1 timeout "${TESTS_TIMEOUT:-100}" python3 -m pytest -q -p no:cacheprovider -o addopts="" \
    --import-mode=importlib -rfE -k cuda tests/inference/test_static_beam.py tests/inference/test_static_sampling.py \
    >> "$OUT/checks.log" 2>&1
  rc=$?
  echo "pytest (decoding, cuda) rc=$rc $(tail -n 1 "$OUT/checks.log")" >> "$OUT/progress.log"
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then  # a search that differs from the CPU's must not score the table
    FIXED_SHAPES=off
    echo "the CUDA decoding tests failed: the reproduction decodes without fixed shapes" >> "$OUT/progress.log"
  fi

  # the weights' moving average under graphs: reported, not gating (the reproduction trains without one)
  timeout 60 python3 -m pytest -q -p no:cacheprovider -o addopts="" --import-mode=importlib -rfE \
    -k "cuda and moving_average" tests/train/test_fixed_shapes.py >> "$OUT/checks.log" 2>&1
  echo "pytest (moving average, cuda) rc=$? $(tail -n 1 "$OUT/checks.log")" >> "$OUT/progress.log"

  stamp speed
  timeout "${SPEED_TIMEOUT:-150}" python3 bench/train_speed.py --device "$DEVICE" --size "${SPEED_SIZE:-base}" \
    --amp bf16 --systems multibranch multibranch-eager hf-marian --max-tokens 4096 --steps 20 --warmup 3 --prewarm \
    --profile-updates 5 --rounds 1 --threads 4 --name gpu_call_train_speed >> "$OUT/checks.log" 2>&1
  echo "train_speed rc=$?" >> "$OUT/progress.log"
  # it comes back through $OUT; the copy in bench/results goes, so that a dry run changes no committed file
  mv bench/results/gpu_call_train_speed.json "$OUT/" 2>/dev/null
fi

if [ -z "${SKIP_CPU_RECIPE:-}" ]; then
  if ! python3 -c "import sys; sys.path[:0] = ['.', 'src']; from bench.reproduce_systems import chosen_cpu_updates as c; sys.exit(c() is None)"; then
    stamp "CPU recipe: the update count (standard model's validation curve)"
    timeout "$(python3 -c "print(int(max(30, ($(left_minutes) - 1) * 60)))")" python3 bench/reproduce_curve.py \
      --device "$DEVICE" --threads 4 --data "$DATA" --work runs/reproduce-cpu >> "$OUT/reproduce.log" 2>&1
    echo "curve rc=$?" >> "$OUT/progress.log"
    cp bench/results/reproduce_cpu_curve.json "$OUT/" 2>/dev/null
  fi
  cpu_budget=${CPU_MINUTES:-$(left_minutes)}
  stamp "CPU recipe: the runs bench/results does not hold (budget $cpu_budget minutes)"
  timeout "$(python3 -c "print(int(max(30, $cpu_budget * 60 + 20)))")" python3 bench/reproduce.py --recipe cpu \
    --device "$DEVICE" --data "$DATA" --work runs/reproduce-cpu --jobs "${CPU_JOBS:-3}" --budget "$cpu_budget" \
    --reserve "${CPU_RESERVE:-1.2}" \
    --skip-reported --out "$OUT" --name reproduce_cpu --set "train.graphs=$GRAPHS" \
    --set "decode.fixed_shapes=$FIXED_SHAPES" >> "$OUT/reproduce.log" 2>&1
  echo "reproduce (cpu recipe) rc=$?" >> "$OUT/progress.log"
fi

budget=$(left_minutes)
stamp "reproduce (budget $budget minutes)"
# the harness ends its trainings in time (--max-minutes) and keeps --reserve for scoring and the analyses;
# the outer timeout only guards against a hang
timeout "$(python3 -c "print(int(max(30, $budget * 60 + 20)))")" python3 bench/reproduce.py --device "$DEVICE" \
  --amp bf16 --data "$DATA" --work runs/reproduce --systems ${SYSTEMS:-standard} --seeds ${SEEDS:-1 2 3} \
  --jobs "${JOBS:-3}" --budget "$budget" --out "$OUT" --name reproduce --set "train.graphs=$GRAPHS" \
  --set "decode.fixed_shapes=$FIXED_SHAPES" \
  ${REPRODUCE_ARGS:-} \
  >> "$OUT/reproduce.log" 2>&1
echo "reproduce rc=$?" >> "$OUT/progress.log"

stamp done
cat "$OUT/progress.log"
grep -A6 "^max_tokens" "$OUT/checks.log" 2>/dev/null
tail -n 25 "$OUT/reproduce.log"
