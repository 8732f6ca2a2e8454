"""serve-app plan --from-running against a real running server (the session cluster, HAProxy,
the CPU): the user model of examples/custom_model deployed, a closed loop of requests driven
through HTTP while the command reads GET /v1/memory twice and Ray's metrics, and the plan,
measurements.json and changes.md it writes; then its errors (an application not running, a
URL with no server, a URL that is not serve_app, a window with no traffic)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from serve_app.ops.cli import main
from serve_app.ops.launch import METRICS_PORT_VAR
from serve_app.ops.ports import free_port
from serve_app.plan.measurements import load_measurements
from serve_app.plan.scrape import mean_items, parse

APP, PREFIX = "fromrun", "/fromrun"
ARGS = {
    "adapter": "examples.custom_model.model:ByteScorer",
    "adapter_options": {"seed": 0},
    "max_inputs_per_request": 64,
    "max_batch_size": 8,
    "warm_workers": 0,
}
OPTIONS = {"num_cpus": 0.5}
TEXTS = [f"a text of a few words, number {i}" for i in range(4)]
WINDOW_S = "4"


def config(tmp_path: Path, name: str = APP) -> Path:
    doc = {
        "applications": [
            {
                "name": name,
                "route_prefix": PREFIX,
                "import_path": "serve_app.app:build_app",
                "args": ARGS,
                "deployments": [{"name": "model", "num_replicas": 1, "ray_actor_options": OPTIONS}],
            }
        ]
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def targets(tmp_path: Path, name: str, **ask: Any) -> Path:
    path = tmp_path / f"targets-{name}.yaml"
    base = {"p99_target_s": 2.0, "items_per_request": len(TEXTS), "max_replicas": 2}
    path.write_text(yaml.safe_dump({"models": {APP: base | ask}}))
    return path


@pytest.fixture(scope="module")
def server(cluster) -> Iterator[str]:
    """The application's base URL, where GET /v1/memory lists every replica's report."""
    yield cluster.deploy(APP, PREFIX, ARGS, ray_actor_options=OPTIONS)
    cluster.delete(APP)


class Load:
    """A closed loop of ``clients`` threads posting to the app until stopped."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.stop = threading.Event()
        self.codes: dict[int, int] = {}
        self.threads = [threading.Thread(target=self._run, args=(url,)) for _ in range(clients)]

    def _run(self, url: str) -> None:
        with httpx.Client(timeout=30.0) as client:
            while not self.stop.is_set():
                code = client.post(url, json={"inputs": TEXTS}).status_code
                self.codes[code] = self.codes.get(code, 0) + 1

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def test_replan_from_a_running_server(server: str, tmp_path: Path, capsys) -> None:
    metrics = f"http://127.0.0.1:{os.environ[METRICS_PORT_VAR]}/metrics"
    cfg = config(tmp_path)
    grow, same = tmp_path / "grow", tmp_path / "same"
    common = ["--from-running", server, "--window-s", WINDOW_S, "--metrics", metrics]
    with Load(f"{server}/v1/predict") as load:
        # Ray's metrics endpoint lags the replica by a few seconds, more on a loaded host.
        deadline = time.monotonic() + 60.0
        while mean_items(parse(httpx.get(metrics, timeout=10.0).text), APP) is None:
            assert time.monotonic() < deadline, f"Ray's metrics never showed {APP}'s items"
            time.sleep(1.0)
        # At least 2 replicas asked: the plan says to add one.
        ask = targets(tmp_path, "grow", min_replicas=2)
        rc = main(["plan", str(cfg), "--targets", str(ask), "--out", str(grow), *common])
        out = capsys.readouterr()
        assert rc == 0, out.out[-3000:] + out.err[-3000:]
        # At most the one that runs: no change.
        ask = targets(tmp_path, "same", max_replicas=1, load_rps=1)
        rc = main(["plan", str(cfg), "--targets", str(ask), "--out", str(same), *common])
        out = capsys.readouterr()
        assert rc == 0, out.out[-3000:] + out.err[-3000:]
    assert set(load.codes) == {200}, load.codes

    m = load_measurements(grow / "measurements.json")  # as serve-app plan reads it
    spec = m.models[APP]
    assert [c.batch_size for c in spec.candidates] == [8]  # the cap in force
    cand = spec.candidates[0]
    assert cand.throughput_rps > 1 and 0 < cand.p99_idle_s <= 10 and cand.gpu_s_per_request == 0
    assert spec.weights_bytes > 50 << 20  # the replica's RSS stands in on the CPU
    assert 0 < spec.cpu_s_per_request < 1
    for field in ("throughput_rps", "p99_idle_s", "cpu_s_per_request", "weights_bytes"):
        assert spec.sources[field].startswith(f"read from the running server at {server}"), field
    assert "Ray's metrics" in spec.sources["throughput_rps"]  # requests counted, not estimated
    # The replica runs on this host: its threads were read, and the busiest bounds the rate if
    # it was busier than the model thread.
    assert "busiest" in spec.sources["throughput_rps"], spec.sources["throughput_rps"]
    assert "ASSUMPTION" not in spec.sources["p99_idle_s"] + spec.sources["cpu_s_per_request"]

    plan = json.loads((grow / "plan.json").read_text())
    (change,) = plan["changes"]
    assert change["application"] == APP and change["now"]["replicas"] == 1
    assert change["plan"]["replicas"] == 2 and change["change"] is True
    assert "replicas 1 -> 2" in change["what"]
    assert "the targets ask for at least 2 replicas (min_replicas)" in change["why"]
    text = (grow / "changes.md").read_text()
    assert f"| {APP} | 1 -> 2 |" in text and "replicas 1 -> 2" in text, text
    written = yaml.safe_load((grow / "serve_config.yaml").read_text())
    assert written["applications"][0]["deployments"][0]["num_replicas"] == 2

    (change,) = json.loads((same / "plan.json").read_text())["changes"]
    assert change["change"] is False and change["what"] == []
    assert "No change" in (same / "changes.md").read_text()


def test_replan_errors_name_the_problem(server: str, tmp_path: Path, capsys) -> None:
    cfg = config(tmp_path)
    ask = targets(tmp_path, "any")
    out = str(tmp_path / "out")
    base = ["plan", str(cfg), "--targets", str(ask), "--out", out, "--window-s", "1"]

    def fails(*argv: str) -> str:
        assert main([*argv]) == 2
        return str(capsys.readouterr().err)

    ghost = config(tmp_path, "ghost")
    err = fails("plan", str(ghost), "--targets", str(ask), "--out", out, "--from-running", server)
    assert "application ghost of CONFIG is not running" in err and "no target" in err, err
    nobody = f"http://127.0.0.1:{free_port()}"
    assert f"cannot reach {nobody}" in fails(*base, "--from-running", nobody)
    metrics = f"http://127.0.0.1:{os.environ[METRICS_PORT_VAR]}"
    assert "is not a serve_app server" in fails(*base, "--from-running", metrics)
    # No traffic in the window: refused, naming what it saw.
    err = fails(*base, "--from-running", server)
    assert f"application {APP}: too little traffic" in err and " batches, " in err, err
