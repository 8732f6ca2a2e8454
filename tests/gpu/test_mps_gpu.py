"""MPS mode on the GPU host: the driver's limit, escapes, and the limits that silently fail.

Run it in a pytest process of its own (it starts `serve-app run` as a subprocess, twice):

    python3 -m pytest -m gpu tests/gpu/test_mps_gpu.py -v

1. ``test_escape_refused_under_mps_reported_under_torch``: four MiniLM replicas at 0.25 under
   steady load, through the real CLI (`python -m serve_app run`), once with
   ``memory.enforcement: mps`` and once with ``torch``. One replica allocates its whole budget
   again with a raw ``cuMemAlloc`` (the test-only fault hook), past PyTorch's cap. Under ``mps``
   the driver refuses it; under ``torch`` it succeeds and ``GET /v1/memory`` lists it as an
   escape within a second (so does ``serve-app status``). The other replicas' requests see no
   error in either mode, and the CLI stops the MPS daemon it started.
2. The silent failures, each in a fresh process on the GPU (no Ray): no daemon at the pipe
   directory, CUDA initialised before the limit was set, a client whose pipe directory is not
   the daemon's, a limit that names a device the client cannot see. Each is refused with a
   message that names it.

Results: ``$SERVE_APP_RESULTS_DIR/mps_gpu.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from serve_app.gpu import mps
from serve_app.ops import ports

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
RESULTS: dict[str, Any] = {}
GIB = 1 << 30


def log(msg: str) -> None:
    print(f"[mps test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@pytest.fixture(scope="module", autouse=True)
def write_results(results_dir: Path) -> Iterator[None]:
    yield
    (results_dir / "mps_gpu.json").write_text(json.dumps(RESULTS, indent=1, default=str))


def _config(tmp: Path, enforcement: str, port: int) -> Path:
    doc = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "embeddings",
                "route_prefix": "/",
                "import_path": "serve_app.app:build_app",
                "args": {
                    "adapter": "embeddings",
                    "load_format": "dummy",
                    "dtype": "float16",
                    "memory": {"enforcement": enforcement},
                },
                "deployments": [
                    {
                        "name": "model",
                        "num_replicas": 4,
                        "ray_actor_options": {
                            "num_cpus": 1,
                            "num_gpus": 0.25,
                            "runtime_env": {"env_vars": {"SERVE_APP_FAULT_HOOKS": "1"}},
                        },
                    }
                ],
            }
        ],
    }
    path = tmp / f"mps-{enforcement}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Cli:
    """`python -m serve_app run CONFIG` in a subprocess, its output kept."""

    def __init__(self, config: Path, timeout_s: float = 420.0):
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
        env["SERVE_APP_ALLOW_TEST_DOUBLES"] = "1"  # the config's fault hooks (config.deploy)
        env.pop(mps.PIPE_VAR, None)
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "serve_app", "run", str(config)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.url: str | None = None
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while self.url is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail("serve-app run did not serve:\n" + "\n".join(self.lines[-80:]))
            time.sleep(0.5)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "serve_app is serving at " in line:
                self.url = line.split("serving at ")[1].split(" ")[0]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return int(self.proc.returncode)


class Load:
    """Threads sending embeddings requests until stopped; counts answers by status."""

    def __init__(self, url: str, threads: int = 8):
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self, url: str) -> None:
        body = {"model": "all-MiniLM-L6-v2", "input": ["a sentence to embed"] * 4}
        with httpx.Client(timeout=30.0) as client:
            while not self._stop.is_set():
                try:
                    r = client.post(f"{url}/v1/embeddings", json=body)
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed.append(f"{r.status_code}: {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def _memory(url: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/memory", timeout=10.0)
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def _fault(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/_faults", json=body, timeout=60.0)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _fault_on(url: str, pid: int, body: dict[str, Any], tries: int = 60) -> dict[str, Any]:
    """The hook on the replica with ``pid``: HAProxy spreads requests, so ask until one lands
    there (use it for raw_alloc only after a first call picked the replica, and for raw_free,
    which does nothing on a replica that holds nothing)."""
    for _ in range(tries):
        doc = _fault(url, body)
        if doc["pid"] == pid:
            return doc
    pytest.fail(f"the fault hook never reached pid {pid} in {tries} tries")


def _replicas(url: str, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The replicas' reports once ``count`` have reported."""
    deadline = time.monotonic() + timeout_s
    reps: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        reps = _memory(url)["replicas"]
        if len(reps) >= count:
            return reps
        time.sleep(0.5)
    pytest.fail(f"{len(reps)} of {count} replicas reported within {timeout_s:.0f} s: {reps}")


