"""warmpool's pure logic: the preload list, Ray's setting from a deploy config, which of the
raylet's children are idle workers, and the keeper's top-up arithmetic (the raylet call itself
is tested on a real cluster: tests/integration/test_warm_workers.py)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from serve_app.config.args import parse_args
from serve_app.errors import ConfigError
from serve_app.startup import warmpool


def test_preload_list_per_adapter_marker_last() -> None:
    emb = warmpool.preload_modules(["embeddings"])
    assert emb[:4] == [
        "serve_app.preloading",  # first: it imports the rest at a low priority
        "torch",
        "ray.serve._private.replica",
        "serve_app.serving.replica",
    ]
    assert "serve_app.adapters.embeddings" in emb
    # serve_app's own BERT encoder: transformers' 4 to 6 s import stays out of every worker
    assert not any(m.startswith("transformers") for m in emb)
    assert "serve_app.adapters.image" not in emb
    assert emb[-1] == warmpool.MARKER_MODULE
    both = warmpool.preload_modules(["image-classification", "embeddings", "image-classification"])
    assert both[-1] == warmpool.MARKER_MODULE
    assert len(both) == len(set(both)) and "serve_app.adapters.image" in both


def test_preload_list_imports_on_the_cpu_install() -> None:
    """Every module named is importable here (Ray would log and skip one that is not)."""
    import importlib.util

    for name in warmpool.preload_modules(["embeddings", "image-classification"]):
        assert importlib.util.find_spec(name) is not None, name


def test_system_config_from_a_deploy_config() -> None:
    doc: dict[str, Any] = {
        "applications": [
            {"name": "a", "import_path": "serve_app.app:build_app", "args": {}},
            {
                "name": "b",
                "import_path": "serve_app.app:build_app",
                "args": {
                    "adapter": "image-classification",
                    "warm_workers": 3,
                    "load_format": "dummy",
                },
            },
            {"name": "other", "import_path": "someone_else:app", "args": {"warm_workers": 9}},
        ]
    }
    adapters, most = warmpool.app_settings(doc)
    assert sorted(adapters) == ["embeddings", "image-classification"] and most == 3
    config = warmpool.system_config(adapters, most)
    assert config == {"preload_python_modules": warmpool.preload_modules(adapters)}
    assert warmpool.system_config(adapters, 0) == {}  # warm workers off: no preload either
    assert warmpool.system_config([], 2) == {}


def test_warm_workers_is_validated() -> None:
    assert parse_args({}).warm_workers == 2
    with pytest.raises(ConfigError, match="warm_workers"):
        parse_args({"warm_workers": -1})


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["ray::IDLE"], True),
        (["ray::ServeReplica:app:model"], False),
        (["/usr/bin/python3", "/x/ray/_private/workers/default_worker.py", "--a"], True),
        (["/x/raylet", "--flag"], False),
        ([], False),
    ],
)
def test_which_children_are_idle_workers(cmdline: list[str], expected: bool) -> None:
    assert warmpool._is_idle_worker(cmdline) == expected


class FakeRaylet:
    """The raylet's children as the keeper sees them: ``prestart`` adds idle workers, each
    with the runtime environment it was asked for."""

    def __init__(self, idle: list[int], busy: list[int]):
        self.idle = list(idle)
        self.busy = list(busy)
        self.env: dict[int, str] = {}
        self.next_pid = 100
        self.asked: list[tuple[int, str]] = []

    def children(self, raylet_pid: int) -> list[tuple[int, list[str]]]:
        return [(p, ["ray::IDLE"]) for p in self.idle] + [
            (p, ["ray::ServeReplica:a:model"]) for p in self.busy
        ]

    def prestart(
        self, count: int, runtime_env: str, job_id: str = "", keep_alive_s: int = 0
    ) -> None:
        self.asked.append((count, runtime_env))
        for _ in range(count):
            self.idle.append(self.next_pid)
            self.env[self.next_pid] = runtime_env
            self.next_pid += 1

    def give_to_an_actor(self, pid: int) -> None:
        self.idle.remove(pid)
        self.busy.append(pid)


def test_keeper_counts_only_its_own_warm_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    raylet = FakeRaylet(idle=[11], busy=[12])  # 11: idle, but not one the keeper asked for
    monkeypatch.setattr(warmpool, "_children", raylet.children)
    monkeypatch.setattr(warmpool, "_idle_child", lambda pid, raylet_pid: pid in raylet.idle)
    monkeypatch.setattr(warmpool, "prestart", raylet.prestart)
    monkeypatch.setattr(warmpool, "workers_rss_bytes", lambda pids: 100 * len(list(pids)))
    lock = tmp_path / "lock"
    keeper = warmpool.Keeper(2, 1, lock, period_s=0.01)
    assert keeper.check() == 2 and raylet.idle == [11, 100, 101]
    assert json.loads(lock.read_text()) == {"default": [100, 101]}  # shared on the node
    assert keeper.check() == 0  # both still idle
    raylet.give_to_an_actor(100)  # a new replica took one
    other = warmpool.Keeper(2, 1, lock, period_s=0.01)  # a neighbour's keeper on the node
    assert other.check() == 1 and json.loads(lock.read_text()) == {"default": [101, 102]}
    assert keeper.check() == 0
    assert raylet.asked == [(2, "{}"), (1, "{}")]
    assert keeper.describe() == {
        "target": 2,
        "idle": 2,
        "requested": 2,
        "idle_rss_bytes": 200,
        "error": None,
        "pool": "default",
        "lock_path": str(lock),
    }


def test_each_runtime_environment_has_its_own_pool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ray gives an actor a worker of its own runtime environment only: an app with its own
    env_vars keeps its own warm workers, and they do not count for the others."""
    raylet = FakeRaylet(idle=[], busy=[])
    monkeypatch.setattr(warmpool, "_children", raylet.children)
    monkeypatch.setattr(warmpool, "_idle_child", lambda pid, raylet_pid: pid in raylet.idle)
    monkeypatch.setattr(warmpool, "prestart", raylet.prestart)
    monkeypatch.setattr(warmpool, "workers_rss_bytes", lambda pids: 0)
    lock = tmp_path / "lock"
    keyed = '{"env_vars": {"SERVE_APP_API_KEYS_FILE": "/k"}}'
    assert warmpool.Keeper(1, 1, lock, 0.01, keyed).check() == 1
    plain = warmpool.Keeper(2, 1, lock, 0.01)
    assert plain.check() == 2  # the keyed app's worker is not one of its own
    pools = json.loads(lock.read_text())
    assert pools == {warmpool.runtime_env_key(keyed): [100], "default": [101, 102]}
    assert [raylet.env[p] for p in pools["default"]] == ["{}", "{}"]
    assert warmpool.runtime_env_key("") == warmpool.runtime_env_key("{}") == "default"
    # A pool belongs to a job too: workers asked for in one job serve only its replicas.
    assert warmpool.runtime_env_key("{}", "01000000") == "default@01000000"
    in_job = warmpool.Keeper(1, 1, lock, 0.01, "{}", "01000000")
    assert in_job.check() == 1 and in_job.describe()["pool"] == "default@01000000"


