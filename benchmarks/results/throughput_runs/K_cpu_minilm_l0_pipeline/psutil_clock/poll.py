import psutil, time, sys
sys.path.insert(0, '/work/main')
from load_tests.benchmarks.throughput.proccpu import snapshot
root = int(sys.argv[1]); end = time.time() + float(sys.argv[2])
hist = []  # (t, snapshot)
seen = set()
while time.time() < end:
    t = time.time()
    try:
        snap = snapshot([root], count_roots=False)
    except Exception as e:
        print('snap err', e); break
    hist.append((t, snap)); hist = hist[-60:]
    for p in psutil.process_iter(["name", "create_time"]):
        if p.info["name"] == "haproxy" and p.pid not in seen:
            seen.add(p.pid)
            print(f"{t:.2f} haproxy pid {p.pid} created {p.info['create_time']:.2f} in snapshot now: {p.pid in snap}", flush=True)
            for th, s in hist:
                if th >= p.info['create_time'] - 0.1:
                    e = s.get(p.pid)
                    print(f"   snapshot at {th:.2f}: {'absent' if e is None else (e.kind, round(e.create_time_s,2))}", flush=True)
    time.sleep(0.1)
