"""MPS mode's pure parts on the CPU: the limit's text, the checks before CUDA, the config
checks, the daemon's refusals, and escape detection. The driver's side (limits refused, clients
verified, escapes under load) is tests/gpu/test_mps_gpu.py on the H200."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from serve_app.config.args import parse_args
from serve_app.config.deploy import check_deploy_config
from serve_app.control.escapes import Escape, WatchedReplica, find_escapes
from serve_app.control.monitor import GpuMonitor
from serve_app.errors import ConfigError, StartupError
from serve_app.gpu import mps, nvml
from serve_app.ops import launch
from serve_app.testing.nvml import ScriptedSource

GIB = 1 << 30
UUID = "GPU-00000000-0000-0000-0000-000000000001"


def test_format_limit_is_whole_mib_for_device_0() -> None:
    assert mps.format_limit(4 * GIB) == "0=4096M"
    assert mps.format_limit(4 * GIB + 12345) == "0=4096M"  # rounded down, never up


@pytest.mark.parametrize("value", ["0=4096M", "0=4G", f"{UUID}=4G", "0=12G"])
def test_sound_limits_pass(value: str) -> None:
    assert mps.check_limit_value(value) == []


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("0=4294967296", "silently ignores a bare byte count"),  # measured: no limit at all
        ("0=4G,7=4G", "drops every limit"),  # measured: the 0 entry went too
        ("1=4G", "names device 1"),
        ("zero=4G", "is not DEVICE=SIZE"),
        ("0=4T", "is not DEVICE=SIZE"),
    ],
)
def test_silent_limits_are_refused(value: str, words: str) -> None:
    problems = mps.check_limit_value(value)
    assert problems and words in " ".join(problems)


def _deploy(args: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    return {
        "applications": [
            {
                "name": "a",
                "route_prefix": "/",
                "import_path": "serve_app.app:build_app",
                "args": args,
                "deployments": [{"name": "model", "ray_actor_options": opts}],
            }
        ]
    }


def test_config_accepts_mps_and_rejects_compute_share_without_it() -> None:
    args = parse_args({"memory": {"enforcement": "mps", "compute_share": 0.5}})
    assert args.memory.enforcement == "mps" and args.memory.compute_share == 0.5
    assert parse_args({}).memory.enforcement == "torch"
    with pytest.raises(ConfigError, match="compute_share .* needs enforcement mps or both"):
        parse_args({"memory": {"compute_share": 0.5}})
    with pytest.raises(ConfigError, match=r"args.memory.enforcement: .*use one of"):
        parse_args({"memory": {"enforcement": "driver"}})


def test_check_names_mps_fields_and_fixes() -> None:
    no_gpu = check_deploy_config(_deploy({"memory": {"enforcement": "mps"}}, {"num_cpus": 1}))
    assert any("enforcement: mps needs a GPU share" in e for e in no_gpu), no_gpu
    env_set = check_deploy_config(
        _deploy(
            {"memory": {"enforcement": "both"}},
            {"num_gpus": 0.25, "runtime_env": {"env_vars": {mps.LIMIT_VAR: "0=4G"}}},
        )
    )
    assert any("serve_app sets it for each replica" in e for e in env_set), env_set
    bare = check_deploy_config(
        _deploy({}, {"num_gpus": 0.25, "runtime_env": {"env_vars": {mps.LIMIT_VAR: "0=1000"}}})
    )
    assert any("bare byte count" in e and "env_vars.CUDA_MPS" in e for e in bare), bare
    ok = _deploy({"memory": {"enforcement": "mps"}}, {"num_gpus": 0.25})
    assert check_deploy_config(ok) == []


def _script(tmp: Path, **step: Any) -> Path:
    path = tmp / "nvml.json"
    script = {
        "devices": {UUID: {"total_bytes": 100 * GIB, "reserved_bytes": GIB}},
        "steps": [{"at_s": 0, "devices": {UUID: {"free_bytes": 90 * GIB}}, **step}],
    }
    path.write_text(json.dumps(script))
    return path


@pytest.fixture
def scripted(tmp_path: Path) -> Any:
    def use(**step: Any) -> None:
        nvml.set_source(ScriptedSource(_script(tmp_path, **step)))

    yield use
    nvml.set_source(None)


@pytest.fixture
def client_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A replica's environment: one visible GPU, a pipe directory, CUDA not initialised."""
    for var in (mps.LIMIT_VAR, mps.THREADS_VAR):  # whatever the code sets is undone after
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv(mps.PIPE_VAR, str(tmp_path))
    monkeypatch.setattr(mps, "driver_initialized", lambda: False)
    monkeypatch.setattr(mps, "daemon_answers", lambda pipe: pipe == str(tmp_path))
    return tmp_path


