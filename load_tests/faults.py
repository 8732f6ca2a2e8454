"""CPU fault suite, one command: faults injected into a local 2-replica serve_app under load.

    python -m load_tests.faults --out faults.json          # ~2 minutes on 2 cores

It starts its own Ray and Serve on 127.0.0.1 (as `serve-app run` does: HAProxy ingress, the
retry settings of serve_app.ops.launch), deploys two CPU MiniLM replicas, and runs:

- ``sigkill``: one replica gets SIGKILL under load (8 clients);
- ``sigstop``: one replica is frozen (SIGSTOP) for ``--stop-s`` seconds under load, then SIGCONT;
- ``overload``: an open-loop load at 3x the measured capacity for ``--overload-s`` seconds
  (the app's queue is bounded small, so that the bound, not the client, is what answers);
- ``hostile:*``: bodies meant to hurt: a gzip bomb sent with Content-Encoding: gzip, a
  Content-Length longer than the body (then the client half-closes), deep JSON nesting, a huge
  string under the body limit, a body over it.

Each fault is a row of faults.json: ``fault, sent, lost, failed, recovery_s`` (+ ``detail``).
``failed`` counts deliberate answers (a JSON 4xx, 503 overloaded, 504 timeout); ``lost`` counts
requests with no answer, a non-JSON answer or another 5xx (for hostile bodies, also a normal
request that fails after one). ``recovery_s``: kill and stop, from the fault until every
replica is UP in HAProxy and /readyz shows nothing degraded; overload, from its end until a
request is answered 200; hostile, from the body until a normal request is answered 200.
Only 127.0.0.1 is ever targeted; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from serve_app.control.monitor import pid_alive

APP = "faults"
BODY = {"input": [f"sentence {i} for the fault suite" for i in range(8)]}
CLIENTS = 8
MAX_REQUESTS_PER_CLIENT = 100_000  # a bound only: the stop event ends each client
CLIENT_TIMEOUT_S = 60.0
WHOLE_TIMEOUT_S = 120.0
# The suite's app: the queue is bounded small so that 3x overload meets the bound in seconds.
ARGS = {
    "adapter": "embeddings",
    "max_batch_size": 16,
    "batch_wait_timeout_s": 0.0,
    "max_queued_items": 256,
    "queue_deadline_s": 2.0,
    "request_timeout_s": 10.0,
}


@dataclass
class Row:
    fault: str
    sent: int
    lost: int
    failed: int
    recovery_s: float | None
    detail: dict[str, Any] = field(default_factory=dict)


def classify(status: int | str, content_type: str) -> str:
    """'ok', 'failed' (a deliberate JSON refusal) or 'lost' for one answer (an int status) or
    one client error (a string)."""
    if isinstance(status, str):
        return "lost"
    if status == 200:
        return "ok"
    deliberate = status < 500 or status in (503, 504)
    return "failed" if deliberate and content_type.startswith("application/json") else "lost"


def tally(outcomes: list[tuple[int | str, str]]) -> tuple[int, int, dict[str, int]]:
    kinds = Counter(classify(s, ct) for s, ct in outcomes)
    statuses = Counter(str(s) if isinstance(s, int) else s.split("(")[0] for s, _ in outcomes)
    return kinds["lost"], kinds["failed"], dict(statuses)


Result = tuple[float, float, int | str, str, str]


class Load:
    """``clients`` threads posting BODY until stopped, each at most ``max_requests`` times:
    (send time, seconds taken, status, content type, the replica that answered or "")."""

    def __init__(
        self,
        url: str,
        clients: int = CLIENTS,
        max_requests: int = MAX_REQUESTS_PER_CLIENT,
        body: dict[str, Any] | None = None,
    ):
        self.url = url
        self.body = BODY if body is None else body
        self.max_requests = max_requests
        self.stop = threading.Event()
        self.results: list[Result] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            for _ in range(self.max_requests):
                if self.stop.is_set():
                    return
                t0 = time.monotonic()
                try:
                    resp = client.post(self.url, json=self.body)
                    out: tuple[int | str, str, str] = (
                        resp.status_code,
                        resp.headers.get("content-type", ""),
                        resp.headers.get("x-serve-app-replica", ""),
                    )
                except httpx.HTTPError as exc:
                    out = (f"{type(exc).__name__}({exc})", "", "")
                with self._lock:
                    self.results.append((t0, time.monotonic() - t0, *out))

    def snapshot(self) -> list[Result]:
        with self._lock:
            return list(self.results)

    def tally(self, results: list[Result] | None = None) -> tuple[int, int, dict[str, int]]:
        """``tally`` of these results (all of them by default)."""
        rows = self.snapshot() if results is None else results
        return tally([(r[2], r[3]) for r in rows])

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=CLIENT_TIMEOUT_S + 10.0)


# ---- the cluster ---------------------------------------------------------------------------


@dataclass
class Target:
    base: str  # http://127.0.0.1:PORT/faults
    node_id: str
    replicas: int = 2

    @property
    def url(self) -> str:
        return f"{self.base}/v1/embeddings"


def start_cluster(
    replicas: int = 2,
    args: dict[str, Any] | None = None,
    actor_options: dict[str, Any] | None = None,
    num_gpus: int = 0,
    num_cpus: int = 8,
    timeout_s: float = WHOLE_TIMEOUT_S,
) -> Target:
    """Ray and Serve on 127.0.0.1 (HAProxy, launch.start_ray's settings) and ``replicas`` of
    the app; returns once every replica is UP in HAProxy."""
    from serve_app.ops import launch
    from serve_app.startup import warmpool

    launch.private_haproxy_ports()
    port = launch.free_port()
    from serve_app.config.args import parse_args

    app_args = parse_args(args or ARGS)
    launch.start_ray(
        num_gpus,
        True,
        num_cpus,
        request_timeout_s=app_args.request_timeout_s,
        system_config=warmpool.system_config([app_args.adapter], app_args.warm_workers),
    )
    import ray
    from ray import serve

    from serve_app.serving.replica import ModelServer

    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    app = ModelServer.options(  # type: ignore[attr-defined]
        num_replicas=replicas, ray_actor_options=actor_options or {"num_cpus": 0.5}
    ).bind(app_args.model_dump())
    serve.run(app, name=APP, route_prefix=f"/{APP}")
    node_id = ray.get_runtime_context().get_node_id()
    target = Target(f"http://127.0.0.1:{port}/{APP}", node_id, replicas)
    launch.wait_ready(target.base, timeout_s)
    wait_whole(target, timeout_s=timeout_s)
    return target


def haproxy_rows(target: Target) -> dict[str, dict[str, str]]:
    """Replica id -> HAProxy's ``show stat`` row, for this app's replicas."""
    from serve_app.ops.launch import haproxy_servers

    prefix = f"http-{APP}/SERVE_REPLICA_{APP}-model-"
    servers = haproxy_servers(target.node_id)
    return {name[len(prefix) :]: s for name, s in servers.items() if name.startswith(prefix)}


def haproxy_up(target: Target) -> dict[str, str]:
    """Replica id -> HAProxy status, for this app's replicas."""
    return {rid: row["status"] for rid, row in haproxy_rows(target).items()}


def wait_whole(
    target: Target,
    replicas: int | None = None,
    timeout_s: float = WHOLE_TIMEOUT_S,
    exclude: frozenset[str] | set[str] = frozenset(),
) -> float | None:
    """Seconds until /readyz shows nothing degraded and HAProxy has ``replicas`` (default: the
    target's) UP, not counting ``exclude`` (replicas known dead, which HAProxy may show UP for a
    moment); None if that did not happen within ``timeout_s``."""
    want = target.replicas if replicas is None else replicas
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            ready = httpx.get(f"{target.base}/readyz", timeout=10.0).json()
            up = [r for r, s in haproxy_up(target).items() if s == "UP" and r not in exclude]
            if ready.get("ready") and not ready.get("degraded") and len(up) >= want:
                return time.monotonic() - t0
        except (httpx.HTTPError, OSError, ValueError):
            pass
        time.sleep(0.25)
    return None


def replica_pids(target: Target) -> dict[str, int]:
    """Replica id -> pid, for the replicas that reported lately (a dead one may linger for
    REPORT_MAX_AGE_S: check the pid before trusting it)."""
    report = httpx.get(f"{target.base}/v1/memory", timeout=30.0).json()["replicas"]
    return {r["replica_id"]: int(r["pid"]) for r in report}


class RotationWatch:
    """Polls HAProxy every 0.1 s in a thread: when ``victim`` first stops being UP (DOWN,
    MAINT, or gone from the backend), in seconds after ``since``."""

    def __init__(self, target: Target, victim: str, since: float):
        self.target, self.victim, self.since = target, victim, since
        self.out_s: float | None = None
        self.states: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set() and self.out_s is None:
            try:
                status = haproxy_up(self.target).get(self.victim, "gone")
            except OSError:
                status = None
            if status is not None:
                if not self.states or self.states[-1] != status:
                    self.states.append(status)
                if not status.startswith("UP"):
                    self.out_s = round(time.monotonic() - self.since, 2)
            self._stop.wait(0.1)

    def __enter__(self) -> RotationWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)


