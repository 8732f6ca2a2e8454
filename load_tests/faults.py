"""CPU fault suite, one command: faults injected into a local 2-replica serve_app under load.

    python -m load_tests.faults --out faults.json          # ~2 minutes on 2 cores

It starts its own Ray and Serve on 127.0.0.1 (as `serve-app run` does: HAProxy ingress, the
retry settings of serve_app.launch), deploys two CPU MiniLM replicas, and runs:

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

APP = "faults"
BODY = {"input": [f"sentence {i} for the fault suite" for i in range(8)]}
CLIENTS = 8
MAX_REQUESTS_PER_CLIENT = 5000
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


class Load:
    """CLIENTS threads posting BODY until stopped: (send time, seconds taken, status, type)."""

    def __init__(self, url: str):
        self.url = url
        self.stop = threading.Event()
        self.results: list[tuple[float, float, int | str, str]] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run) for _ in range(CLIENTS)]

    def _run(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as client:
            for _ in range(MAX_REQUESTS_PER_CLIENT):
                if self.stop.is_set():
                    return
                t0 = time.monotonic()
                try:
                    resp = client.post(self.url, json=BODY)
                    out: tuple[int | str, str] = (
                        resp.status_code,
                        resp.headers.get("content-type", ""),
                    )
                except httpx.HTTPError as exc:
                    out = (f"{type(exc).__name__}({exc})", "")
                with self._lock:
                    self.results.append((t0, time.monotonic() - t0, *out))

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

    @property
    def url(self) -> str:
        return f"{self.base}/v1/embeddings"


def start_cluster(replicas: int = 2) -> Target:
    from serve_app import launch

    launch.private_haproxy_ports()
    port = launch.free_port()
    launch.start_ray(num_gpus=0, haproxy=True, num_cpus=8)
    import ray
    from ray import serve

    from serve_app.config import parse_args
    from serve_app.replica import ModelServer

    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
    app = ModelServer.options(  # type: ignore[attr-defined]
        num_replicas=replicas, ray_actor_options={"num_cpus": 0.5}
    ).bind(parse_args(ARGS).model_dump())
    serve.run(app, name=APP, route_prefix=f"/{APP}")
    target = Target(f"http://127.0.0.1:{port}/{APP}", ray.get_runtime_context().get_node_id())
    launch.wait_ready(target.base, WHOLE_TIMEOUT_S)
    wait_whole(target, replicas)
    return target


def haproxy_up(target: Target) -> dict[str, str]:
    """Replica id -> HAProxy status, for this app's replicas."""
    from serve_app.launch import haproxy_servers

    prefix = f"http-{APP}/SERVE_REPLICA_{APP}-model-"
    servers = haproxy_servers(target.node_id)
    return {
        name[len(prefix) :]: s["status"] for name, s in servers.items() if name.startswith(prefix)
    }


def wait_whole(target: Target, replicas: int, timeout_s: float = WHOLE_TIMEOUT_S) -> float | None:
    """Seconds until /readyz shows nothing degraded and HAProxy has ``replicas`` UP; None if
    that did not happen within ``timeout_s``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            ready = httpx.get(f"{target.base}/readyz", timeout=10.0).json()
            up = [s for s in haproxy_up(target).values() if s == "UP"]
            if ready.get("ready") and not ready.get("degraded") and len(up) >= replicas:
                return time.monotonic() - t0
        except (httpx.HTTPError, OSError, ValueError):
            pass
        time.sleep(0.25)
    return None


def replica_pids(target: Target) -> dict[str, int]:
    report = httpx.get(f"{target.base}/v1/memory", timeout=30.0).json()["replicas"]
    return {r["replica_id"]: int(r["pid"]) for r in report}


# ---- faults under load ---------------------------------------------------------------------


def sigkill(target: Target, after_s: float = 4.0) -> Row:
    with Load(target.url) as load:
        time.sleep(2.0)
        victim, pid = next(iter(replica_pids(target).items()))
        fault_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        time.sleep(after_s)
    recovery = wait_whole(target, 2)
    lost, failed, statuses = tally([(s, ct) for _, _, s, ct in load.results])
    return Row(
        "sigkill",
        len(load.results),
        lost,
        failed,
        None if recovery is None else round(time.monotonic() - fault_at, 2),
        {"victim": victim, "statuses": statuses, "load_clients": CLIENTS},
    )


def sigstop(target: Target, stop_s: float) -> Row:
    with Load(target.url) as load:
        time.sleep(2.0)
        victim, pid = next(iter(replica_pids(target).items()))
        fault_at = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(stop_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(2.0)
    recovery = wait_whole(target, 2)
    stopped_until = fault_at + stop_s
    # Every request the freeze could have held: sent before it ended, answered after it began.
    during = [r for r in load.results if r[0] < stopped_until and r[0] + r[1] > fault_at]
    lost, failed, statuses = tally([(s, ct) for _, _, s, ct in load.results])
    return Row(
        "sigstop",
        len(load.results),
        lost,
        failed,
        None if recovery is None else round(time.monotonic() - fault_at, 2),
        {
            "victim": victim,
            "stopped_s": stop_s,
            "statuses": statuses,
            "requests_during_stop": len(during),
            "slowest_s": round(max((r[1] for r in during), default=0.0), 2),
        },
    )


def capacity(target: Target, seconds: float = 4.0) -> float:
    """Requests/s the closed-loop load gets answered (200) now."""
    with Load(target.url) as load:
        time.sleep(seconds)
    ok = [r for r in load.results if r[2] == 200]
    return len(ok) / seconds


async def _open_loop(url: str, rate: float, duration_s: float) -> list[tuple[int | str, str]]:
    """Send at ``rate`` per second for ``duration_s``, whatever the answers take (bounded: at
    most rate x duration requests)."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    out: list[tuple[int | str, str]] = []
    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits) as client:

        async def one() -> None:
            try:
                resp = await client.post(url, json=BODY)
                out.append((resp.status_code, resp.headers.get("content-type", "")))
            except httpx.HTTPError as exc:
                out.append((f"{type(exc).__name__}({exc})", ""))

        t0 = time.monotonic()
        tasks = []
        for i in range(int(rate * duration_s)):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return out


def overload(target: Target, factor: float, duration_s: float) -> Row:
    cap = capacity(target)
    rate = max(1.0, factor * cap)
    outcomes = asyncio.run(_open_loop(target.url, rate, duration_s))
    ended_at = time.monotonic()
    recovery = first_ok(target, ended_at)
    lost, failed, statuses = tally(outcomes)
    return Row(
        f"overload_{factor:g}x",
        len(outcomes),
        lost,
        failed,
        recovery,
        {
            "capacity_rps": round(cap, 1),
            "offered_rps": round(rate, 1),
            "duration_s": duration_s,
            "statuses": statuses,
            "max_queued_items": ARGS["max_queued_items"],
            "queue_deadline_s": ARGS["queue_deadline_s"],
        },
    )


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
    from serve_app import launch
    from serve_app.config import parse_args

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
        "haproxy_retry": launch.HAPROXY_RETRY_DEFAULTS,
        "took_s": round(time.monotonic() - t0, 1),
        "rows": [asdict(r) for r in rows],
    }
    a.out.write_text(json.dumps(doc, indent=2) + "\n")
    for r in rows:
        print(
            f"{r.fault:42s} sent {r.sent:5d} lost {r.lost:3d} failed {r.failed:5d} "
            f"recovery_s {r.recovery_s}"
        )
    print(f"wrote {a.out}")
    return 0 if all(r.lost == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