def _run_mode(tmp: Path, enforcement: str) -> dict[str, Any]:
    port = ports.free_port()
    cli = Cli(_config(tmp, enforcement, port))
    url = cli.url
    assert url is not None
    out: dict[str, Any] = {
        "enforcement": enforcement,
        "notes": [s for s in cli.lines if "MPS" in s],
    }
    try:
        reps = _replicas(url, 4)
        out["replicas"] = [
            {
                k: r.get(k)
                for k in (
                    "pid",
                    "enforcement",
                    "budget_bytes",
                    "cap_bytes",
                    "torch_fraction",
                    "mps_limit_bytes",
                    "nvml_process_bytes",
                    "non_torch_overhead_bytes",
                )
            }
            for r in reps
        ]
        assert len(reps) == 4 and all(r["enforcement"] == enforcement for r in reps)
        if enforcement == "mps":
            for r in reps:
                assert r["torch_fraction"] == 0.0
                assert 0 < r["mps_limit_bytes"] <= r["budget_bytes"]
        load = Load(url)
        time.sleep(3.0)
        # A small raw allocation fits in either mode: a refusal below is the limit's doing.
        small = _fault(url, {"kind": "raw_alloc", "bytes": 256 << 20})
        out["small_raw_alloc"] = small
        assert small["refused"] is False, small
        budget = int(reps[0]["budget_bytes"])  # the same for every replica here
        # A whole budget again, past PyTorch, on whichever replica takes it (one call only: a
        # second would land on another replica and take another budget's worth).
        big = _fault(url, {"kind": "raw_alloc", "bytes": budget})
        t_alloc = time.time()
        out["budget_sized_raw_alloc"] = big
        seen_s = None
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            esc = [
                e for e in _memory(url).get("escapes", []) if e["pid"] == big["pid"] and e["active"]
            ]
            if esc:
                seen_s = time.time() - t_alloc
                out["escape"] = esc[0]
                break
            time.sleep(0.05)
        out["escape_seen_after_s"] = seen_s
        if enforcement == "mps":
            assert big["refused"] is True, big
        else:
            assert big["refused"] is False, big
            assert seen_s is not None, "the escape was not reported within 5 s"
            first = out["escape"]["first_seen_s"]
            out["escape_detected_after_alloc_s"] = round(first - t_alloc, 3)
            status = subprocess.run(
                [sys.executable, "-m", "serve_app", "status", "--url", url],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=ROOT,
            )
            out["status_escape_lines"] = [s for s in status.stdout.splitlines() if "ESCAPE" in s]
            assert out["status_escape_lines"], status.stdout
        time.sleep(2.0)
        out["raw_free"] = [
            _fault_on(url, pid, {"kind": "raw_free"}) for pid in {small["pid"], big["pid"]}
        ]
        time.sleep(2.0)
        load.stop()
        out["load_ok"], out["load_failed"] = load.ok, load.failed[:20]
        out["load_failed_count"] = len(load.failed)
    finally:
        out["cli_exit"] = cli.stop()
        out["cli_tail"] = cli.lines[-15:]
        RESULTS[f"escape_{enforcement}"] = out
        log_dir = Path(os.environ.get("SERVE_APP_RESULTS_DIR", "benchmarks/results/gpu_tests"))
        (log_dir / f"mps_cli_{enforcement}.log").write_text("\n".join(cli.lines))
    return out