def test_plan_sets_the_limit_from_nvml_usable_bytes(client_env: Path, scripted: Any) -> None:
    scripted()
    plan = mps.plan_client("mps", 0.25, None, 0.5)
    assert plan is not None
    # (100 GiB total - 1 GiB reserved) x 0.25, whole MiB
    assert plan.limit_bytes == (int(0.25 * 99 * GIB) // (1 << 20)) * (1 << 20)
    assert os.environ[mps.LIMIT_VAR] == f"0={plan.limit_bytes >> 20}M"
    assert os.environ[mps.THREADS_VAR] == "50" and plan.thread_percentage == 50
    assert plan.gpu_uuid == UUID and plan.pipe_dir == str(client_env)
    frac = mps.plan_client("both", 0.25, 0.1, None)
    assert frac is not None and frac.limit_bytes == (int(0.1 * 99 * GIB) >> 20) << 20


def test_torch_mode_sets_nothing_but_refuses_a_silent_inherited_limit(
    client_env: Path, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted()
    assert mps.plan_client("torch", 0.25, None, None) is None
    assert mps.LIMIT_VAR not in os.environ
    monkeypatch.setenv(mps.LIMIT_VAR, "0=1073741824")
    with pytest.raises(StartupError, match="bare byte count"):
        mps.plan_client("torch", 0.25, None, None)


def test_plan_refusals(client_env: Path, scripted: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    scripted()
    with pytest.raises(StartupError, match="needs a GPU share"):
        mps.plan_client("mps", 0.0, None, None)
    monkeypatch.setenv(mps.PIPE_VAR, str(client_env / "elsewhere"))
    with pytest.raises(StartupError, match="no MPS control daemon answers at .*elsewhere"):
        mps.plan_client("mps", 0.25, None, None)
    monkeypatch.setenv(mps.PIPE_VAR, str(client_env))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(StartupError, match="exactly one GPU"):
        mps.plan_client("mps", 0.25, None, None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(StartupError, match="below the 1.00 GiB"):
        mps.plan_client("mps", 0.005, None, None)
    monkeypatch.setattr(mps, "driver_initialized", lambda: True)
    with pytest.raises(StartupError, match="CUDA was initialised .* before serve_app"):
        mps.plan_client("mps", 0.25, None, None)
    assert mps.LIMIT_VAR not in os.environ  # nothing set by a refused plan


def test_verify_names_each_silent_failure(client_env: Path, scripted: Any) -> None:
    scripted(mps_clients={UUID: [111]})
    plan = mps.plan_client("mps", 0.25, None, None)
    assert plan is not None
    mps.verify_client(plan, 111, UUID, plan.limit_bytes - GIB)  # an MPS client, limit in force
    with pytest.raises(StartupError, match="is not an MPS client"):
        mps.verify_client(plan, 222, UUID, plan.limit_bytes - GIB)
    with pytest.raises(StartupError, match="is not in force"):
        mps.verify_client(plan, 111, UUID, 90 * GIB)


def test_daemon_refused_where_mps_cannot_run(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(mps_blockers=["GPU 0 is in MIG mode"])
    with pytest.raises(StartupError, match="MIG mode.*enforcement: torch"):
        mps.ensure_daemon()
    scripted()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(StartupError, match="nvidia-cuda-mps-control is not on PATH"):
        mps.ensure_daemon()


def test_run_refuses_mps_without_a_gpu() -> None:
    doc = _deploy({"memory": {"enforcement": "mps"}}, {"num_gpus": 0.25})
    with pytest.raises(StartupError, match="needs an NVIDIA GPU.*enforcement: torch"):
        launch.start_mps_if_needed(doc, gpus=0)
    assert launch.start_mps_if_needed(_deploy({}, {"num_gpus": 0.25}), gpus=0) is None


def test_stop_daemon_leaves_one_it_did_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(mps, "_control", lambda pipe, cmd, timeout_s=10.0: calls.append(cmd))
    mps.stop_daemon(mps.Daemon("/tmp/x", None, started=False))
    assert calls == []
    mps.stop_daemon(mps.Daemon("/tmp/x", None, started=True))
    assert calls == ["quit"]


def _watched(pid: int, budget: int = 10 * GIB) -> WatchedReplica:
    return WatchedReplica(f"r{pid}", "app", pid, UUID, budget, "torch")


def test_find_escapes_over_budget_only_and_remembers_them() -> None:
    watched = {1: _watched(1), 2: _watched(2)}
    first = find_escapes(watched, {UUID: {1: 12 * GIB, 2: 9 * GIB}}, {}, now_s=5.0)
    assert list(first) == [1]
    esc = first[1]
    assert esc.active and esc.over_bytes == 2 * GIB and esc.first_seen_s == 5.0
    later = find_escapes(watched, {UUID: {1: 13 * GIB}}, first, now_s=6.0)
    assert later[1].first_seen_s == 5.0 and later[1].peak_bytes == 13 * GIB
    back = find_escapes(watched, {UUID: {1: 9 * GIB}}, later, now_s=7.0)
    assert not back[1].active and back[1].peak_bytes == 13 * GIB
    unread = find_escapes(watched, {}, back, now_s=8.0)  # a failed read keeps what was known
    assert not unread[1].active


def test_monitor_checks_watched_replicas_and_drops_exited_ones() -> None:
    mon = GpuMonitor("node", start=False, ray_gpu=lambda: None)
    me = os.getpid()
    mon.watch(_watched(me))
    mon.watch(_watched(2**22 + 12345))  # no such process: dropped on the next check
    found = mon.check_escapes(read=lambda uuid: {me: 11 * GIB})
    assert [e.pid for e in found] == [me] and found[0].active
    assert mon.snapshot()[2] == found
    assert [e for e in mon.escapes() if isinstance(e, Escape)] == found
    assert set(mon._watched) == {me}


def test_daemon_answers_by_its_socket_and_live_pid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert not mps.daemon_answers(str(tmp_path))  # nothing there
    (tmp_path / "control").touch()
    (tmp_path / "nvidia-cuda-mps-control.pid").write_text(f"{os.getpid()}\n")
    assert mps.daemon_answers(str(tmp_path))
    (tmp_path / "nvidia-cuda-mps-control.pid").write_text("4194303\n")  # no such process
    monkeypatch.setenv("PATH", "/nonexistent")  # and no control program to ask
    assert not mps.daemon_answers(str(tmp_path))


# ---- whose daemon: a fake /tmp/nvidia-mps tree ----------------------------------------------

ME = os.getuid()
OTHER = 65534 if ME != 65534 else 65533  # nobody: never root, never this user
as_root = pytest.mark.skipif(ME != 0, reason="chown to another user needs root")


def _fake_daemon(root: Path, pid: int | None = None) -> Path:
    """A pipe directory as the driver's daemon leaves it: a control socket and a PID file."""
    pipe = root / "nvidia-mps"
    pipe.mkdir()
    (pipe / "control").touch()
    (pipe / "nvidia-cuda-mps-control.pid").write_text(f"{pid or os.getpid()}\n")
    return pipe


def test_a_daemon_whose_files_are_ours_or_roots_is_trusted(tmp_path: Path) -> None:
    pipe = _fake_daemon(tmp_path)
    (tmp_path / "log").mkdir()
    assert mps.trust_problem(str(pipe), str(tmp_path / "log"), frozenset({0, ME})) is None
    mps.refuse_untrusted(str(pipe), str(tmp_path / "log"))  # the default: root and this user


def test_a_daemon_whose_files_are_someone_elses_is_refused(tmp_path: Path) -> None:
    """Pure logic: the same tree, judged for a user who owns none of it."""
    pipe = _fake_daemon(tmp_path)
    problem = mps.trust_problem(str(pipe), None, frozenset({OTHER}))
    assert problem == f"its pipe directory {pipe} belongs to uid {ME}"
    with pytest.raises(StartupError, match=r"is not adopted: its pipe directory .* uid \d+"):
        mps.refuse_untrusted(str(pipe), None, frozenset({OTHER}))


def test_a_pid_of_another_user_is_refused(tmp_path: Path) -> None:
    """The files are ours; the PID they name runs as someone this test does not allow: a child
    running as nobody when we are root, else PID 1 (root), judged for this user alone."""
    child = None
    if ME == 0:
        child = subprocess.Popen(["sleep", "30"], user=OTHER)
        pid, runs_as = child.pid, OTHER
    else:
        pid, runs_as = 1, 0
    try:
        pipe = _fake_daemon(tmp_path, pid)
        problem = mps.trust_problem(str(pipe), None, frozenset({ME}))
        assert problem == f"its PID {pid} runs as uid {runs_as}"
    finally:
        if child is not None:
            child.kill()
            child.wait()


@pytest.mark.skipif(ME == 0, reason="as root, the chown test below covers it")
def test_a_log_directory_of_someone_else_is_refused(tmp_path: Path) -> None:
    """Pure logic: "/" is root's, judged for this (non-root) user alone."""
    pipe = _fake_daemon(tmp_path)
    problem = mps.trust_problem(str(pipe), "/", frozenset({ME}))
    assert problem == f"its log directory ({mps.LOG_VAR}) / belongs to uid 0"


@as_root
@pytest.mark.parametrize("planted", ["control", "nvidia-cuda-mps-control.pid", ".", "log"])
def test_run_and_replicas_refuse_a_planted_daemon(
    tmp_path: Path, scripted: Any, monkeypatch: pytest.MonkeyPatch, planted: str
) -> None:
    """Root's own check, no injection: one file of the tree chowned to nobody, and both
    `serve-app run` (ensure_daemon) and a replica (plan_client) refuse to adopt it."""
    pipe = _fake_daemon(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    os.chown(log if planted == "log" else pipe / planted, OTHER, OTHER)
    scripted()
    monkeypatch.setenv(mps.PIPE_VAR, str(pipe))
    monkeypatch.setenv(mps.LOG_VAR, str(log))
    monkeypatch.setattr(mps.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(mps, "daemon_answers", lambda p: True)
    with pytest.raises(StartupError, match=f"is not adopted: .* belongs to uid {OTHER}"):
        mps.ensure_daemon()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(mps, "driver_initialized", lambda: False)
    with pytest.raises(StartupError, match=f"is not adopted: .* belongs to uid {OTHER}"):
        mps.plan_client("mps", 0.25, None, None)
    assert mps.LIMIT_VAR not in os.environ or not os.environ[mps.LIMIT_VAR]


@as_root
def test_run_refuses_to_start_its_daemon_in_directories_someone_else_made(
    tmp_path: Path, scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    os.chown(pipe, OTHER, OTHER)
    scripted()
    monkeypatch.setenv(mps.PIPE_VAR, str(pipe))
    monkeypatch.delenv(mps.LOG_VAR, raising=False)
    monkeypatch.setattr(mps.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(mps, "daemon_answers", lambda p: False)
    started: list[str] = []
    monkeypatch.setattr(mps.subprocess, "run", lambda *a, **k: started.append("run"))
    with pytest.raises(StartupError, match=f"pipe directory {pipe} belongs to uid {OTHER}"):
        mps.ensure_daemon()
    assert started == []
