#!/usr/bin/env bash
# Where the server side's CPU goes while load_tests.benchmarks.throughput loads MiniLM replicas
# (one text per request, or any count): every process's CPU over a 5 s window of that load (from /proc), each thread
# of one replica, and py-spy's samples of that replica (all threads, 5 s). For a throughput
# figure that falls short without the model thread being busy.
# Usage, after the GPU host README's install line with .prof/py_spy-*.whl added to it (py-spy
# lands in /tmp/site/bin) and .whl, .tools, .prof carried:
#   OUT=$OUT bash scripts/gpu_throughput_profile.sh --models minilm --replicas 8 \
#     --inputs-per-request 1 --connections 256 --phases serve --gpu 0 --max-time-s 170
# PROFILE_DELAY_S (default 1): seconds into the load before sampling; past the first run's
# (8 s) for the steady state. Run from another checkout's root (an A/B), it loads that one.
# Results: $OUT/prof (cpu_top.txt, replica_threads.txt, replica_all.raw, dump.txt, cpu_busy.txt
# (each CPU's busy share), gpu_util.csv (nvidia-smi every 200 ms), haproxy_procs.txt,
# haproxy.cfg, haproxy_manager.raw: py-spy of Ray's HAProxyManager) and the
# throughput run under $OUT/tp.
set -u
export PATH="/tmp/site/bin:$PATH"
OUT="${OUT:-/tmp/gpu-out}"; P="$OUT/prof"; mkdir -p "$P"
OUT="$OUT/tp" bash scripts/gpu_throughput.sh "$@" > "$P/throughput.out" 2>&1 &
driver=$!
log="$OUT/tp/throughput/serve_worker.log"
for _ in $(seq 600); do
  grep -qE "minilm-x[0-9]+-(float|base64)" "$log" 2>/dev/null && break
  if ! kill -0 "$driver" 2>/dev/null; then  # the run ended without loading: nothing to sample
    echo "the throughput run ended before any load (skipped for time? see $P/throughput.out)"
    grep -E "plan:|skipped" "$OUT/tp/throughput/run.log" 2>/dev/null
    exit 2
  fi
  sleep 0.2
done
sleep "${PROFILE_DELAY_S:-1}"  # after the load starts: 1 s sees start-up's deferred work
pid=$(pgrep -f "ServeReplica:.*:model" | head -1)
snap() {  # $1.task: the replica's threads, then $1.proc: every process, as "id ticks name",
  # each file headed by "T <epoch s>" (when its walk began: the rates divide by the real gap)
  { echo "T $(date +%s.%N)"
    for t in /proc/"$pid"/task/*; do
      s=$(cat "$t/stat" 2>/dev/null) || continue
      echo "${t##*/} $(echo "$s" | awk '{print $14+$15}') $(cat "$t/comm" 2>/dev/null)"
    done; } > "$1.task"
  { echo "T $(date +%s.%N)"
    for d in /proc/[0-9]*; do
      s=$(cat "$d/stat" 2>/dev/null) || continue
      echo "${d#/proc/} $(echo "$s" | awk '{print $14+$15}') $(tr '\0' ' ' < "$d/cmdline" 2>/dev/null | cut -c1-110)"
    done; } > "$1.proc"
}
gpu_util() {  # the GPU's utilisation and SM clock, every 200 ms, for the 5 s window
  timeout 5 nvidia-smi --query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw \
    --format=csv,noheader -lms 200 > "$P/gpu_util.csv" 2>&1
}
gpu_util & gpid=$!
cp /proc/stat "$P/t0.stat"; snap "$P/t0"; sleep 5; snap "$P/t1"; cp /proc/stat "$P/t1.stat"
wait "$gpid" 2>/dev/null
ps -o pid,etimes,pcpu,args -C haproxy > "$P/haproxy_procs.txt" 2>&1  # etimes: a reload is young
cfg=$(pgrep -af "haproxy -db -f" | grep -o -- "-f [^ ]*" | head -1 | cut -d" " -f2)
[ -n "$cfg" ] && cp "$cfg" "$P/haproxy.cfg" 2>/dev/null
mgr=$(pgrep -f "ray::HAProxyManager" | head -1); mpid=""
if [ -n "$mgr" ]; then  # Ray's manager of HAProxy: what it does while the load runs
  py-spy record -p "$mgr" -d 5 -r 100 -f raw -o "$P/haproxy_manager.raw" --threads \
    --nonblocking > "$P/pyspy_manager.log" 2>&1 & mpid=$!
fi
# PYSPY_FLAGS (default --nonblocking): py-spy record's mode for the replica, e.g. --native
# (which py-spy takes only in blocking mode); PYSPY_FLAGS2: a second 5 s record with these
# flags, into replica_all2.raw (e.g. "--nonblocking --gil").
py-spy record -p "$pid" -d 5 -r 100 -f raw -o "$P/replica_all.raw" --threads \
  ${PYSPY_FLAGS:---nonblocking} > "$P/pyspy.log" 2>&1
if [ -n "${PYSPY_FLAGS2:-}" ]; then
  py-spy record -p "$pid" -d 5 -r 100 -f raw -o "$P/replica_all2.raw" --threads \
    $PYSPY_FLAGS2 > "$P/pyspy2.log" 2>&1
fi
[ -n "$mpid" ] && wait "$mpid"
py-spy dump -p "$pid" > "$P/dump.txt" 2>&1
python3 - "$P" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1])
def read(path):  # (when the walk began, {id: (ticks, name)})
    out, t = {}, 0.0
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if parts[0] == "T":
            t = float(parts[1])
        elif len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = (int(parts[1]), parts[2] if len(parts) > 2 else "")
    return t, out
def cpu_busy(path):  # /proc/stat: cpuN -> (busy ticks, all ticks)
    out = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if f and f[0].startswith("cpu") and f[0] != "cpu":
            v = [int(x) for x in f[1:]]
            out[f[0]] = (sum(v) - v[3] - v[4], sum(v))
    return out
a, b = cpu_busy(p / "t0.stat"), cpu_busy(p / "t1.stat")
busy = {c: 100.0 * (b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]) for c in b if c in a}
line = " ".join(f"{c[3:]}:{v:.0f}" for c, v in sorted(busy.items(), key=lambda kv: int(kv[0][3:])))
(p / "cpu_busy.txt").write_text("per-CPU busy % over the 5 s window: " + line + "\n")
print("per-CPU busy %:", line)
for kind, name in (("proc", "cpu_top.txt"), ("task", "replica_threads.txt")):
    (ta, a), (tb, b) = read(p / f"t0.{kind}"), read(p / f"t1.{kind}")
    gap_s = tb - ta if tb > ta else 5.0  # ticks are 1/100 s: ticks / gap_s is % of a core
    rows = sorted(((b[k][0] - a[k][0]) / gap_s, k, b[k][1]) for k in b if k in a)[::-1]
    total = sum(r[0] for r in rows)
    lines = [f"total {total:.0f}% of a core over {gap_s:.2f} s ({kind})"]
    lines += [f"{pct:6.1f}% {k} {cmd}" for pct, k, cmd in rows[:30] if pct > 0]
    (p / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]))
PY
wait "$driver"
grep -E "wrk -c|open-loop|serving after" "$log" | tail -6
