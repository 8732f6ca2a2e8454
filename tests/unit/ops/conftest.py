"""ops tests call start_ray with ray.init faked; its check that the metrics port is free then
looks at a free port, not the pinned default a server on this machine may hold."""

from __future__ import annotations

import pytest

from serve_app.ops.launch import METRICS_PORT_VAR
from serve_app.ops.ports import free_port


@pytest.fixture(autouse=True)
def _free_metrics_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(METRICS_PORT_VAR, str(free_port()))