def test_keeper_reads_a_damaged_list_as_empty() -> None:
    assert warmpool._read_pools("") == {}
    assert warmpool._read_pools("not json") == {}
    assert warmpool._read_pools("[1, 2]") == {}
    assert warmpool._read_pools('{"default": [3, 4, "x"], "b": 5}') == {"default": [3, 4]}


def test_keeper_reports_a_failing_raylet_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(warmpool, "_children", lambda pid: [])

    def refuse(n: int, runtime_env: str, job_id: str = "", keep_alive_s: int = 0) -> None:
        raise RuntimeError("raylet said no")

    monkeypatch.setattr(warmpool, "prestart", refuse)
    keeper = warmpool.Keeper(1, 1, tmp_path / "lock", period_s=0.01)
    monkeypatch.setattr(keeper._stop, "wait", lambda t: keeper._stop.set() or True)
    keeper.run()  # one round: the error is kept for the report, the thread does not die
    assert "raylet said no" in (keeper.describe()["error"] or "")


def test_no_keeper_without_a_target_or_outside_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    assert warmpool.start_keeper(0) is None
    monkeypatch.delenv("RAY_RAYLET_PID", raising=False)
    assert warmpool.start_keeper(2) is None


def test_phase_timer_in_a_warm_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import psutil

    from serve_app.startup.pipeline import PhaseTimer

    started = psutil.Process().create_time()
    preloaded_s = (time.time() - started) / 2  # the preload ended halfway to now
    marker = types.ModuleType(warmpool.MARKER_MODULE)
    marker.AT_S = started + preloaded_s  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, warmpool.MARKER_MODULE, marker)
    timer = PhaseTimer()
    assert timer.preloaded
    assert timer.phases_s["process"] == pytest.approx(preloaded_s, abs=0.01)
    assert timer.phases_s["imports"] == 0.0
    assert timer.waited_s == pytest.approx(preloaded_s, abs=0.5)

    monkeypatch.delitem(sys.modules, warmpool.MARKER_MODULE)
    cold = PhaseTimer()
    assert not cold.preloaded and cold.waited_s is None
    assert cold.phases_s["imports"] >= 0.0


