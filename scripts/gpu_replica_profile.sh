#!/usr/bin/env bash
# On the GPU host: where one serve_app replica's CPU goes under load.
#  1. load_tests.launch_probe: in-process costs (forward eager vs CUDA graph, decode, predict).
#  2. For each model: one replica x 1.0 GPU held at a fixed rate by load_tests.side_by_side;
#     py-spy samples the replica (with native frames, then GIL holders only) and every process's
#     CPU time is read from /proc over the same window.
# Needs py-spy on PATH (the py_spy wheel installed with the others). Results: $OUT/profile.tgz
set -u
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
OUT="${OUT:-/tmp/gpu-out}"; RES=/tmp/replica-profile; mkdir -p "$OUT" "$RES"
export PATH="/tmp/site/bin:$PATH"
timeout 150 python3 -m load_tests.launch_probe --out "$RES" > "$RES/launch_probe.log" 2>&1
echo "launch_probe exit $?" | tee -a "$RES/launch_probe.log"

cpu_snapshot() {  # every process's utime+stime (clock ticks) and its command line
  for d in /proc/[0-9]*; do
    stat=$(cat "$d/stat" 2>/dev/null) || continue
    cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null | cut -c1-120)
    echo "${d#/proc/} $(echo "$stat" | awk '{print $14+$15}') $cmd"
  done
}

profile() {  # name model rate
  local name=$1 model=$2 rate=$3 log="$RES/$1.log"
  timeout 200 python3 -m load_tests.side_by_side --only serve_app --models "$model" \
    --replicas 1 --moderate-rate "$rate" --max-rate "$rate" --duration-s 40 --retries 0 \
    --refine 0 --max-time-s 180 --out "$RES/$name" > "$log" 2>&1 &
  local driver=$!
  for _ in $(seq 240); do grep -q "sweeping" "$log" && break; sleep 0.5; done
  local pid
  pid=$(grep -l "[S]erveReplica" /proc/[0-9]*/cmdline 2>/dev/null | head -1 | cut -d/ -f3)
  echo "replica pid ${pid:-none}" > "$RES/$name.pid"
  sleep 6  # past the 1 s warm-up and the first seconds of the point
  cpu_snapshot > "$RES/$name.cpu0"; date +%s.%N > "$RES/$name.t0"
  if [ -n "${pid:-}" ]; then
    timeout 20 py-spy record --pid "$pid" --native --nonblocking --rate 50 --duration 10 --format raw \
      --output "$RES/$name.native.txt" >> "$RES/$name.pyspy.log" 2>&1
    timeout 20 py-spy record --pid "$pid" --gil --nonblocking --rate 100 --duration 10 --format raw \
      --output "$RES/$name.gil.txt" >> "$RES/$name.pyspy.log" 2>&1
    timeout 10 py-spy dump --pid "$pid" > "$RES/$name.dump.txt" 2>&1
  fi
  cpu_snapshot > "$RES/$name.cpu1"; date +%s.%N > "$RES/$name.t1"
  wait "$driver"; echo "$name exit $?" >> "$log"
  grep -E "offered|exit" "$log" | tail -3; cat "$RES/$name.pid"; tail -2 "$RES/$name.pyspy.log"
}
profile resnet resnet50 300
profile minilm minilm 300
tar -czf "$OUT/profile.tgz" -C "$RES" .
