"""One target measured by both clients: wrk's best over a few connection counts, then the
open-loop client at a fraction of that rate; and each client's own ceiling against the no-op."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput import proccpu, rows, stats
from load_tests.benchmarks.throughput.payload import Payload
from load_tests.harness.openloop import OpenLoopPool
from load_tests.harness.wrk import WrkTarget, best_try, run_wrk


@dataclass
class Clients:
    """wrk (None when there is none) and the open-loop pool, pinned to the client cores.
    ``server_cpu``, when set, is sampled just before and after each wrk try and open-loop
    point; the try or point then carries the server's CPU per 1,000 requests answered."""

    wrk: str | None
    pool: OpenLoopPool
    cfg: Mapping[str, Any]
    work_dir: Path
    log: Callable[[str], None]
    server_cpu: proccpu.ServerCpu | None = None

    @property
    def client_pids(self) -> list[int]:
        """The open-loop workers' pids: never counted as the server's."""
        return [p.pid for p in self.pool.procs]

    @property
    def cores(self) -> list[int]:
        return list(self.cfg["client_cores"])

    def wrk_tries(self, target: WrkTarget, duration_s: float) -> list[dict[str, Any]]:
        if self.wrk is None:
            return []
        tries = []
        for connections in self.cfg["connections"]:
            if self.server_cpu is not None:
                self.server_cpu.start()
            t = run_wrk(
                self.wrk,
                target,
                connections=connections,
                threads=len(self.cores),
                duration_s=duration_s,
                cores=self.cores,
                work_dir=self.work_dir,
            )
            if self.server_cpu is not None:  # wrk's count: answers of any status
                t.update(self.server_cpu.stop(int(t.get("requests") or 0)))
            tries.append(t)
            self.log(f"  wrk -c{connections}: {_describe(t)}")
            time.sleep(self.cfg["pause_s"])
        return tries

    def openloop(
        self,
        url: str,
        payload: Payload,
        rate: float,
        duration_s: float,
        warmup_s: float | None = None,
    ) -> dict[str, Any]:
        if self.server_cpu is not None:
            self.server_cpu.start()
        s = self.pool.point(
            url,
            payload.headers,
            payload.write(self.work_dir),
            rate_per_s=rate,
            duration_s=duration_s,
            warmup_s=self.cfg["warmup_s"] if warmup_s is None else warmup_s,
            connections=self.cfg["openloop_connections"],
            seed=self.cfg["seed"],
            poisson=self.cfg["poisson"],
        )
        if self.server_cpu is not None:
            # Every answer in the CPU window (warm-up and drain too), not only the measured ones.
            s.update(self.server_cpu.stop(answered(self.pool.last_arrays)))
        self.log(f"  open-loop {rate:,.0f}/s: {_describe(s)}")
        return s


def answered(arrays: Sequence[Any]) -> int:
    """Requests that got an HTTP answer (any status) in an open-loop point's records."""
    return int(sum(int((a[3] > 0).sum()) for a in arrays))


def _describe(t: Mapping[str, Any]) -> str:
    if t.get("error"):
        return f"ERROR {str(t['error'])[:300]}"
    keep = "" if t.get("client_keeps_up", True) else " CLIENT BEHIND"
    cpu = t.get("server_cpu_s_per_1000_requests")
    cpu_text = f", server CPU {cpu:.3f} s/1000 req" if cpu is not None else ""
    return (
        f"{t.get('requests_per_s', 0):,.0f} 2xx/s, p50 {t.get('p50_ms') or 0:.2f} ms, "
        f"p99 {t.get('p99_ms') or 0:.2f} ms, errors {t.get('errors')}{keep}{cpu_text}"
    )


def no_wrk_note(cfg: Mapping[str, Any]) -> str:
    return (
        f"no wrk: neither {cfg['wrk']} nor wrk on PATH; the closed-loop maximum was not "
        "measured (no number is given for it)"
    )