def test_the_system_config_for_ray_start(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[3]
    assert warmpool.main([str(root / "configs" / "gpu-shared.yaml")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"preload_python_modules": warmpool.preload_modules(["embeddings"])}
    assert warmpool.main([str(root / "no-such.yaml")]) == 2
    assert "error:" in capsys.readouterr().err
    assert warmpool.main([]) == 2


def record_top_ups(monkeypatch: pytest.MonkeyPatch, order: list[str]) -> None:
    """A keeper's top-ups without a raylet: each token left and prestart asked for, in
    ``order``."""
    monkeypatch.setattr(warmpool, "_children", lambda pid: [])
    monkeypatch.setattr(warmpool, "leave_tokens", lambda *a: order.append("tokens"))
    monkeypatch.setattr(warmpool, "prestart", lambda *a, **k: order.append("prestart"))
    monkeypatch.setattr(warmpool, "NEW_WORKER_WAIT_S", 0.0)
    monkeypatch.setattr(warmpool, "workers_rss_bytes", lambda pids: 0)


def test_keeper_asks_for_workers_only_after_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The replica's ``first`` (the registry's worker up) comes before any token or prestart;
    one that fails is logged and the keeper goes on."""
    order: list[str] = []
    record_top_ups(monkeypatch, order)
    for first, seen in ((lambda: order.append("first"), "first"), (None, None)):
        order.clear()
        keeper = warmpool.Keeper(1, 1, tmp_path / "lock", period_s=0.01, first=first)
        monkeypatch.setattr(keeper._stop, "wait", lambda t, k=keeper: k._stop.set() or True)
        keeper.run()
        assert order == ([seen] if seen else []) + ["tokens", "prestart"]

    def down() -> None:
        raise TimeoutError("registry not up")

    order.clear()
    keeper = warmpool.Keeper(1, 1, tmp_path / "lock", period_s=0.01, first=down)
    monkeypatch.setattr(keeper._stop, "wait", lambda t: keeper._stop.set() or True)
    keeper.run()
    assert order == ["tokens", "prestart"] and keeper.describe()["error"] is None


def test_the_first_top_up_waits_the_delay_after_first_and_a_stop_meanwhile_ends_it(
    monkeypatch, tmp_path
) -> None:
    order: list[str] = []
    waits: list[float] = []
    record_top_ups(monkeypatch, order)

    def first() -> None:
        order.append("first")

    keeper = warmpool.Keeper(1, 1, tmp_path / "lock", 0.01, first=first, delay_s=60.0)

    def wait(timeout_s: float) -> bool:  # the delay passes; the period after the top-up stops
        waits.append(timeout_s)
        order.append(f"wait {timeout_s:g}")
        if len(waits) > 1:
            keeper._stop.set()
        return keeper._stop.is_set()

    monkeypatch.setattr(keeper._stop, "wait", wait)
    keeper.run()
    assert order == ["first", "wait 60", "tokens", "prestart", "wait 0.01"]

    # Stopped during the delay (the replica went): no worker is asked for.
    order.clear()
    stopped = warmpool.Keeper(1, 1, tmp_path / "lock2", 0.01, delay_s=60.0)
    monkeypatch.setattr(
        stopped._stop, "wait", lambda t: order.append(f"wait {t:g}") or stopped._stop.set() or True
    )
    stopped.run()
    assert order == ["wait 60"]
