"""ops.launch's metrics port: pinned by default, moved by SERVE_APP_METRICS_PORT, refused when
it is not a port (ray.init faked; the endpoint itself: tests/integration/test_metrics.py)."""

from __future__ import annotations

import os

import pytest
import ray

from serve_app.errors import ConfigError, StartupError
from serve_app.ops import launch


@pytest.mark.parametrize(("value", "port"), [(None, launch.DEFAULT_METRICS_PORT), ("9400", 9400)])
def test_start_ray_pins_the_metrics_port(
    monkeypatch: pytest.MonkeyPatch, value: str | None, port: int
) -> None:
    seen: dict[str, object] = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.pop(launch.METRICS_PORT_VAR, None)
    if value is not None:
        os.environ[launch.METRICS_PORT_VAR] = value
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(launch, "port_is_free", lambda host, p: True)  # 8080 may be in use here
    launch.start_ray(num_gpus=0, haproxy=True)
    assert seen["_metrics_export_port"] == port


@pytest.mark.parametrize("value", ["", "http", "0", "70000", "-1"])
def test_a_metrics_port_that_is_not_a_port_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(launch.METRICS_PORT_VAR, value)
    with pytest.raises(ConfigError, match="SERVE_APP_METRICS_PORT"):
        launch.metrics_port()


def test_a_taken_metrics_port_stops_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import socket

    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(ray, "init", lambda **kwargs: pytest.fail("ray.init on a taken port"))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        os.environ[launch.METRICS_PORT_VAR] = str(held.getsockname()[1])
        with pytest.raises(StartupError, match="SERVE_APP_METRICS_PORT"):
            launch.start_ray(num_gpus=0, haproxy=True)
