#!/usr/bin/env bash
# One call on the lent GPU machine (torch preinstalled there, no network): build in place,
# run the main job on CUDA, the whole test suite, then the benchmark harness. Everything lands
# in $OUT (at most 8 files come back).
#
#   [SKIP_BUILD=1] [TESTS="tests/test_a.py ..."] bash scripts/device_run.sh [--no-main-job] [--no-bench] [--deform-bench] [--sanitize] [--arch-check] [benchmark args...]
#
# A whole run (main job, every test file, benchmark) takes about 10 minutes on the H200;
# TESTS and --no-main-job cut it to what a change touched.
#
# --arch-check also builds a copy of the tree for 8.0 alone and runs it on this GPU: the
# warning and the launch error must name the GPU's architecture and the rebuild.
#
# --deform-bench also runs deform_conv2d's benchmark, grid and model layers (about 3 minutes).
# The benchmarks' result files go into one $OUT/results.tar (unpack it into the tree).
#
# --sanitize adds compute-sanitizer's memcheck, racecheck and initcheck over the ops' CUDA
# tests (scripts/sanitize.sh; the log is $OUT/sanitizer.log).
#
# Each test file runs in its own pytest process, so that one crash cannot hide the other files'
# results; the per-file summary lines and their total go to run.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/customops-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
run_bench=1
run_sanitizer=0
run_main_job=1
run_arch_check=0
run_deform_bench=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) run_bench=0; shift ;;
    --sanitize) run_sanitizer=1; shift ;;
    --no-main-job) run_main_job=0; shift ;;
    --arch-check) run_arch_check=1; shift ;;
    --deform-bench) run_deform_bench=1; shift ;;
    *) break ;;
  esac
done

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
  python3 -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  nvcc --version | tail -1
} 2>&1 | tee "$OUT/run.log"

# Python packages the GPU machine lacks travel as wheels in .whl/ (the device tool's `carry`),
# e.g. nvidia-cutlass, whose headers the CUTLASS sm90a kernels build against.
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

t0=$SECONDS
# The H200 alone (sm_90a): a default build would compile every architecture torch supports.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -f customops/lib/libcustomops.so ]; then
  echo "build: skipped (SKIP_BUILD=1, the library from the previous call on this machine)" > "$OUT/build.log"
elif ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "BUILD FAILED" | tee -a "$OUT/run.log"; exit 1
fi
echo "build: $((SECONDS - t0)) s; kernels: $(python3 -c 'import customops; print(customops.compiled_backends())')" | tee -a "$OUT/run.log"

if [ "$run_main_job" = 1 ]; then
  python3 examples/train_digits.py --device cuda --no-progress 2>&1 | tee -a "$OUT/run.log"
fi

t0=$SECONDS
: > "$OUT/pytest.log"
for f in ${TESTS:-tests/test_*.py}; do
  python3 -m pytest -q -p no:cacheprovider -rs "$f" >> "$OUT/pytest.log" 2>&1
  echo "$f: exit $? $(tail -1 "$OUT/pytest.log")" | tee -a "$OUT/run.log"
done
python3 - "$OUT/pytest.log" <<'PY' | tee -a "$OUT/run.log"
import re, sys
totals = {}
for line in open(sys.argv[1], errors="replace"):
    if re.match(r"^=* ?\d+ (passed|failed|skipped|error)", line.strip("= \n")) or " in " in line and re.search(r"\d+ (passed|failed)", line):
        for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line):
            totals[kind] = totals.get(kind, 0) + int(n)
print("pytest total:", ", ".join(f"{v} {k}" for k, v in totals.items()))
PY
echo "pytest took $((SECONDS - t0)) s" | tee -a "$OUT/run.log"
grep -E "^(FAILED|ERROR)|Fatal Python" "$OUT/pytest.log" | head -30

if [ "$run_arch_check" = 1 ]; then
  tree=$(mktemp -d)
  tar --exclude=./build --exclude=./customops/lib --exclude=./customops/bin -cf - . | tar -xf - -C "$tree"
  (cd "$tree" && TORCH_CUDA_ARCH_LIST=8.0 python3 setup.py build_ext --inplace > "$OUT/arch_build.log" 2>&1 \
    && PYTHONPATH="$tree:/tmp/site" python3 -W always -c "
import torch, customops
print('built for', customops.build_info()['cuda_archs'])
torch.ones(1, device='cuda')  # CUDA initializes: the warning
try:
    customops.add(torch.ones(4, device='cuda'), torch.ones(4, device='cuda'))
    print('ARCH CHECK: the launch did not fail')
except RuntimeError as e:
    print('launch error:', e)
") 2>&1 | tee -a "$OUT/run.log"
fi

if [ "$run_sanitizer" = 1 ]; then
  bash scripts/sanitize.sh "$OUT/sanitizer.log" 2>&1 | tee -a "$OUT/run.log"
  grep -E "=========.*(Invalid|Uninitialized|race|Race|Error)" "$OUT/sanitizer.log" | sort | uniq -c | head -20
fi

if [ "$run_bench" = 1 ]; then
  t0=$SECONDS
  marker=$(mktemp)
  python3 benchmarks/bench_fused_linear_sigmoid.py --out benchmarks/results "$@" > "$OUT/bench.log" 2>&1
  echo "benchmark exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/run.log"
  tail -80 "$OUT/bench.log"
  if [ "$run_deform_bench" = 1 ]; then
    for shapes in grid models; do
      t0=$SECONDS
      python3 benchmarks/bench_deform_conv2d.py --device cuda --shapes "$shapes" --rounds 3 --out benchmarks/results \
        >> "$OUT/bench_deform.log" 2>&1
      echo "deform_conv2d benchmark ($shapes) exit $? in $((SECONDS - t0)) s" | tee -a "$OUT/run.log"
    done
  fi
  # The device tool returns at most 8 files: this run's results travel as one archive.
  find benchmarks/results -type f -newer "$marker" | tar -cf "$OUT/results.tar" -T -
  rm -f "$marker"
fi
