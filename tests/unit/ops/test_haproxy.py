"""ops.haproxy's private files: the 0700 directory and Ray's variables, the launcher that binds
HAProxy's stats and metrics to 127.0.0.1 (on the real HAProxy binary, no Ray), and finding and
stopping an HAProxy of ours that a killed run left on its port."""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from serve_app.errors import StartupError
from serve_app.ops import haproxy
from serve_app.ops.ports import free_port, port_is_free

REAL_BINARY = haproxy._real_binary()
needs_haproxy = pytest.mark.skipif(REAL_BINARY is None, reason="no HAProxy binary here")


def test_rays_template_still_has_what_the_launcher_rewrites() -> None:
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE as T

    # The admin socket is world-writable by Ray's own template: the 0700 directory closes it.
    assert "stats socket {{ config.socket_path }} mode 666 level admin" in T
    assert "frontend prometheus\n    bind :{{ config.metrics_port }}\n" in T
    assert "listen stats\n  bind *:{{ config.stats_port }}\n" in T
    assert {"listen stats", "frontend prometheus"} == set(haproxy.LOOPBACK_SECTIONS)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setattr(os, "environ", dict(os.environ))
    for var in haproxy.private_files_env(Path("/x")):
        os.environ.pop(var, None)
    yield monkeypatch
    haproxy.release_private_files()


def test_private_files_are_a_fresh_0700_directory_and_released(
    clean_env: pytest.MonkeyPatch,
) -> None:
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = "1"  # not ours: left alone
    first = haproxy.use_private_files()
    d = first.directory
    st = d.lstat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert d.name.startswith(haproxy.PRIVATE_PREFIX)
    assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == str(d / "admin.sock")
    assert os.environ["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"] == str(d / "haproxy.cfg")
    assert os.environ[haproxy.BINARY_VAR] == str(d / haproxy.LAUNCHER)
    assert (d / haproxy.OWNER_FILE).read_text().split()[0] == str(os.getpid())
    second = haproxy.use_private_files()  # a second run in one process: a fresh one
    assert second.directory != d and not d.exists()
    haproxy.release_private_files()
    assert not second.directory.exists()
    assert "RAY_SERVE_HAPROXY_SOCKET_PATH" not in os.environ
    assert haproxy.BINARY_VAR not in os.environ
    assert os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] == "1"


def test_a_users_paths_win_and_the_launcher_runs_the_users_binary(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] = str(tmp_path / "mine.sock")
    os.environ[haproxy.BINARY_VAR] = "/opt/my/haproxy"
    files = haproxy.use_private_files()
    assert os.environ["RAY_SERVE_HAPROXY_SOCKET_PATH"] == str(tmp_path / "mine.sock")
    launcher = files.directory / haproxy.LAUNCHER
    assert os.environ[haproxy.BINARY_VAR] == str(launcher)
    assert "exec /opt/my/haproxy " in launcher.read_text()
    haproxy.release_private_files()
    assert os.environ[haproxy.BINARY_VAR] == "/opt/my/haproxy"  # restored


