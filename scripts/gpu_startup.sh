#!/usr/bin/env bash
# Issue 11 on one H200, in one call of at most CALL_S seconds (default 560): the CUDA graph
# tests (deferred capture), the memory tests that run out of memory on purpose (oversized
# batches, start-up over budget), then the start-up bench with whatever time is left.
# Results under $OUT: startup.json, startup.log, tests.tgz.
# Usage: OUT=/tmp/out bash scripts/gpu_startup.sh   (after the install line of the GPU host's
# README)
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/gpu-results; mkdir -p "$OUT" "$RES"
T0=$(date +%s)
nvidia-smi -L
export CUDA_VISIBLE_DEVICES=0 SERVE_APP_RESULTS_DIR="$RES"
timeout 60 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_cuda_graphs_gpu.py \
  > "$RES/graphs_pytest.log" 2>&1
echo "graphs tests exit $?" >> "$RES/graphs_pytest.log"
timeout 150 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_memory_gpu.py \
  -k "test_2_ or test_3" > "$RES/memory_pytest.log" 2>&1
echo "memory tests exit $?" >> "$RES/memory_pytest.log"
LEFT=$(( ${CALL_S:-560} - ($(date +%s) - T0) - 50 ))
echo "start-up bench budget: $LEFT s"
timeout $((LEFT + 40)) python3 -m load_tests.startup_bench --device cuda --repeats 5 \
  --budget-s "$LEFT" --out "$OUT/startup.json" > "$OUT/startup.log" 2>&1
echo "start-up bench exit $?" >> "$OUT/startup.log"
for f in "$RES"/*_pytest.log; do
  grep -E "PASSED|FAILED|ERROR|passed|failed|exit" "$f" | tail -8
done
tail -30 "$OUT/startup.log"
tar -czf "$OUT/tests.tgz" -C "$RES" .
