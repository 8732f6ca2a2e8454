"""A hung replica's requests, replayed as soon as HAProxy marks it DOWN.

HAProxy's health check takes a replica that stops answering (SIGSTOP, a wedged event loop) out
of rotation within 3 x inter + fastinter, but the requests already sent to it wait for
`timeout server` (the longest request_timeout_s + 5 s) before HAProxy replays them. HAProxy's
`on-marked-down shutdown-sessions` ends them at once, yet lost SIGKILLed replicas' requests
(benchmarks/journal/2026-12-01-hung-replica.md). So every replica watches its node's HAProxy: a
replica server that HAProxy has DOWN and whose ``/-/healthz`` does not answer within
``PROBE_TIMEOUT_S`` is SIGKILLed. A killed replica's connections close with nothing sent, which
HAProxy replays on another replica (``retry-on empty-response``, the SIGKILL path the
reliability tests hold to zero lost), and Serve starts a replacement.

Only processes on this node whose title is a Serve replica's are killed, and never this one. A
replica that is merely slow answers ``/-/healthz`` from its event loop in milliseconds, and
HAProxy does not mark it DOWN in the first place.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import psutil

logger = logging.getLogger("serve_app")

PERIOD_S = 0.25  # how often HAProxy's states are read (a unix socket, microseconds)
PROBE_TIMEOUT_S = 0.5  # a live replica's event loop answers /-/healthz in milliseconds
REPLICA_SERVER_PREFIX = "SERVE_REPLICA"
REPLICA_TITLE_PREFIX = "ray::ServeReplica"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Down:
    """A replica server HAProxy has marked DOWN."""

    name: str  # backend/server, as HAProxy's `show stat` names it
    host: str
    port: int
    check_status: str


def down_replicas(rows: Mapping[str, Mapping[str, str]]) -> list[Down]:
    """The replica servers of HAProxy's ``show stat`` rows that are fully DOWN ("DOWN 1/2" is
    one that is coming back up; MAINT and DRAIN are Serve's own doing)."""
    found = []
    for name, row in rows.items():
        if row.get("status") != "DOWN" or not row.get("svname", "").startswith(
            REPLICA_SERVER_PREFIX
        ):
            continue
        host, _, port = row.get("addr", "").rpartition(":")
        if host and port.isdigit():
            found.append(Down(name, host.strip("[]"), int(port), row.get("check_status", "")))
    return found


def answers(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool | None:
    """Whether the server answers ``GET /-/healthz`` within ``timeout_s``: True if it sent
    anything, False if it accepted the connection and then said nothing (hung), None if nothing
    listens there any more (gone: nothing to end)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"GET /-/healthz HTTP/1.0\r\nHost: serve-app\r\n\r\n")
            return bool(sock.recv(1))
    except TimeoutError:
        return False
    except OSError:
        return None


def listener_pid(port: int) -> int | None:
    """The process listening on ``port`` on this host (ours, so psutil sees its sockets)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            return conn.pid
    return None


def is_replica(pid: int) -> bool:
    """Whether ``pid`` is a Ray Serve replica process (Ray sets the process title)."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return bool(cmdline) and cmdline[0].startswith(REPLICA_TITLE_PREFIX)


def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


@dataclass
class Reaper:
    """Ends the replicas HAProxy has DOWN that do not answer; the parts are injected so that the
    decision can be tested without a cluster."""

    read_servers: Callable[[], Mapping[str, Mapping[str, str]]]
    probe: Callable[[str, int], bool | None] = answers
    find_pid: Callable[[int], int | None] = listener_pid
    check_replica: Callable[[int], bool] = is_replica
    kill: Callable[[int], None] = sigkill
    own_pid: int = field(default_factory=os.getpid)
    local_hosts: Iterable[str] = LOCAL_HOSTS

    def sweep(self) -> list[tuple[Down, int]]:
        """One look at HAProxy; returns what it killed."""
        try:
            rows = self.read_servers()
        except OSError:
            return []  # no HAProxy on this node, or it is reloading: the next sweep looks again
        killed = []
        for down in down_replicas(rows):
            if down.host not in self.local_hosts or self.probe(down.host, down.port) is not False:
                continue
            pid = self.find_pid(down.port)
            if pid is None or pid == self.own_pid or not self.check_replica(pid):
                continue
            try:
                self.kill(pid)
            except ProcessLookupError:
                continue
            logger.warning(
                "replica server %s (pid %d) is hung: HAProxy marked it DOWN (%s) and /-/healthz "
                "did not answer in %.1f s; killed it so that HAProxy replays the requests it "
                "held on another replica",
                down.name,
                pid,
                down.check_status,
                PROBE_TIMEOUT_S,
            )
            killed.append((down, pid))
        return killed

    def run(self, stop: threading.Event) -> None:
        # Jittered, so that the replicas of a node do not all look at the same instant.
        while not stop.wait(PERIOD_S * random.uniform(0.8, 1.2)):
            try:
                self.sweep()
            except Exception:  # never let the watcher take the replica down
                logger.exception("hung-replica watch: one sweep failed")


def start_reaper(stop: threading.Event) -> threading.Thread | None:
    """Watch this node's HAProxy from a daemon thread; None where there is no Ray node."""
    import ray

    from serve_app.ops.haproxy import haproxy_servers

    if not ray.is_initialized():
        return None
    node_id = ray.get_runtime_context().get_node_id()
    reaper = Reaper(read_servers=lambda: haproxy_servers(node_id, timeout_s=1.0))
    thread = threading.Thread(target=reaper.run, args=(stop,), name="hung-watch", daemon=True)
    thread.start()
    return thread
