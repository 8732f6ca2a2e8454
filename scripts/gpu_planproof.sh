#!/usr/bin/env bash
# On the GPU host: issue 27's proof in one command of under 10 minutes (docs/planning.md, "The
# proof"). The retrieval stack (configs/rag-stack.yaml with load_format: dummy, every application
# under MPS unless MODE=time-sliced) is measured by `serve-app plan --measure` pinned to the
# server's cores, so that each replica's figures are taken on the cores the plan gives it, then
# planned and proved by load_tests.benchmarks.planproof with the client on the other cores.
#
# After the install line of the GPU host's README:
#   SERVE_APP_CODE_COMMIT=<commit> OUT=$OUT bash scripts/gpu_planproof.sh
# Writes $OUT/planproof.tgz: pm/ (measurements.json, readings.json, the plan) and pp/
# (planproof.json, both configs, the metrics each phase scraped), with the logs. MEASUREMENTS=FILE
# (an earlier run's measurements.json) skips the measuring and proves a plan from FILE. With py-spy on
# PATH (its wheel installed with the others, as docs/benchmarks.md shows), one image replica is
# sampled for 8 s under the plan's load: images_replica.raw (every thread, idle included).
# MAX_UTILIZATION=F plans each replica at most F of its measured saturation rate (the proof's
# --max-utilization; unset: the measurements file's).
set -u
SERVER_CORES="${SERVER_CORES:-0-9}"
CLIENT_CORES="${CLIENT_CORES:-10-15}"
MODE="${MODE:-mps}"
OUT="${OUT:-/tmp/planproof-out}"
WORK=/tmp/planproof
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="${RAY_AUTH_TOKEN:-$(python3 -c "import secrets; print(secrets.token_hex(32))")}" RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
sed_args=(-e 's/^      model_name: all-MiniLM-L6-v2$/&\n      load_format: dummy/')
if [ "$MODE" = mps ]; then
  sed_args+=(-e 's/memory: {cache_policy: threshold}/memory: {cache_policy: threshold, enforcement: mps}/')
fi
sed "${sed_args[@]}" configs/rag-stack.yaml > "$WORK/config.yaml"
stop_all() { ray stop --force > /dev/null 2>&1; pkill -9 -x haproxy; echo quit | nvidia-cuda-mps-control > /dev/null 2>&1; sleep 2; }
t0=$(date +%s)
if [ -n "${MEASUREMENTS:-}" ]; then  # an earlier plan --measure's measurements.json: prove only
  mkdir -p "$WORK/pm" && cp "$MEASUREMENTS" "$WORK/pm/measurements.json" || exit 2
  : > "$WORK/pm.log"
else
  taskset -c "$SERVER_CORES" timeout 300 python3 -m serve_app plan "$WORK/config.yaml" --measure \
    --targets examples/planning/rag-stack-targets.yaml --out "$WORK/pm" \
    --candidates 2 --duration-s 6 --idle-duration-s 3 > "$WORK/pm.log" 2>&1
  echo "plan --measure rc $? at $(( $(date +%s) - t0 )) s"
  grep -E "^plan --measure: .* at batch" "$WORK/pm.log" | cut -c1-220
fi
stop_all
profile_images() {  # with py-spy on PATH: where one image replica's time goes under the plan's load
  for _ in $(seq 900); do
    grep -q "planproof: plan: .* routes at once" "$WORK/pp.log" 2>/dev/null && break; sleep 0.2
  done
  sleep 3  # past the warm-up
  pid=$(pgrep -f "ServeReplica:classify-images:model" | head -1)
  [ -n "$pid" ] || { echo "no classify-images replica to profile" > "$WORK/prof.log"; return; }
  py-spy dump --pid "$pid" > "$WORK/images_dump.txt" 2>&1
  py-spy record -p "$pid" -d 8 -r 100 -f raw --threads --idle --nonblocking \
    -o "$WORK/images_replica.raw" > "$WORK/prof.log" 2>&1
}
prof_pid=""
if command -v py-spy > /dev/null; then profile_images & prof_pid=$!; fi
t1=$(date +%s)
timeout "${PROOF_TIMEOUT_S:-240}" python3 -m load_tests.benchmarks.planproof --out "$WORK/pp" --config "$WORK/config.yaml" \
  --measurements "$WORK/pm/measurements.json" --client-cores "$CLIENT_CORES" \
  --server-cores "$SERVER_CORES" --reserve-cores 1 --duration-s 15 --replan-window-s 8 \
  ${MAX_UTILIZATION:+--max-utilization "$MAX_UTILIZATION"} > "$WORK/pp.log" 2>&1
echo "planproof rc $? at $(( $(date +%s) - t1 )) s"
[ -n "$prof_pid" ] && { kill "$prof_pid" 2>/dev/null; wait "$prof_pid" 2>/dev/null; }
grep -E "planproof: (plan|naive):|verdict|failed|by stage|replan" "$WORK/pp.log" | grep -v "calibration cache" | cut -c1-400
stop_all
rm -rf "$WORK/pp/work" "$WORK/pm/calibration"
grep -vE "HAProxyManager|^\s*$" "$WORK/pm.log" | cut -c1-400 > "$WORK/pm.short.log"
grep -vE "HAProxyManager|^\s*$" "$WORK/pp.log" | cut -c1-400 > "$WORK/pp.short.log"
rm -f "$WORK/pm.log" "$WORK/pp.log"
tar czf "$OUT/planproof.tgz" -C "$WORK" .
ls -la "$OUT"
