#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and initcheck over the CUDA tests of every op:
# eager forward and backward, every layout, dtype and empty case, and the error cases. Left
# out: opcheck and gradcheck (they repeat the same kernels many times over, in float64) and
# the compile tests (they check Inductor's kernels, not ours, and take long under the tool).
#
#   bash scripts/sanitize.sh [LOG]      (on a machine with a GPU, after the build)
#   SANITIZER_TIMEOUT=seconds per tool (default 150)
#
# The caching allocator is off, so an access past a tensor's end is past its allocation.
# Exit status 1 when a report names one of our kernels, or a tool crashed, failed a test or ran
# past its limit; reports in cuBLAS's or ATen's kernels alone are listed, not counted.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-sanitizer.log}
: > "$LOG"
TESTS=(tests/test_fused_linear_sigmoid.py tests/test_cuda_kernels.py tests/test_elementwise.py tests/test_errors.py)
status=0
for tool in memcheck racecheck initcheck; do
  extra=()
  select="cuda and not opcheck and not gradcheck"
  [ "$tool" = memcheck ] && extra=(--leak-check no)
  # racecheck and initcheck leave out the tests that reach the CUTLASS kernels (NVIDIA's code,
  # forced or by default dispatch): under them
  # those tests ran past the time limit, and initcheck called their TMA-written outputs
  # uninitialized though every element had been written (H200, tests/results/). memcheck still
  # runs them.
  [ "$tool" != memcheck ] && select="$select and not sm90 and not default_dispatch and not tf32 and not fp32_precision and not expanded"
  t0=$SECONDS
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZER_TIMEOUT:-150}" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
    --print-limit 50 python3 -m pytest -q -p no:cacheprovider -k "$select" "${TESTS[@]}" > "$LOG.part" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$LOG.part" | tail -1)
  echo "compute-sanitizer $tool: exit $rc, $((SECONDS - t0)) s; ${summary:-no summary}; $(grep -E '^[0-9]+ (passed|failed)' "$LOG.part" | tail -1)"
  # Which kernels the reports name: ours fail the run; cuBLAS's and ATen's (reached through the
  # generic path) are listed but are not ours to fix (scripts/sanitizer_reports.py).
  python3 scripts/sanitizer_reports.py "$LOG.part" | sed 's/^/  /'
  ours=${PIPESTATUS[0]}
  { echo "===== $tool"; cat "$LOG.part"; } >> "$LOG"
  rm -f "$LOG.part"
  # 99: reports found (--error-exitcode); anything else but 0 is a crash, a failed test or the time limit.
  if [ "$ours" != 0 ] || { [ "$rc" != 0 ] && [ "$rc" != 99 ]; }; then status=1; fi
done
exit $status