def split_by_replica(results: list[Result], victim: str) -> dict[str, Any]:
    """The victim's answers and everyone else's: neighbours' errors are what a fault must not
    cause (a request with no answer has no replica: counted apart, as ``unattributed``)."""
    mine = [r for r in results if r[4] == victim]
    others = [r for r in results if r[4] and r[4] != victim]
    none = [r for r in results if not r[4]]
    n_lost, n_failed, _ = tally([(r[2], r[3]) for r in others])
    u_lost, u_failed, u_statuses = tally([(r[2], r[3]) for r in none])
    return {
        "victim_answers": len(mine),
        "neighbour_answers": len(others),
        "neighbour_lost": n_lost,
        "neighbour_failed": n_failed,
        "unattributed": len(none),
        "unattributed_statuses": u_statuses,
    }


def reliability_env() -> dict[str, str | None]:
    """The reliability settings this run had (launch.reliability_env's names)."""
    from serve_app.ops import launch

    return {name: os.environ.get(name) for name in launch.reliability_env(0.0)}


# ---- faults under load ---------------------------------------------------------------------


def sigkill(target: Target, after_s: float = 4.0) -> Row:
    with Load(target.url) as load:
        time.sleep(2.0)
        victim, pid = next(iter(replica_pids(target).items()))
        fault_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        time.sleep(after_s)
    recovery = wait_whole(target, exclude={victim})
    lost, failed, statuses = load.tally()
    return Row(
        "sigkill",
        len(load.results),
        lost,
        failed,
        None if recovery is None else round(time.monotonic() - fault_at, 2),
        {"victim": victim, "statuses": statuses, "load_clients": CLIENTS},
    )