CONFIG = """global
    stats socket {dir}/admin.sock mode 666 level admin expose-fd listeners
defaults
    mode http
    timeout connect 5s
    timeout client 5s
    timeout server 5s
frontend prometheus
    bind :{metrics}
    mode http
    http-request use-service prometheus-exporter if {{ path /metrics }}
    no log
frontend http_frontend
    bind 127.0.0.1:{http}
    http-request return status 200 content-type text/plain string ok
listen stats
  bind *:{stats}
  stats enable
  stats uri /stats
"""


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder directly under /tmp: HAProxy refuses a socket path over 97 bytes, which pytest's
    tmp_path can pass (a longer basetemp, or pytest-xdist's popen-gwN level)."""
    import shutil

    d = Path(tempfile.mkdtemp(prefix="sa-t-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _private_dir(base: Path, owner_pid: int, owner_created: float) -> Path:
    d = Path(tempfile.mkdtemp(prefix=haproxy.PRIVATE_PREFIX, dir=base))
    (d / haproxy.OWNER_FILE).write_text(f"{owner_pid} {owner_created}\n")
    assert REAL_BINARY is not None
    (d / haproxy.LAUNCHER).write_text(haproxy.launcher_script(REAL_BINARY, d / haproxy.PID_FILE))
    (d / haproxy.LAUNCHER).chmod(0o700)
    return d


def _start(d: Path, http_port: int) -> subprocess.Popen[bytes]:
    """HAProxy started as Serve starts it (-db -f CONFIG), through the launcher."""
    cfg = d / "haproxy.cfg"
    cfg.write_text(CONFIG.format(dir=d, metrics=free_port(), http=http_port, stats=free_port()))
    proc = subprocess.Popen([str(d / haproxy.LAUNCHER), "-db", "-f", str(cfg)])
    deadline = time.monotonic() + 10.0
    while port_is_free("127.0.0.1", http_port):
        assert proc.poll() is None and time.monotonic() < deadline, "HAProxy did not start"
        time.sleep(0.05)
    return proc


@needs_haproxy
def test_the_launcher_binds_stats_and_metrics_to_loopback_and_records_the_pid(
    short_tmp: Path,
) -> None:
    d = _private_dir(short_tmp, 4194303, 0.0)
    proc = _start(d, free_port())
    try:
        assert int((d / haproxy.PID_FILE).read_text()) == proc.pid  # the launcher exec'd
        rewritten = (d / "haproxy.cfg").read_text()
        assert "bind 127.0.0.1:" in rewritten and "bind *:" not in rewritten
        binds = [
            c.laddr.ip
            for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN
        ]
        assert binds and set(binds) == {"127.0.0.1"}  # http, stats and metrics
    finally:
        proc.terminate()
        proc.wait(5)


@needs_haproxy
def test_the_launcher_refuses_a_stats_bind_it_cannot_move(tmp_path: Path) -> None:
    d = _private_dir(tmp_path, 4194303, 0.0)
    cfg = d / "haproxy.cfg"
    cfg.write_text(f"listen stats\n  bind 0.0.0.0:{free_port()}\n  stats enable\n")
    out = subprocess.run([str(d / haproxy.LAUNCHER), "-db", "-f", str(cfg)], capture_output=True)
    assert out.returncode == 1 and b"cannot bind HAProxy's stats" in out.stderr
    assert not (d / haproxy.PID_FILE).exists()  # HAProxy never ran


@needs_haproxy
def test_a_stale_haproxy_of_ours_is_stopped_and_a_live_runs_is_not(short_tmp: Path) -> None:
    port = free_port()
    me = psutil.Process()
    live = _private_dir(short_tmp, me.pid, me.create_time())
    proc = _start(live, port)
    try:
        (found,) = haproxy.own_haproxies(str(short_tmp))
        assert (found.pid, found.directory, found.owner_alive) == (proc.pid, live, True)
        with pytest.raises(StartupError, match="still running"):
            haproxy.free_stale_port("127.0.0.1", port, str(short_tmp))
        assert proc.poll() is None  # a live run's HAProxy is never touched
        # The same HAProxy once its run is gone (SIGKILLed): the owner file names a dead pid.
        (live / haproxy.OWNER_FILE).write_text("4194303 0.0\n")
        note = haproxy.free_stale_port("127.0.0.1", port, str(short_tmp))
        assert f"pid {proc.pid}" in note and f"port {port}" in note
        assert proc.wait(5) is not None and not live.exists()
        assert port_is_free("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_port_held_by_anything_else_is_named_not_killed(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(StartupError, match="not by an HAProxy that serve_app recorded"):
            haproxy.free_stale_port("127.0.0.1", port, str(tmp_path))
        assert not port_is_free("127.0.0.1", port)


def test_a_directory_others_can_enter_is_not_ours(tmp_path: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix=haproxy.PRIVATE_PREFIX, dir=tmp_path))
    (d / haproxy.PID_FILE).write_text(f"{os.getpid()}\n")
    d.chmod(0o755)
    assert haproxy.own_haproxies(str(tmp_path)) == []
    d.chmod(0o700)  # ours now, but the pid is this Python, not an HAProxy reading from there
    assert haproxy.own_haproxies(str(tmp_path)) == []


def test_a_node_gets_its_own_private_directory_that_no_run_takes_for_stale(
    tmp_path: Path,
) -> None:
    wanted = haproxy.node_private_files(base=str(tmp_path))
    directory = Path(wanted["RAY_SERVE_HAPROXY_SOCKET_PATH"]).parent
    assert directory.parent == tmp_path and directory.stat().st_mode & 0o777 == 0o700
    assert all(v == str(directory) or v.startswith(f"{directory}/") for v in wanted.values())
    if haproxy.BINARY_VAR in wanted:  # the launcher, when HAProxy is installed
        assert Path(wanted[haproxy.BINARY_VAR]).stat().st_mode & 0o777 == 0o700
    assert haproxy.own_haproxies(base=str(tmp_path)) == []
