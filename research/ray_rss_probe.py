"""How a bare Ray 2.60 actor's RSS moves over time, to read the soak's RSS creep against.

    python -m research.ray_rss_probe --seconds 300

Three actors, each sampling its own RSS every 15 s: ``idle`` sleeps, ``put`` sends a
60-key dict to a registry actor once a second (as a replica's report loop does), ``ctx`` reads
``ray.get_runtime_context().get_node_id()`` once a second (as every report does). Prints each
one's RSS change in MB from its sample at 30 s on. CPU only, local Ray on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

MODES = ("idle", "put", "ctx")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m research.ray_rss_probe")
    p.add_argument("--seconds", type=float, default=300.0)
    a = p.parse_args()
    import psutil
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Registry:
        def __init__(self) -> None:
            self.d: dict[str, Any] = {}

        def put(self, key: str, value: Any) -> None:
            self.d[key] = value

    @ray.remote
    class Probe:
        def __init__(self, mode: str, registry: Any) -> None:
            self.mode, self.registry = mode, registry

        def run(self, seconds: float) -> list[tuple[int, int]]:
            proc, out, n = psutil.Process(os.getpid()), [], 0
            report = {f"k{i}": i * 1.5 for i in range(60)}
            t0 = time.time()
            while time.time() - t0 < seconds:
                if self.mode == "put":
                    self.registry.put.remote("r", dict(report, t=time.time()))
                elif self.mode == "ctx":
                    ray.get_runtime_context().get_node_id()
                n += 1
                if n % 15 == 0:
                    out.append((round(time.time() - t0), proc.memory_info().rss))
                time.sleep(1.0)
            return out

    try:
        registry = Registry.remote()  # type: ignore[attr-defined]
        probes = [Probe.remote(m, registry) for m in MODES]  # type: ignore[attr-defined]
        results = ray.get([p.run.remote(a.seconds) for p in probes])
        for mode, samples in zip(MODES, results, strict=True):
            later = [(t, rss) for t, rss in samples if t >= 30]
            base = later[0][1] if later else 0
            print(mode, [(t, round((rss - base) / 1e6, 2)) for t, rss in later], flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