def freeze(pid: int, stop_s: float, fault_at: float) -> bool:
    """SIGSTOP ``pid`` for at most ``stop_s``; SIGCONT it unless it died first (Serve replaced
    it). Whether it was still alive at the end."""
    os.kill(pid, signal.SIGSTOP)
    try:
        while time.monotonic() - fault_at < stop_s and pid_alive(pid):
            time.sleep(0.1)
    finally:
        still = pid_alive(pid)
        if still:
            os.kill(pid, signal.SIGCONT)
    return still


def sigstop(target: Target, stop_s: float) -> Row:
    """One replica SIGSTOPped under load for ``stop_s`` (then SIGCONT, unless Serve replaced it
    first). ``out_of_rotation_s``: from the stop until HAProxy has it not UP;
    ``last_sent_to_victim_s``: the last request it answered was sent this long after the
    stop (it answers them after SIGCONT)."""
    with Load(target.url) as load:
        time.sleep(2.0)
        victim, pid = next((r, p) for r, p in replica_pids(target).items() if pid_alive(p))
        fault_at = time.monotonic()
        with RotationWatch(target, victim, fault_at) as watch:
            survived = freeze(pid, stop_s, fault_at)
            ended_at = time.monotonic()
            time.sleep(2.0)
    recovery = wait_whole(target)
    results = load.snapshot()
    # Every request the freeze could have held: sent before it ended, answered after it began.
    during = [r for r in results if r[0] < ended_at and r[0] + r[1] > fault_at]
    to_victim = [r[0] - fault_at for r in results if r[4] == victim and fault_at <= r[0] < ended_at]
    lost, failed, statuses = load.tally(results)
    return Row(
        "sigstop",
        len(results),
        lost,
        failed,
        None if recovery is None else round(time.monotonic() - fault_at, 2),
        {
            "victim": victim,
            "stopped_s": round(ended_at - fault_at, 2),
            "replaced_while_stopped": not survived,
            "out_of_rotation_s": watch.out_s,
            "haproxy_states": watch.states,
            "last_sent_to_victim_s": round(max(to_victim), 2) if to_victim else None,
            "statuses": statuses,
            "requests_during_stop": len(during),
            "slowest_s": round(max((r[1] for r in during), default=0.0), 2),
            "held_over_2s": sum(r[1] > 2.0 for r in during),  # the stopped replica's
            **split_by_replica([r for r in results if r[0] >= fault_at], victim),
        },
    )


