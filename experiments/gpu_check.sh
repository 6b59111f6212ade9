#!/usr/bin/env bash
# The GPU measurements of docs/speed.md in one command:
#
#   bash experiments/gpu_check.sh [out_dir]        # default: runs/gpu_check/<date-time>
#
# 1. bench.py, bf16, sequence 128, batch 256, models mini and base x every objective: eager, then
#    --compile (both sides); ratios to transformers and MFU against the bf16 peak of the same run
# 2. train.py at the bench's shape (model=base, roberta, batch 256): the median perf/tokens_per_s,
#    eager and compiled, to set against the bench's tokens/s for base roberta
# 3. the CUDA tests (tests/test_cuda.py, and a process forked from a study's fork server on the GPU)
# 4. the whole test suite on this machine (in parallel where pytest-xdist is installed), each failure's
#    traceback written to failures.txt as it happens
# 5. the kernel profile of the base and mini steps (experiments/profile_step.py), eager and compiled
# Each step writes its output to <out_dir>/<step>.txt; a failing step does not stop the others.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${1:-runs/gpu_check/$(date +%Y-%m-%d_%H-%M-%S)}
if [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then  # never write over an earlier measurement
  echo "$OUT already holds files (an earlier measurement?): give another out_dir, or move it away." >&2
  exit 1
fi
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
export WANDB_MODE=${WANDB_MODE:-offline}

"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU: these measurements need one'" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

"$PY" experiments/bench.py --model mini,base --precision bf16 --json "$OUT/bench_eager.json" 2>&1 | tee "$OUT/bench_eager.txt"
"$PY" experiments/bench.py --model mini,base --precision bf16 --compile --rounds 1 --json "$OUT/bench_compiled.json" 2>&1 \
  | tee "$OUT/bench_compiled.txt"

for compile in false true; do
  run="$OUT/train-base-roberta-compile-$compile"
  "$PY" train.py model=base objective=roberta trainer=gpu batch_size=256 max_seq_len=128 max_steps=300 \
    val_every=100000 checkpoint_every=100000 export=false logger=csv num_workers=4 compile=$compile \
    hydra.run.dir="$run" > "$run.log" 2>&1 || echo "train.py compile=$compile failed: see $run.log"
  "$PY" - "$run" <<'PY' | tee -a "$OUT/train.txt"
import csv, glob, statistics, sys
rows = [r for f in glob.glob(f"{sys.argv[1]}/csv/**/metrics.csv", recursive=True) for r in csv.DictReader(open(f))]
rate = [float(r["perf/tokens_per_s"]) for r in rows if r.get("perf/tokens_per_s") and int(r["step"]) > 50]
wait = [float(r["perf/data_wait_frac"]) for r in rows if r.get("perf/data_wait_frac") and int(r["step"]) > 50]
warm = [float(r["perf/compile_warmup_s"]) for r in rows if r.get("perf/compile_warmup_s")]
if rate:
    print(f"{sys.argv[1]}: perf/tokens_per_s median {statistics.median(rate):,.0f} over {len(rate)} intervals "
          f"(steps 50-300), data_wait_frac {statistics.median(wait):.3f}"
          + (f", compile warm-up {warm[0]:.0f} s" if warm else ""))
else:
    print(f"{sys.argv[1]}: no perf/tokens_per_s logged")
PY
done

"$PY" -m pytest -q tests/test_cuda.py tests/test_forkserver.py 2>&1 | tee "$OUT/cuda_tests.txt"

parallel=$("$PY" -c "import xdist" 2>/dev/null && echo "-n $(( $(nproc) < 16 ? $(nproc) : 16 ))")
PRETRAINLAB_TEST_FAILURES="$OUT/failures.txt" "$PY" -m pytest -q -rfE $parallel -p no:cacheprovider tests \
  > "$OUT/suite.txt" 2>&1
tail -3 "$OUT/suite.txt"

for model in base mini; do
  for compile in "" --compile; do
    "$PY" experiments/profile_step.py --model $model --objective roberta $compile 2>&1 | grep -v USDT
  done
done | tee "$OUT/profile.txt"
echo "results in $OUT: compare train.txt with the base roberta row of bench_eager.txt / bench_compiled.txt;"
echo "the suite's failures, if any, with their tracebacks: $OUT/failures.txt"
