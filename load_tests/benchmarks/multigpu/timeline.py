"""The grab part's timeline: a sample every 0.5 s in a thread (rows.grab_sample), the document
rewritten as it goes, and its PNG through load_tests.harness.plots when matplotlib is
installed (it is not required: the JSON is the record)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from load_tests.benchmarks.multigpu import rows
from load_tests.benchmarks.multigpu.common import write_json
from load_tests.harness.load import Load
from load_tests.harness.run import log

SAMPLE_PERIOD_S = 0.5
MAP_PERIOD_S = 2.0  # how often /v1/memory is read for replica id -> GPU
INF = float("inf")
ZERO = {"ok": 0, "failed": 0, "lost": 0}


def running_count(replica_states: Mapping[Any, int]) -> int:
    """RUNNING replicas in serve.status()'s replica_states (keyed by ReplicaState)."""
    return sum(
        int(v) for k, v in replica_states.items() if str(getattr(k, "value", k)) == "RUNNING"
    )


class Timeline:
    """Samples every SAMPLE_PERIOD_S in a thread; ``doc`` is rewritten to ``path`` every few."""

    def __init__(self, doc: dict[str, Any], path: Path, base: str, loads: dict[str, Load]):
        self.doc, self.path, self.base, self.loads = doc, path, base, loads
        self.apps = {uuid: f"gpu{i}" for i, uuid in enumerate(doc["replica_gpus"])}
        self.t0 = time.monotonic()
        self.gpu_of: dict[str, str] = {}
        self._seen = dict.fromkeys(self.apps, 0)
        self._last_t = 0.0
        self._map_at = -MAP_PERIOD_S
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def phase(self, name: str) -> None:
        self.doc["phases"].append({"name": name, "t_s": round(self.now(), 2)})
        log(f"grab: ===== {name} (t={self.now():.1f} s) =====")

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def write(self) -> None:
        write_json(self.path, self.doc)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(SAMPLE_PERIOD_S - self.now() % SAMPLE_PERIOD_S):
            try:
                self.doc["samples"].append(self.sample())
            except Exception as exc:  # noqa: BLE001 - keep sampling; the log says why
                log(f"grab: sample failed: {type(exc).__name__}: {exc}")
            n += 1
            if n % 10 == 0:
                try:
                    self.write()
                except (OSError, RuntimeError, ValueError) as exc:  # doc changed mid-dump
                    log(f"grab: timeline write failed (the next one will do): {exc!r}")

    def _refresh_map(self, t: float) -> None:
        if t - self._map_at < MAP_PERIOD_S:
            return
        self._map_at = t
        try:
            doc = httpx.get(f"{self.base}/gpu0/v1/memory", timeout=5.0).json()
            self.gpu_of.update(rows.replica_gpus(doc.get("replicas") or []))
        except (httpx.HTTPError, ValueError) as exc:
            log(f"grab: /v1/memory failed: {exc!r}")

    def sample(self) -> dict[str, Any]:
        from ray import serve

        from serve_app.control import monitor
        from serve_app.gpu import nvml

        t = self.now()
        self._refresh_map(t)
        status = serve.status().applications
        running, target, reason = {}, {}, {}
        for uuid, app in self.apps.items():
            dep = status[app].deployments.get("model") if app in status else None
            running[uuid] = running_count(dep.replica_states) if dep is not None else 0
        try:
            decisions = monitor.status_snapshot(timeout_s=1.0).decisions
        except Exception:  # noqa: BLE001 - the sample is still useful without it
            decisions = {}
        for uuid, app in self.apps.items():
            rec = decisions.get(f"{app}/model")
            target[uuid] = rec.target_replicas if rec else None
            reason[uuid] = str(rec.reason) if rec else None
        devices = nvml.all_devices()
        free = {}
        if not isinstance(devices, nvml.NvmlError):
            free = {d.uuid: d.free_bytes for d in devices}
        by_app: dict[str, dict[str, int]] = {}
        by_answering: dict[str, dict[str, int]] = {}
        elsewhere = 0
        for uuid, load in list(self.loads.items()):  # the driver adds loads as apps answer
            new = load.snapshot()[self._seen[uuid] :]
            self._seen[uuid] += len(new)
            mine = rows.answers_by_gpu(new, {}, -INF, INF)
            by_app[uuid] = mine.get(rows.UNATTRIBUTED, dict(ZERO))
            for gpu, c in rows.answers_by_gpu(new, self.gpu_of, -INF, INF).items():
                into = by_answering.setdefault(gpu, dict(ZERO))
                for k, v in c.items():
                    into[k] += v
                if gpu not in (uuid, rows.UNATTRIBUTED):
                    elsewhere += sum(c.values())
        sample = rows.grab_sample(
            t_s=t,
            dt_s=t - self._last_t if self._last_t else SAMPLE_PERIOD_S,
            phase=self.doc["phases"][-1]["name"] if self.doc["phases"] else None,
            running_by_gpu=running,
            target_by_gpu=target,
            reason_by_gpu=reason,
            free_by_gpu={u: free[u] for u in self.apps if u in free},
            by_app=by_app,
            by_answering_gpu=by_answering,
            answered_elsewhere=elsewhere,
        )
        self._last_t = t
        return sample


def plot(doc: dict[str, Any], png: Path) -> None:
    """The timeline's PNG when matplotlib is installed (noted, not required, when it is not)."""
    from load_tests.harness.plots import PlotsUnavailable, plot_timeline

    try:
        doc["plot"] = str(plot_timeline(doc, png))
    except PlotsUnavailable as exc:
        doc["notes"].append(
            f"no PNG: {exc}; then: python -m load_tests.harness.plots {png.with_suffix('.json')}"
        )
    except Exception as exc:  # noqa: BLE001 - the JSON is the record; the plot can be redone
        doc["notes"].append(f"plotting failed: {type(exc).__name__}: {exc}")
