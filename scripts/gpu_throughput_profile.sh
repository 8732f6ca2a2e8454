#!/usr/bin/env bash
# Where the server side's CPU goes while load_tests.throughput loads MiniLM replicas with one
# text per request: every process's CPU over a 5 s window of that load (from /proc), each thread
# of one replica, and py-spy's samples of that replica (all threads, 5 s). For a throughput
# figure that falls short without the model thread being busy.
# Usage, after the GPU host README's install line with .prof/py_spy-*.whl added to it (py-spy
# lands in /tmp/site/bin) and .whl, .tools, .prof carried:
#   OUT=$OUT bash scripts/gpu_throughput_profile.sh --models minilm --replicas 8 \
#     --inputs-per-request 1 --connections 256 --phases serve --gpu 0 --max-time-s 170
# PROFILE_DELAY_S (default 1): seconds into the load before sampling; past the first run's
# (8 s) for the steady state. Run from another checkout's root (an A/B), it loads that one.
# Results: $OUT/prof (cpu_top.txt, replica_threads.txt, replica_all.raw, dump.txt) and the
# throughput run under $OUT/tp.
set -u
export PATH="/tmp/site/bin:$PATH"
OUT="${OUT:-/tmp/gpu-out}"; P="$OUT/prof"; mkdir -p "$P"
OUT="$OUT/tp" bash scripts/gpu_throughput.sh "$@" > "$P/throughput.out" 2>&1 &
driver=$!
log="$OUT/tp/throughput/serve_worker.log"
for _ in $(seq 600); do
  grep -q "x1-float" "$log" 2>/dev/null && break
  if ! kill -0 "$driver" 2>/dev/null; then  # the run ended without loading: nothing to sample
    echo "the throughput run ended before any load (skipped for time? see $P/throughput.out)"
    grep -E "plan:|skipped" "$OUT/tp/throughput/run.log" 2>/dev/null
    exit 2
  fi
  sleep 0.2
done
sleep "${PROFILE_DELAY_S:-1}"  # after the load starts: 1 s sees start-up's deferred work
pid=$(pgrep -f "ServeReplica:.*:model" | head -1)
snap() {  # pid ticks command, for every process; then the replica's threads
  for d in /proc/[0-9]*; do
    s=$(cat "$d/stat" 2>/dev/null) || continue
    echo "${d#/proc/} $(echo "$s" | awk '{print $14+$15}') $(tr '\0' ' ' < "$d/cmdline" 2>/dev/null | cut -c1-110)"
  done > "$1.proc"
  for t in /proc/"$pid"/task/*; do
    s=$(cat "$t/stat" 2>/dev/null) || continue
    echo "${t##*/} $(echo "$s" | awk '{print $14+$15}') $(cat "$t/comm" 2>/dev/null)"
  done > "$1.task"
}
snap "$P/t0"; sleep 5; snap "$P/t1"
py-spy record -p "$pid" -d 5 -r 100 -f raw -o "$P/replica_all.raw" --threads --nonblocking \
  > "$P/pyspy.log" 2>&1
py-spy dump -p "$pid" > "$P/dump.txt" 2>&1
python3 - "$P" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1])
def read(path):
    out = {}
    for line in path.read_text().splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return out
for kind, name in (("proc", "cpu_top.txt"), ("task", "replica_threads.txt")):
    a, b = read(p / f"t0.{kind}"), read(p / f"t1.{kind}")
    rows = sorted(((b[k][0] - a[k][0]) / 5.0, k, b[k][1]) for k in b if k in a)[::-1]
    total = sum(r[0] for r in rows)
    lines = [f"total {total:.0f}% of a core over 5 s ({kind})"]
    lines += [f"{pct:6.1f}% {k} {cmd}" for pct, k, cmd in rows[:30] if pct > 0]
    (p / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]))
PY
wait "$driver"
grep -E "wrk -c|open-loop|serving after" "$log" | tail -6