def capacity(
    target: Target,
    seconds: float = 4.0,
    body: dict[str, Any] | None = None,
    clients: int = CLIENTS,
) -> float:
    """Requests/s the closed-loop load gets answered (200) now."""
    with Load(target.url, clients=clients, body=body) as load:
        time.sleep(seconds)
    ok = [r for r in load.snapshot() if r[2] == 200]
    return len(ok) / seconds


Outcome = tuple[int | str, str, float]  # status (or the client error), content type, seconds


async def _open_loop(
    url: str, rate: float, duration_s: float, body: bytes, limit_s: float
) -> list[Outcome]:
    """Send ``body`` at ``rate`` per second for ``duration_s``, whatever the answers take
    (bounded: at most rate x duration requests, and ``limit_s`` in all: a request still
    unanswered then is cancelled and counted as ``unanswered``)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    headers = {"Content-Type": "application/json"}
    out: list[Outcome] = []
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:

        async def one() -> None:
            t0 = time.monotonic()
            try:
                resp = await client.post(url, content=body, headers=headers)
                ctype = resp.headers.get("content-type", "")
                out.append((resp.status_code, ctype, time.monotonic() - t0))
            except httpx.HTTPError as exc:
                out.append((f"{type(exc).__name__}({exc})", "", time.monotonic() - t0))

        t0 = time.monotonic()
        tasks = []
        for i in range(int(rate * duration_s)):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() - t0 > duration_s:
                break  # the client fell behind the schedule: what it sent is what it offered
            tasks.append(asyncio.create_task(one()))
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, t0 + limit_s - time.monotonic()))
        for task in pending:
            task.cancel()
        out.extend(("unanswered", "", limit_s) for _ in pending)
    return out


def _open_loop_process(job: tuple[str, float, float, bytes, float]) -> list[Outcome]:
    return asyncio.run(_open_loop(*job))


def open_loop(
    url: str,
    rate: float,
    duration_s: float,
    body: dict[str, Any],
    processes: int = 1,
    limit_s: float | None = None,
) -> list[Outcome]:
    """The open loop at ``rate`` per second, split over ``processes`` client processes (one
    Python process sends about a thousand requests a second at most)."""
    data = json.dumps(body).encode()
    limit = limit_s if limit_s is not None else duration_s + CLIENT_TIMEOUT_S
    if processes <= 1:
        return asyncio.run(_open_loop(url, rate, duration_s, data, limit))
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    job = (url, rate / processes, duration_s, data, limit)
    # concurrent.futures, not multiprocessing.Pool: a client process that dies raises
    # BrokenProcessPool here instead of being replaced forever.
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        parts = list(pool.map(_open_loop_process, [job] * processes, timeout=limit + 60.0))
    return [o for part in parts for o in part]


def overload(
    target: Target,
    factor: float,
    duration_s: float,
    body: dict[str, Any] | None = None,
    processes: int = 1,
    clients: int = CLIENTS,
) -> Row:
    """An open loop at ``factor`` times the measured capacity (requests of ``body``); the row
    adds the accepted requests' latency percentiles and the rate the client really offered."""
    body = BODY if body is None else body
    cap = capacity(target, body=body, clients=clients)
    rate = max(1.0, factor * cap)
    started = time.monotonic()
    outcomes = open_loop(target.url, rate, duration_s, body, processes)
    ended_at = time.monotonic()
    recovery = first_ok(target, ended_at)
    lost, failed, statuses = tally([(s, c) for s, c, _ in outcomes])
    ok_s = sorted(t for s, _, t in outcomes if s == 200)
    return Row(
        f"overload_{factor:g}x",
        len(outcomes),
        lost,
        failed,
        recovery,
        {
            "capacity_rps": round(cap, 1),
            "offered_rps": round(rate, 1),
            "sent_rps": round(len(outcomes) / duration_s, 1),
            "duration_s": duration_s,
            "wall_s": round(ended_at - started, 1),
            "client_processes": processes,
            "items_per_request": len(body["input"]),
            "statuses": statuses,
            "accepted": len(ok_s),
            "accepted_p50_s": _pct(ok_s, 0.50),
            "accepted_p99_s": _pct(ok_s, 0.99),
            "accepted_max_s": round(ok_s[-1], 3) if ok_s else None,
            "max_queued_items": ARGS["max_queued_items"],
            "queue_deadline_s": ARGS["queue_deadline_s"],
            "request_timeout_s": ARGS["request_timeout_s"],
        },
    )


