#!/usr/bin/env bash
# On the GPU host: the throughput benchmark (python -m load_tests.benchmarks.throughput) in one
# command of at most 10 minutes. Results are written straight into $OUT/throughput as they arrive (so a
# command cut short still returns them): throughput.json, meta.json, server_reports.json, the
# workers' logs, run.log and the rendered tables in tables.md.
#
# On an offline host, with the packages as wheels in .whl and wrk in .tools (README.md, "GPU
# runs"), after installing them:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; \
#   export PYTHONUNBUFFERED=1; OUT=... bash scripts/gpu_throughput.sh [--max-time-s 540] [ARGS]
#
# Every other argument goes to load_tests.benchmarks.throughput (e.g. --models minilm,
# --replicas 4,8, --mps). The run stops starting setups when its budget (--max-time-s, default 540 s) is
# spent, notes the rest as skipped, and always writes what it measured. The whole matrix takes
# more than one 10-minute run: to add to an earlier run's results, carry its throughput.json in
# the working tree and pass PREVIOUS=that/throughput.json with --merge (and --phases serve,noop
# to skip the ceilings measured then). Cores: the first half of the host's cores serve, the
# second half load (16 and 16 on the 32-core host), unless --server-cores / --client-cores say
# otherwise. The run's plan (which jobs, about how long each) is the first line of run.log.
# The copied tree has no .git: set SERVE_APP_CODE_COMMIT=<commit>, which meta.json records as
# code_commit.
set -u
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH="$PWD/.tools${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OUT="${OUT:-/tmp/gpu-out}"; RES="$OUT/throughput"; mkdir -p "$RES"
if [ -n "${PREVIOUS:-}" ]; then cp "$PREVIOUS" "$RES/throughput.json" || exit 2; fi
MAX_TIME_S=540
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --max-time-s) MAX_TIME_S="$2"; shift 2 ;;
    --max-time-s=*) MAX_TIME_S="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
nvidia-smi -L 2>&1 | head -4
[ -e .git ] || [ -n "${SERVE_APP_CODE_COMMIT:-}" ] \
  || echo "WARNING: no .git and no SERVE_APP_CODE_COMMIT: the results will record no commit" >&2
if [ -x .tools/wrk ]; then wrk_v=$(.tools/wrk --version 2>&1 | head -1); else wrk_v=none; fi
echo "cores: $(nproc); wrk: $wrk_v"
python3 -c "import aiohttp, numpy, pynvml; print('aiohttp', aiohttp.__version__)" \
  || echo "WARNING: a client library is missing"
# The python run keeps to MAX_TIME_S (its workers stop starting work 40 s before); timeout
# only catches a hang.
timeout -k 10 $((MAX_TIME_S + 30)) python3 -m load_tests.benchmarks.throughput --out "$RES" \
  --max-time-s "$MAX_TIME_S" ${args[@]+"${args[@]}"} > "$RES/run.log" 2>&1
echo "load_tests.benchmarks.throughput exit $?" | tee -a "$RES/run.log"
grep -E "^\[|exit|Traceback|Error" "$RES/run.log" | tail -60
python3 -m load_tests.benchmarks.throughput.render "$RES/throughput.json" > "$RES/tables.md" 2>&1
cat "$RES/tables.md"
ls -la "$RES"
