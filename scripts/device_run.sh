#!/usr/bin/env bash
# One call on the lent GPU machine (torch preinstalled there, no network): build in place,
# run the main job on CUDA, the whole test suite, then the benchmark harness. Everything lands
# in $OUT (at most 8 files come back).
#
#   bash scripts/device_run.sh [--no-bench] [benchmark args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/customops-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
run_bench=1
if [ "${1:-}" = "--no-bench" ]; then run_bench=0; shift; fi

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1
} 2>&1 | tee "$OUT/run.log"

t0=$SECONDS
if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED" | tee -a "$OUT/run.log"; exit 1
fi
echo "build: $((SECONDS - t0)) s; kernels: $(python3 -c 'import customops; print(customops.compiled_backends())')" | tee -a "$OUT/run.log"

python3 -m customops.train_digits --device cuda --no-progress 2>&1 | tee -a "$OUT/run.log"

t0=$SECONDS
python3 -m pytest -q -p no:cacheprovider -rs tests > "$OUT/pytest.log" 2>&1
echo "pytest exit $? in $((SECONDS - t0)) s: $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/run.log"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -30

if [ "$run_bench" = 1 ]; then
  t0=$SECONDS
  python3 benchmarks/bench_fused_linear_sigmoid.py --out "$OUT" "$@" > "$OUT/bench.log" 2>&1
  echo "benchmark exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/run.log"
  tail -80 "$OUT/bench.log"
fi
