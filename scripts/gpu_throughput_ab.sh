#!/usr/bin/env bash
# A steady-state throughput A/B on one GPU host: this checkout ("head") against another
# checkout's root ("base", e.g. `git archive 97e0303` unpacked in .ab_base, whose own
# load_tests and scripts run it), in the order head, base, base, head (ABBA: a drift over the
# call weighs on both sides alike; ORDER sets another, e.g. "head base"), each run profiled by
# scripts/gpu_throughput_profile.sh with the same arguments. A run starts only while RUN_S
# seconds (default 125) are left of CALL_S (default 560, counted from T0, default now).
# BASE_COMMIT names the base's commit in its results (the copied trees have no .git).
# Usage, after the GPU host README's install line with .prof/py_spy-*.whl added to it and .whl,
# .tools, .prof and the base checkout carried:
#   BASE=.ab_base OUT=$OUT bash scripts/gpu_throughput_ab.sh --models minilm --replicas 8 \
#     --inputs-per-request 1 --connections 256,256,256 --phases serve --gpu 0 --max-time-s 170
# Results: $OUT/ab/<n>_<side>/ (prof/ and tp/, as gpu_throughput_profile.sh writes them) and
# $OUT/ab/summary.txt (each run's wrk and open-loop lines).
set -u
ROOT=$PWD
BASE=$(cd "${BASE:?set BASE to the root of the other checkout}" && pwd)
OUT="${OUT:-/tmp/gpu-out}/ab"; mkdir -p "$OUT"
CALL_S=${CALL_S:-560}; RUN_S=${RUN_S:-125}; T0=${T0:-$(date +%s)}
# The 5 s profile inside a wrk try (8 s each): in the second of several, else 3 s into the one.
tries=1; prev=""
for arg in "$@"; do
  [ "$prev" = "--connections" ] && tries=$(($(tr -cd , <<< "$arg" | wc -c) + 1)); prev=$arg
done
if [ "$tries" -gt 1 ]; then default_delay=12; else default_delay=3; fi
export PROFILE_DELAY_S=${PROFILE_DELAY_S:-$default_delay}
n=0
for side in ${ORDER:-head base base head}; do
  left=$((CALL_S - ($(date +%s) - T0)))
  if [ "$left" -lt "$RUN_S" ]; then
    echo "stopped before run $((n + 1)) ($side): ${left} s left, a run takes about ${RUN_S} s" \
      | tee -a "$OUT/summary.txt"
    break
  fi
  n=$((n + 1)); dir="$OUT/${n}_$side"
  if [ "$side" = head ]; then
    OUT="$dir" bash scripts/gpu_throughput_profile.sh "$@" > "$dir.log" 2>&1
  else
    (cd "$BASE" && PYTHONPATH="/tmp/site:$BASE" OUT="$dir" \
      SERVE_APP_CODE_COMMIT="${BASE_COMMIT:-${SERVE_APP_CODE_COMMIT:-}}" \
      bash "$ROOT/scripts/gpu_throughput_profile.sh" "$@") > "$dir.log" 2>&1
  fi
  rc=$?
  { echo "run $n $side (exit $rc)"
    grep -hE "serving after|wrk -c|open-loop [0-9]" "$dir"/tp/throughput/run.log 2>/dev/null
    cat "$dir/prof/cpu_busy.txt" 2>/dev/null; } | tee -a "$OUT/summary.txt"
done