def measure_served(
    clients: Clients, base_url: str, payload: Payload, common: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """wrk's best rate on ``base_url + payload.path``, then the open-loop client at
    ``openloop_fraction`` of it (at a small fixed rate when there is no wrk, said in the note)."""
    cfg = clients.cfg
    url = base_url + payload.path
    target = WrkTarget(url, payload.headers, payload.write(clients.work_dir))
    out: list[dict[str, Any]] = []
    status, answer = probe(url, payload)
    common = dict(common, response_bytes=len(answer))
    if not 200 <= status < 300:
        note = f"the payload's probe got HTTP {status}: {answer[:500]!r}"
        return [rows.status_row(common, c, "error", note) for c in ("wrk", "open-loop")]
    t0 = time.time()
    tries = clients.wrk_tries(target, cfg["duration_s"])
    best = best_try(tries)
    if clients.wrk is None:
        out.append(rows.status_row(common, "wrk", "skipped", no_wrk_note(cfg)))
    else:
        out.append(rows.wrk_row(common, tries))
    out[-1].update(started_unix_s=t0, ended_unix_s=time.time())
    if best is not None and best["requests_per_s"] > 0:
        rate = cfg["openloop_fraction"] * best["requests_per_s"]
        note = f"{cfg['openloop_fraction']:.0%} of wrk's best ({best['requests_per_s']:,.0f}/s)"
    else:
        rate = cfg["fixed_rate_without_wrk"]
        note = f"fixed {rate:g}/s: no wrk rate to take a fraction of"
    t0 = time.time()
    try:
        s = clients.openloop(url, payload, rate, cfg["duration_s"])
        row = rows.openloop_row(common, s)
        row["note"] = note
    except Exception as exc:  # noqa: BLE001 - recorded in the row, the run goes on
        row = rows.status_row(common, "open-loop", "error", f"{type(exc).__name__}: {exc}")
    row.update(started_unix_s=t0, ended_unix_s=time.time())
    out.append(row)
    time.sleep(cfg["pause_s"])
    return out


def probe(url: str, payload: Payload, timeout_s: float = 30.0) -> tuple[int, bytes]:
    """One request with each of ``payload``'s bodies, in turn: the status (0 when it failed)
    and answer of the first that did not get a 2xx, else of the last."""
    import httpx

    status, answer = 0, b""
    with httpx.Client(timeout=timeout_s) as client:
        for body in payload.all_bodies:
            try:
                resp = client.post(url, content=body, headers=payload.headers)
            except httpx.HTTPError as exc:
                return 0, repr(exc).encode()
            status, answer = resp.status_code, resp.content
            if not 200 <= status < 300:
                return status, answer
    return status, answer


def measure_client_ceiling(
    clients: Clients, url: str, payload: Payload, common: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Both clients against the no-op server's ``url`` with ``payload``: wrk's best, and the
    highest rate the open-loop client sustains (stats.next_ceiling_rate's search)."""
    cfg = clients.cfg
    target = WrkTarget(url, payload.headers, payload.write(clients.work_dir))
    out: list[dict[str, Any]] = []
    if clients.wrk is None:
        out.append(rows.status_row(common, "wrk", "skipped", no_wrk_note(cfg)))
    else:
        out.append(rows.wrk_row(common, clients.wrk_tries(target, cfg["ceiling_duration_s"])))
    start = min(
        cfg["ceiling_start_rate"], cfg["ceiling_max_bytes_per_s"] / max(1, len(payload.body))
    )
    start = max(start, cfg["ceiling_start_rate"] / 64)
    history: list[tuple[float, bool]] = []
    points: list[dict[str, Any]] = []
    try:
        while len(points) < cfg["ceiling_max_points"]:
            rate = stats.next_ceiling_rate(history, start, 2.0, cfg["ceiling_max_rate"])
            if rate is None:
                break
            s = clients.openloop(
                url, payload, rate, cfg["ceiling_duration_s"], cfg["ceiling_warmup_s"]
            )
            points.append(s)
            history.append((rate, stats.ceiling_point_passes(s)))
            time.sleep(cfg["pause_s"] / 2)
    except Exception as exc:  # noqa: BLE001 - recorded in the row, the run goes on
        out.append(rows.status_row(common, "open-loop", "error", f"{type(exc).__name__}: {exc}"))
        return out
    found = stats.client_ceiling(points)
    best = found["best_point"]
    row = rows.openloop_row(common, best) if best else rows.new_row(**common, client="open-loop")
    row.update(
        status="ok" if best else "error",
        requests_per_s=found["sustained_per_s"],
        items_per_s=None,
        texts_per_s=None,
        tokens_per_s=None,
        max_carried_per_s=found["max_carried_per_s"],
        points=[{k: p.get(k) for k in _POINT_KEYS} for p in points],
        note=(
            f"highest offered rate sustained (kept its schedule: sends at most "
            f"{cfg['max_send_lag_p99_ms']:g} ms late at p99; no errors, >= 97% answered); "
            f"search from {start:,.0f}/s, x2 up to {cfg['ceiling_max_rate']:,.0f}/s"
            if best
            else "no rate passed: the open-loop client could not keep any rate tried "
            "(see points: send lag, client CPU, errors)"
        ),
    )
    if best is not None:
        # The server's CPU over every passing point: HAProxy's static answer costs about the
        # same at any rate it sustains, and one short point may hold only a few 10 ms ticks.
        row.update(proccpu.combined([p for p in points if stats.ceiling_point_passes(p)]))
    if best is not None and best["offered_per_s"] * 2.0 > cfg["ceiling_max_rate"]:
        row["note"] += " (the search's top rate passed: the ceiling is at least this)"
    out.append(row)
    return out


_POINT_KEYS = (
    "offered_per_s",
    "server_cpu_s_per_1000_requests",
    "scheduled_per_s",
    "requests_per_s",
    "p50_ms",
    "p99_ms",
    "errors",
    "send_lag_p99_ms",
    "client_cpu_frac_max",
    "client_keeps_up",
)
