#!/usr/bin/env bash
# Issue 11 on one H200, in one call of at most CALL_S seconds (default 585): bytecode compiled
# as pip would (scripts/compile_bytecode.sh), the import probe and serve_app's BERT encoder
# against transformers' BertModel (research/encoder_ab.py) unless PROBES=0, the start-up and
# CUDA graph GPU tests (calibration cache reuse and invalidation; deferred capture; the graphs'
# memory limit; the torch cap's refit), the memory tests when MEMORY_TESTS=1 (1: budgets under
# load; 2: the oversized replica within its cap beside steady ones; 3: start-up over budget;
# MEMORY_K picks some by pytest -k), then the start-up bench with the time left. With
# MEMORY_TESTS=1, PROBES=0 leaves the bench enough time for 5 repeats.
# Results under $OUT: startup.json, startup.log, import_probe.json, encoder_ab.json, tests.tgz.
# Usage: OUT=/tmp/out bash scripts/gpu_startup.sh   (after the install line of the GPU host's
# README). The copied tree has no .git: set SERVE_APP_CODE_COMMIT=<commit>, which startup.json
# records as code_commit.
set -u
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/gpu-results; mkdir -p "$OUT" "$RES"
T0=$(date +%s)
nvidia-smi -L
[ -e .git ] || [ -n "${SERVE_APP_CODE_COMMIT:-}" ] \
  || echo "WARNING: no .git and no SERVE_APP_CODE_COMMIT: the results will record no commit" >&2
bash scripts/compile_bytecode.sh
if [ "${PROBES:-1}" = 1 ]; then
  timeout 90 python3 -m research.import_probe --out "$OUT/import_probe.json" --concurrent 1,16
  timeout 180 python3 -m research.encoder_ab --device cuda --graphs --out "$OUT/encoder_ab.json" \
    > "$OUT/encoder_ab.log" 2>&1; echo "encoder A/B exit $?" >> "$OUT/encoder_ab.log"
fi
export CUDA_VISIBLE_DEVICES=0 SERVE_APP_RESULTS_DIR="$RES"
timeout 200 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_cuda_graphs_gpu.py \
  tests/gpu/test_startup_gpu.py > "$RES/startup_graphs_pytest.log" 2>&1
echo "start-up and graphs tests exit $?" >> "$RES/startup_graphs_pytest.log"
if [ "${MEMORY_TESTS:-0}" = 1 ]; then
  timeout 250 python3 -m pytest -p no:cacheprovider -v -s tests/gpu/test_memory_gpu.py \
    -k "${MEMORY_K:-test_1 or test_2_ or test_3}" > "$RES/memory_pytest.log" 2>&1
  echo "memory tests exit $?" >> "$RES/memory_pytest.log"
fi
LEFT=$(( ${CALL_S:-585} - ($(date +%s) - T0) - 45 ))
echo "start-up bench budget: $LEFT s"
timeout $((LEFT + 40)) python3 -m load_tests.benchmarks.startup --device cuda --repeats 5 \
  --only "${BENCH_ONLY:-cold,replacement,decision}" \
  --budget-s "$LEFT" --out "$OUT/startup.json" > "$OUT/startup.log" 2>&1
echo "start-up bench exit $?" >> "$OUT/startup.log"
for f in "$RES"/*_pytest.log; do
  grep -E "PASSED|FAILED|ERROR|passed|failed|exit" "$f" | tail -12
done
grep -E "^(decision_to|cold_ready|replacement_s|graph_pool|phases|budget|note|wrote)" \
  "$OUT/startup.log"
tail -3 "$OUT/startup.log"
[ -f "$OUT/encoder_ab.json" ] && python3 -c "
import json; rows = json.load(open('$OUT/encoder_ab.json'))['rows']
for r in rows: print('encoder A/B', r['tokens'], 'tokens batch', r['batch'], 'ours/transformers', r['ours_over_transformers'], 'graphs', r.get('graph_ours_over_transformers'), 'max diff', r['max_abs_diff_hidden'])
" 2>&1 | tail -12
tar -czf "$OUT/tests.tgz" -C "$RES" .
