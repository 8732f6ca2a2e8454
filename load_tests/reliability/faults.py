"""CPU fault suite, one command: faults injected into a local 2-replica serve_app under load.

    python -m load_tests.reliability.faults --out faults.json          # ~2 minutes on 2 cores

It starts its own Ray and Serve on 127.0.0.1 (as `serve-app run` does: HAProxy ingress, the
retry settings of serve_app.ops.launch), deploys two CPU MiniLM replicas, and runs:

- ``sigkill``: one replica gets SIGKILL under load (8 clients);
- ``sigstop``: one replica is frozen (SIGSTOP) for ``--stop-s`` seconds under load, then SIGCONT
  (the requests it held must be answered elsewhere by its leaving HAProxy's rotation + 2 s);
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
import gzip
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from load_tests.harness.cluster import (
    ARGS,
    Target,
    reliability_env,
    replica_pids,
    start_cluster,
    wait_whole,
)
from load_tests.harness.load import (
    BODY,
    CLIENT_TIMEOUT_S,
    CLIENTS,
    Load,
    Result,
    capacity,
    classify,
    first_ok,
    open_loop,
    pct,
    tally,
)
from load_tests.harness.meta import PROVENANCE_HELP, run_meta
from load_tests.reliability.hang import RotationWatch, freeze
from serve_app.control.monitor import pid_alive


@dataclass
class Row:
    fault: str
    sent: int
    lost: int
    failed: int
    recovery_s: float | None
    detail: dict[str, Any] = field(default_factory=dict)


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
    # The bound (issue 29): each request the hung replica held is answered within the time it
    # took to leave rotation + 2 s. Held: sent before it left; when each was answered.
    left_at = fault_at + (watch.out_s if watch.out_s is not None else ended_at - fault_at)
    held = [r[0] + r[1] - fault_at for r in during if r[0] < left_at]
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
            "last_held_answered_s": round(max(held), 2) if held else None,
            "held_bound_s": None if watch.out_s is None else round(watch.out_s + 2.0, 2),
            **split_by_replica([r for r in results if r[0] >= fault_at], victim),
        },
    )


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
            "accepted_p50_s": pct(ok_s, 0.50),
            "accepted_p99_s": pct(ok_s, 0.99),
            "accepted_max_s": round(ok_s[-1], 3) if ok_s else None,
            "max_queued_items": ARGS["max_queued_items"],
            "queue_deadline_s": ARGS["queue_deadline_s"],
            "request_timeout_s": ARGS["request_timeout_s"],
        },
    )


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


def skipped(fault: str, why: str) -> Row:
    return Row(fault, 0, 0, 0, None, {"skipped": why})


def print_rows(rows: list[Row], fault_width: int) -> None:
    """One line per fault: sent, lost, failed and recovery_s."""
    for r in rows:
        print(
            f"{r.fault:{fault_width}s} sent {r.sent:6d} lost {r.lost:3d} failed {r.failed:5d} "
            f"recovery_s {r.recovery_s}"
        )


PROG = "python -m load_tests.reliability.faults"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__.split("\n")[0], epilog=PROVENANCE_HELP
    )
    p.add_argument("--out", type=Path, default=Path("faults.json"))
    p.add_argument("--only", default=",".join(FAULTS), help=f"comma-separated: {', '.join(FAULTS)}")
    p.add_argument("--stop-s", type=float, default=6.0, help="how long SIGSTOP freezes a replica")
    p.add_argument("--replicas", type=int, default=2, help="replicas of the app")
    p.add_argument("--overload-s", type=float, default=6.0, help="seconds of 3x overload")
    a = p.parse_args(argv)
    only = {f.strip() for f in a.only.split(",") if f.strip()}
    unknown = only - set(FAULTS)
    if unknown:
        p.error(f"unknown faults {sorted(unknown)}; choose from {', '.join(FAULTS)}")
    from serve_app.config.args import parse_args
    from serve_app.ops import launch

    rows: list[Row] = []
    meta = run_meta(PROG, argv)
    t0 = time.monotonic()
    target = start_cluster(a.replicas)
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
        **meta,
        "args": ARGS,
        "replicas": a.replicas,
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
