#!/usr/bin/env bash
# The GPU fault suite and the start-up GPU tests, in one lease. Results under $OUT:
# faults.json, faults.log, tests.tgz.
# - Two GPUs: the fault suite on GPU 0 (its own Ray cluster) beside, on GPU 1, the in-process
#   CUDA graph tests, the calibration-cache test and the memory (OOM) tests (another cluster).
# - One GPU: the fault suite, then the graph and calibration-cache tests; the memory tests only
#   with MEMORY_TESTS=1 (they would not fit a 10-minute call after the rest).
# Usage: OUT=/tmp/out bash scripts/gpu_faults_tests.sh   (after the install line of the GPU
# host's README); FAULTS_BUDGET_S (400) and FAULTS_ARGS (e.g. "--only overload,kill20") pass on
# to load_tests.reliability.gpu_faults. The copied tree has no .git: set
# SERVE_APP_CODE_COMMIT=<commit>, which faults.json records as code_commit.
set -u
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/gpu-results; mkdir -p "$OUT" "$RES"
nvidia-smi -L
[ -e .git ] || [ -n "${SERVE_APP_CODE_COMMIT:-}" ] \
  || echo "WARNING: no .git and no SERVE_APP_CODE_COMMIT: the results will record no commit" >&2
GPUS=$(nvidia-smi -L | grep -c '^GPU')
faults() {
  CUDA_VISIBLE_DEVICES=0 timeout 450 python3 -m load_tests.reliability.gpu_faults \
    --device cuda --budget-s "${FAULTS_BUDGET_S:-400}" ${FAULTS_ARGS:-} --out "$OUT/faults.json" \
    > "$OUT/faults.log" 2>&1
  echo "fault suite exit $?" >> "$OUT/faults.log"
}
tests() {  # $1: the GPU
  export CUDA_VISIBLE_DEVICES=$1 SERVE_APP_RESULTS_DIR="$RES"
  timeout 90 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_cuda_graphs_gpu.py \
    > "$RES/graphs_pytest.log" 2>&1
  echo "graphs tests exit $?" >> "$RES/graphs_pytest.log"
  timeout 120 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_startup_gpu.py \
    > "$RES/startup_pytest.log" 2>&1
  echo "startup tests exit $?" >> "$RES/startup_pytest.log"
  if [ "$GPUS" -ge 2 ] || [ "${MEMORY_TESTS:-0}" = 1 ]; then
    timeout 330 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_memory_gpu.py \
      > "$RES/memory_pytest.log" 2>&1
    echo "memory tests exit $?" >> "$RES/memory_pytest.log"
  fi
}
if [ "$GPUS" -ge 2 ]; then
  faults & (tests 1) & wait
else
  faults; (tests 0)
fi
for f in "$RES"/*_pytest.log; do
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|exit" "$f" | tail -12
done
grep -E "^(kill20|poisoned|sigstop|hog|overload|budget|wrote|fault)" "$OUT/faults.log" | tail -15
tar -czf "$OUT/tests.tgz" -C "$RES" .
