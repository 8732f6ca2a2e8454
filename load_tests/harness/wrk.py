"""wrk, the closed-loop maximum-throughput client: its Lua script, its command, its output.

Why wrk: a Python client saturates near 2,000 requests/s per process on the H200 host, so it
cannot tell the server's limit from its own; wrk (C, epoll, one thread per core) sends tens of
thousands of requests/s from a few cores. Its latency is closed-loop (measured from the send,
so it hides queueing at the client: coordinated omission); the open-loop client measures latency.

The Lua script sets the method, the headers and the body (read once from a file; from a
``.bodies`` file, several bodies sent in turn, see load_tests.harness.bodies) and, in
``done()``, prints one line ``WRK_JSON {...}`` with the request count, the duration, the error
counters and latency percentiles, which ``parse_wrk_output`` reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.harness.bodies import BODIES_SUFFIX

MARKER = "WRK_JSON "
ERROR_KINDS: tuple[str, ...] = ("connect", "read", "write", "status", "timeout")

_DONE = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


def lua_string(text: str) -> str:
    """``text`` as a double-quoted Lua string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def lua_script(body_path: Path, headers: Mapping[str, str], method: str = "POST") -> str:
    """A wrk script that sends ``method`` with ``headers`` and the bytes of ``body_path``; for
    a ``.bodies`` file, its lines in turn (each wrk thread from the first), built with
    ``wrk.format`` (which sets Content-Length per body)."""
    lines = [f"wrk.method = {lua_string(method)}"]
    for name, value in headers.items():
        lines.append(f"wrk.headers[{lua_string(name)}] = {lua_string(value)}")
    lines.append(f'local f = assert(io.open({lua_string(str(body_path))}, "rb"))')
    if Path(body_path).suffix != BODIES_SUFFIX:
        lines += ['wrk.body = f:read("*a")', "f:close()"]
        return "\n".join(lines) + "\n" + _DONE
    lines += [
        "local bodies = {}",
        "for line in f:lines() do",
        "  if #line > 0 then bodies[#bodies + 1] = line end",
        "end",
        "f:close()",
        'assert(#bodies > 0, "no request bodies")',
        "local next_body = 0",
        "request = function()",
        "  next_body = next_body % #bodies + 1",
        "  return wrk.format(nil, nil, nil, bodies[next_body])",
        "end",
    ]
    return "\n".join(lines) + "\n" + _DONE


def find_wrk(preferred: str | None) -> str | None:
    """The wrk to run: ``preferred`` when it is an executable file, else ``wrk`` on PATH."""
    if preferred and Path(preferred).is_file() and os.access(preferred, os.X_OK):
        return str(Path(preferred).resolve())
    return shutil.which("wrk")


def pin_prefix(cores: Sequence[int]) -> list[str]:
    """``taskset -c CORES`` when taskset exists (else [] and the caller pins with
    sched_setaffinity in the child)."""
    taskset = shutil.which("taskset")
    return [taskset, "-c", ",".join(str(c) for c in cores)] if taskset and cores else []


def wrk_command(
    wrk: str,
    url: str,
    script: Path,
    *,
    threads: int,
    connections: int,
    duration_s: float,
    timeout_s: float,
    cores: Sequence[int],
) -> list[str]:
    """The command line: ``taskset -c CORES wrk -t T -c C -d Ds --timeout Ts --latency -s S URL``
    (threads never more than connections: wrk refuses that)."""
    threads = max(1, min(threads, connections))
    return [
        *pin_prefix(cores),
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        f"--timeout={max(1, round(timeout_s))}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]


def parse_wrk_output(text: str) -> dict[str, Any]:
    """The ``WRK_JSON`` line of wrk's output as figures: ``requests`` (responses of any status),
    ``ok`` (those without a status error), ``duration_s``, ``requests_per_s`` (ok ones),
    ``errors`` by kind and in total, latency in ms. Raises ValueError when there is no line.

    wrk counts a status error for every response with status > 399; serve_app, HAProxy and
    the no-op answer 2xx or 4xx/5xx, never 1xx/3xx, so ``ok`` is the 2xx count."""
    for line in reversed(text.splitlines()):
        if line.startswith(MARKER):
            raw = json.loads(line[len(MARKER) :])
            break
    else:
        raise ValueError(f"no {MARKER.strip()} line in wrk's output: {text[-500:]!r}")
    duration_s = raw["duration_us"] / 1e6
    errors = {k: int(raw["errors"][k]) for k in ERROR_KINDS}
    ok = max(0, int(raw["requests"]) - errors["status"])
    lat = raw["latency_us"]
    return {
        "requests": int(raw["requests"]),
        "ok": ok,
        "duration_s": duration_s,
        "requests_per_s": ok / duration_s if duration_s > 0 else 0.0,
        "bytes": int(raw["bytes"]),
        "errors": sum(errors.values()),
        "error_counts": errors,
        "p50_ms": lat["p50"] / 1e3,
        "p90_ms": lat["p90"] / 1e3,
        "p99_ms": lat["p99"] / 1e3,
        "max_ms": lat["max"] / 1e3,
        "mean_ms": float(lat["mean"]) / 1e3,
    }


def best_try(tries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The try with the most 2xx responses/s among those that ran (a failed try has no
    ``requests_per_s``); ties go to the fewer connections."""
    ran = [t for t in tries if t.get("requests_per_s") is not None]
    if not ran:
        return None
    return max(ran, key=lambda t: (t["requests_per_s"], -int(t.get("connections", 0))))


@dataclass(frozen=True)
class WrkTarget:
    """One request to load: URL, headers and the file holding the body."""

    url: str
    headers: Mapping[str, str]
    body_path: Path
    method: str = "POST"


def run_wrk(
    wrk: str,
    target: WrkTarget,
    *,
    connections: int,
    threads: int,
    duration_s: float,
    cores: Sequence[int],
    work_dir: Path,
    timeout_s: float = 5.0,
) -> dict[str, Any]:
    """Run wrk once against ``target``; returns parse_wrk_output's figures plus the command,
    connections and threads, or ``{"error": ...}`` when wrk failed."""
    key = hashlib.sha1(f"{target.url} {target.body_path}".encode()).hexdigest()[:12]
    script = work_dir / f"wrk-{key}.lua"
    script.write_text(lua_script(target.body_path, target.headers, target.method))
    cmd = wrk_command(
        wrk,
        target.url,
        script,
        threads=threads,
        connections=connections,
        duration_s=duration_s,
        timeout_s=timeout_s,
        cores=cores,
    )
    env = dict(os.environ)
    # .tools/wrk links the LuaJIT library that sits beside it.
    lib_dir = str(Path(wrk).parent)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (lib_dir, env.get("LD_LIBRARY_PATH", "")) if p
    )
    # Without taskset (cmd starts with wrk itself), pin in the child before it runs.
    pin = functools.partial(os.sched_setaffinity, 0, set(cores)) if cmd[0] == wrk else None
    doc: dict[str, Any] = {"connections": connections, "threads": min(threads, connections)}
    doc["command"] = " ".join(cmd)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=env,
            timeout=duration_s + timeout_s + 30.0,
            preexec_fn=pin if cores else None,  # sets affinity only: safe beside threads
        )
    except subprocess.TimeoutExpired as exc:
        return {**doc, "error": f"wrk did not finish: {exc}"}
    doc["wall_s"] = round(time.monotonic() - t0, 2)
    try:
        doc.update(parse_wrk_output(proc.stdout))
    except ValueError as exc:
        doc["error"] = f"wrk exit {proc.returncode}: {exc}; stderr: {proc.stderr[-500:]!r}"
    return doc
