#!/usr/bin/env bash
# On the GPU host (two GPUs): the GPU tests, one suite per GPU, then tarballs under $OUT.
# GPU 0: CUDA graphs (in-process), then the memory tests; GPU 1: the controller test, then the
# cost of the cache policies.
# Usage: bash scripts/gpu_tests.sh   (on a host set up as README.md's "GPU runs" says)
set -u
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/gpu-results; mkdir -p "$OUT" "$RES/mem" "$RES/ctl"
nvidia-smi -L
python3 -c "import httpx, matplotlib, pynvml; print('client libs ok')"
(
  export CUDA_VISIBLE_DEVICES=0 SERVE_APP_RESULTS_DIR="$RES/mem"
  timeout 90 python3 -m pytest -p no:cacheprovider -v tests/gpu/test_cuda_graphs_gpu.py \
    > "$RES/mem/graphs_pytest.log" 2>&1
  echo "graphs tests exit $?" >> "$RES/mem/graphs_pytest.log"
  timeout 470 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_memory_gpu.py \
    > "$RES/mem/pytest.log" 2>&1
  echo "memory tests exit $?" >> "$RES/mem/pytest.log"
) &
(
  export CUDA_VISIBLE_DEVICES=1 SERVE_APP_RESULTS_DIR="$RES/ctl"
  timeout 400 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_controller_gpu.py \
    > "$RES/ctl/pytest.log" 2>&1
  echo "controller test exit $?" >> "$RES/ctl/pytest.log"
  timeout 150 python3 -m research.cache_policy_cost --out "$RES/ctl" > "$RES/ctl/cache_cost.log" 2>&1
  echo "cache cost exit $?" >> "$RES/ctl/cache_cost.log"
) &
wait
for f in mem/graphs_pytest.log mem/pytest.log ctl/pytest.log; do
  grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|exit" "$RES/$f" | tail -15
done
tail -5 "$RES/ctl/cache_cost.log"
tar -czf "$OUT/gpu_results.tgz" -C "$RES" .