@pytest.mark.parametrize("enforcement", ["mps", "torch"])
def test_escape_refused_under_mps_reported_under_torch(tmp_path: Path, enforcement: str) -> None:
    log(f"--- enforcement {enforcement}")
    result = _run_mode(tmp_path, enforcement)
    log(json.dumps({k: v for k, v in result.items() if k not in ("replicas", "cli_tail")}))
    assert result["load_failed_count"] == 0, result["load_failed"]
    assert result["load_ok"] > 100
    if enforcement == "torch":
        assert result["escape_seen_after_s"] is not None
        assert result["escape_detected_after_alloc_s"] <= 1.0
    else:
        assert result["escape_seen_after_s"] is None
        started = [n for n in result["notes"] if "started by serve-app" in n]
        assert started, result["notes"]
        pipe = started[0].split("MPS control daemon at ")[1].split(" ")[0]
        assert not mps.daemon_answers(pipe), "the daemon serve-app started is still running"


# ---- the silent failures, each in a fresh process ---------------------------------------------

CLIENT = textwrap.dedent(
    """
    import json, os, sys
    from serve_app.gpu import mps
    from serve_app.errors import StartupError
    step = sys.argv[1]
    out = {"step": step}
    try:
        if step == "cuda_first":
            import torch
            torch.cuda.is_available()
        plan = mps.plan_client("mps", 0.25, None, None)
        out["limit"] = plan.limit_value
        if step == "pipe_switched":
            os.environ[mps.PIPE_VAR] = os.environ["OTHER_PIPE"]
        if step == "unseen_index":
            os.environ[mps.LIMIT_VAR] = plan.limit_value + ",7=4G"
        import torch
        torch.zeros(1, device="cuda")
        free = torch.cuda.mem_get_info()[0]
        uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
        mps.verify_client(plan, os.getpid(), uuid, int(free))
        out["verified"] = True
    except StartupError as exc:
        out["refused"] = exc.message
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def daemon() -> Iterator[mps.Daemon]:
    saved = os.environ.pop(mps.PIPE_VAR, None)
    d = mps.ensure_daemon()
    try:
        yield d
    finally:
        mps.stop_daemon(d)
        if saved is not None:
            os.environ[mps.PIPE_VAR] = saved


def _client(step: str, env: dict[str, str]) -> dict[str, Any]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS")}
    full.update(
        env,
        CUDA_VISIBLE_DEVICES="0",
        PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    )
    p = subprocess.run(
        [sys.executable, "-c", CLIENT, step], env=full, capture_output=True, text=True, timeout=120
    )
    try:
        doc: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        pytest.fail(f"client {step} failed: {p.stderr[-3000:]}")
    RESULTS.setdefault("silent_failures", {})[step] = doc
    log(json.dumps(doc))
    return doc


def test_a_sound_client_is_verified(daemon: mps.Daemon, tmp_path: Path) -> None:
    doc = _client("sound", {mps.PIPE_VAR: daemon.pipe_dir})
    assert doc.get("verified") is True, doc


def test_no_daemon_is_refused(tmp_path: Path) -> None:
    doc = _client("no_daemon", {mps.PIPE_VAR: str(tmp_path)})
    assert "no MPS control daemon answers" in doc.get("refused", ""), doc


def test_cuda_initialised_first_is_refused(daemon: mps.Daemon) -> None:
    doc = _client("cuda_first", {mps.PIPE_VAR: daemon.pipe_dir})
    assert "before serve_app could set its MPS memory limit" in doc.get("refused", ""), doc


def test_pipe_directory_not_the_daemons_is_refused(daemon: mps.Daemon, tmp_path: Path) -> None:
    doc = _client("pipe_switched", {mps.PIPE_VAR: daemon.pipe_dir, "OTHER_PIPE": str(tmp_path)})
    assert "is not an MPS client" in doc.get("refused", ""), doc


def test_limit_naming_an_unseen_device_is_refused(daemon: mps.Daemon) -> None:
    doc = _client("unseen_index", {mps.PIPE_VAR: daemon.pipe_dir})
    assert "is not in force" in doc.get("refused", ""), doc
