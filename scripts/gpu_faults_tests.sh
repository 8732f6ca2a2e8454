#!/usr/bin/env bash
# On the two-GPU host, in one lease: the GPU fault suite on GPU 0 (its own Ray cluster), and on
# GPU 1 the in-process CUDA graph tests, the calibration-cache test and the memory (OOM) tests
# (another Ray cluster). Results under $OUT: faults.json, faults.log, tests.tgz.
# Usage: OUT=/tmp/out bash scripts/gpu_faults_tests.sh   (after the install line of the GPU
# host's README)
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/gpu-results; mkdir -p "$OUT" "$RES"
nvidia-smi -L
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 450 python3 -m load_tests.gpu_faults --device cuda --budget-s 400 \
    --out "$OUT/faults.json" > "$OUT/faults.log" 2>&1
  echo "fault suite exit $?" >> "$OUT/faults.log"
) &
(
  export CUDA_VISIBLE_DEVICES=1 SERVE_APP_RESULTS_DIR="$RES"
  timeout 90 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_cuda_graphs_gpu.py \
    > "$RES/graphs_pytest.log" 2>&1
  echo "graphs tests exit $?" >> "$RES/graphs_pytest.log"
  timeout 120 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_startup_gpu.py \
    > "$RES/startup_pytest.log" 2>&1
  echo "startup tests exit $?" >> "$RES/startup_pytest.log"
  timeout 330 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_memory_gpu.py \
    > "$RES/memory_pytest.log" 2>&1
  echo "memory tests exit $?" >> "$RES/memory_pytest.log"
) &
wait
for f in graphs_pytest.log startup_pytest.log memory_pytest.log; do
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|exit" "$RES/$f" | tail -12
done
grep -E "^(kill20|poisoned|sigstop|hog|overload|budget|wrote|fault)" "$OUT/faults.log" | tail -15
tar -czf "$OUT/tests.tgz" -C "$RES" .