def _pct(sorted_s: list[float], q: float) -> float | None:
    if not sorted_s:
        return None
    return round(sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))], 3)


def first_ok(target: Target, since: float, timeout_s: float = 60.0) -> float | None:
    """Seconds from ``since`` until a normal request is answered 200 (None: not in time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.post(target.url, json=BODY, timeout=30.0).status_code == 200:
                return round(time.monotonic() - since, 3)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return None


# ---- hostile bodies ------------------------------------------------------------------------


def raw_request(base: str, path: str, head: dict[str, str], body: bytes, half_close: bool) -> Any:
    """Send one HTTP/1.1 request over a plain socket (so the headers may lie); the status line's
    code, 'closed' if the server closed without one, or 'timeout'."""
    parts = urlsplit(base)
    assert parts.hostname == "127.0.0.1", "the fault suite only targets 127.0.0.1"
    lines = [f"POST {parts.path}{path} HTTP/1.1", f"Host: 127.0.0.1:{parts.port}"]
    lines += [f"{k}: {v}" for k, v in head.items()]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", parts.port or 80), timeout=30.0) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        try:
            first = sock.recv(4096)
        except TimeoutError:
            return "timeout"
    if not first:
        return "closed"
    return int(first.split(b" ", 2)[1])


def _nested(depth: int) -> bytes:
    return b'{"input": ' + b"[" * depth + b'"x"' + b"]" * depth + b"}"


def hostile_cases(max_body_bytes: int) -> Iterator[tuple[str, Callable[[str], Any]]]:
    """(name, send(base) -> status) for each hostile body."""
    bomb = gzip.compress(b'{"input": "' + b"a" * (64 * 1024 * 1024) + b'"}', compresslevel=9)
    json_head = {"Content-Type": "application/json"}

    def post(body: bytes, extra: dict[str, str] | None = None) -> Callable[[str], Any]:
        def send(base: str) -> Any:
            resp = httpx.post(
                f"{base}/v1/embeddings",
                content=body,
                headers={**json_head, **(extra or {})},
                timeout=CLIENT_TIMEOUT_S,
            )
            return resp.status_code, resp.headers.get("content-type", "")

        return send

    def lying_length(base: str) -> Any:
        head = {**json_head, "Content-Length": "1000", "Connection": "close"}
        return raw_request(base, "/v1/embeddings", head, b'{"input": "x"}', half_close=True)

    def short_length(base: str) -> Any:
        body = b'{"input": "x"}GARBAGE-AFTER-THE-DECLARED-BODY'
        head = {**json_head, "Content-Length": "14", "Connection": "close"}
        return raw_request(base, "/v1/embeddings", head, body, half_close=False)

    words = max_body_bytes // 2 - 64  # "a " repeated: one token each, just under the limit
    yield "hostile:gzip_bomb", post(bomb, {"Content-Encoding": "gzip"})
    yield "hostile:content_length_longer_than_body", lying_length
    yield "hostile:content_length_shorter_than_body", short_length
    depth = min(200_000, max_body_bytes // 2 - 16)  # far past orjson's 1024, under the limit
    yield "hostile:deep_json_array", post(b"[" * depth + b"]" * depth)
    yield "hostile:deep_json_input", post(_nested(1000))
    yield "hostile:huge_string_under_limit", post(json.dumps({"input": "a " * words}).encode())
    yield "hostile:body_over_limit", post(b'{"input": "' + b"a" * max_body_bytes + b'"}')


def hostile(base: str, max_body_bytes: int) -> list[Row]:
    """Each hostile body once, then a normal request: the replica must answer both."""
    rows = []
    target = Target(base, "")
    for name, send in hostile_cases(max_body_bytes):
        t0 = time.monotonic()
        try:
            answer = send(base)
        except (httpx.HTTPError, OSError) as exc:
            answer = f"{type(exc).__name__}({exc})"
        took_s = round(time.monotonic() - t0, 3)
        status, ctype = answer if isinstance(answer, tuple) else (answer, "")
        if isinstance(status, int):
            kind = classify(status, ctype or "application/json")  # raw: body not read
            if status == 200:
                kind = "ok"
        else:
            kind = "failed" if status == "closed" else "lost"  # a refused, closed request
        recovery = first_ok(target, t0)
        lost = (kind == "lost") + (recovery is None)
        rows.append(
            Row(
                name,
                1,
                int(lost),
                int(kind == "failed"),
                recovery,
                {"answer": status, "took_s": took_s},
            )
        )
    return rows


# ---- the command ---------------------------------------------------------------------------

FAULTS = ("sigkill", "sigstop", "overload", "hostile")


def print_rows(rows: list[Row], fault_width: int) -> None:
    """One line per fault: sent, lost, failed and recovery_s."""
    for r in rows:
        print(
            f"{r.fault:{fault_width}s} sent {r.sent:6d} lost {r.lost:3d} failed {r.failed:5d} "
            f"recovery_s {r.recovery_s}"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m load_tests.faults", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, default=Path("faults.json"))
    p.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated: {', '.join(FAULTS)}")
    p.add_argument("--stop-s", type=float, default=6.0, help="how long SIGSTOP freezes a replica")
    p.add_argument("--overload-s", type=float, default=6.0, help="seconds of 3x overload")
    a = p.parse_args(argv)
    only = {f.strip() for f in a.only.split(",") if f.strip()}
    unknown = only - set(FAULTS)
    if unknown:
        p.error(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    from serve_app.config.args import parse_args
    from serve_app.ops import launch

    rows: list[Row] = []
    t0 = time.monotonic()
    target = start_cluster()
    try:
        if "sigkill" in only:
            rows.append(sigkill(target))
        if "sigstop" in only:
            rows.append(sigstop(target, a.stop_s))
        if "overload" in only:
            rows.append(overload(target, 3.0, a.overload_s))
        if "hostile" in only:
            rows.extend(hostile(target.base, parse_args(ARGS).max_body_bytes))
    finally:
        launch.shutdown()
    doc = {
        "args": ARGS,
        "replicas": 2,
        "cpus": os.cpu_count(),
        "reliability_env": reliability_env(),
        "took_s": round(time.monotonic() - t0, 1),
        "rows": [asdict(r) for r in rows],
    }
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print_rows(rows, fault_width=42)
    print(f"wrote {a.out}")
    return 0 if all(r.lost == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
