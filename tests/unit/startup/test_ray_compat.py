"""startup.ray_compat against the installed Ray, without a cluster: the version it was read
from, the values it copies, the HAProxy template its retry-on value rides on, the raylet request
it builds, and what it answers when this process is not connected. The calls that need a
cluster run in tests/integration (test_warm_workers.py, conftest.py's deploy)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import jinja2
import pytest
import ray

from serve_app.startup import ray_compat


def test_read_from_the_installed_ray_version() -> None:
    # On a Ray upgrade, re-read the sources each name in ray_compat cites, then change this.
    assert ray.__version__ == ray_compat.RAY_VERSION


def test_copied_serve_timings_are_rays_own() -> None:
    from ray.serve._private import constants
    from ray.serve.config import AutoscalingConfig

    fields = AutoscalingConfig.model_fields
    assert fields["metrics_interval_s"].default == ray_compat.DEFAULT_METRICS_INTERVAL_S
    assert fields["look_back_period_s"].default == ray_compat.DEFAULT_LOOK_BACK_PERIOD_S
    assert (
        constants.RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR
        == ray_compat.METRIC_RECORD_INTERVAL_FACTOR
    )
    assert constants.CONTROL_LOOP_INTERVAL_S == ray_compat.CONTROL_LOOP_INTERVAL_S
    assert ray_compat.proxy_start_timeout_s() == float(constants.HTTP_PROXY_TIMEOUT)


def test_the_replica_module_holds_serves_replica_actor() -> None:
    assert importlib.util.find_spec(ray_compat.SERVE_REPLICA_MODULE) is not None
    module = importlib.import_module(ray_compat.SERVE_REPLICA_MODULE)
    assert hasattr(module, "ReplicaActor")


def _rendered_defaults_section(retry_on: str) -> list[str]:
    """The ``defaults`` section of Serve's HAProxy config as Ray's template renders it."""
    from ray.serve._private.haproxy import HAProxyConfig
    from ray.serve._private.haproxy_templates import HAPROXY_CONFIG_TEMPLATE as template

    start = template.index("\ndefaults\n") + 1
    end = re.compile(r"^[a-z]", re.M).search(template, start + len("defaults\n"))
    assert end is not None
    section = template[start : end.start()]
    text = jinja2.Environment().from_string(section).render(config=HAProxyConfig(retry_on=retry_on))
    return text.splitlines()


def test_extra_lines_ride_on_retry_on_into_haproxys_defaults_section() -> None:
    value = ray_compat.haproxy_retry_on_with_lines(
        "conn-failure empty-response", "option http-buffer-request"
    )
    assert value == "conn-failure empty-response\n    option http-buffer-request"
    lines = _rendered_defaults_section(value)
    assert lines[0] == "defaults"
    assert "    retry-on conn-failure empty-response" in lines
    assert "    option http-buffer-request" in lines  # a line of its own, in the section
    assert ray_compat.haproxy_retry_on_with_lines("conn-failure") == "conn-failure"


def test_ray_reads_the_retry_on_variable_verbatim() -> None:
    value = ray_compat.haproxy_retry_on_with_lines("conn-failure", "option http-buffer-request")
    code = (
        "from ray.serve._private.haproxy import HAProxyConfig; "
        "print(repr(HAProxyConfig().retry_on))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, ray_compat.HAPROXY_RETRY_ON_VAR: value},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr(value)


def test_prestart_request_carries_the_count_the_environment_and_the_job() -> None:
    from ray.core.generated import common_pb2

    request = ray_compat.prestart_request(3, '{"env_vars": {"A": "1"}}', "01000000", 3600)
    assert request.num_workers == 3 and request.keep_alive_duration_secs == 3600
    assert request.language == common_pb2.PYTHON
    assert request.job_id == bytes.fromhex("01000000")
    assert request.runtime_env_info.serialized_runtime_env == '{"env_vars": {"A": "1"}}'
    plain = ray_compat.prestart_request(1, "{}", "", 10)
    assert plain.job_id == b"" and not plain.HasField("runtime_env_info")


_OUTSIDE_A_SESSION = """
import json, ray
from serve_app.startup import ray_compat
assert not ray.is_initialized()
errors = []
for call in (lambda: ray_compat.raylet_address(),
             lambda: ray_compat.prestart_workers(1, "{}", "", 10, timeout_s=1.0)):
    try:
        call()
        errors.append(None)
    except RuntimeError as exc:
        errors.append(str(exc))
print(json.dumps([ray_compat.session_dir(), ray_compat.metrics_export_port(), errors]))
"""


def test_outside_a_ray_session_there_is_no_node() -> None:
    """In a fresh process (this one may hold the integration suite's Ray session)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _OUTSIDE_A_SESSION], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    session_dir, port, errors = json.loads(done.stdout.strip().splitlines()[-1])
    assert session_dir is None and port is None
    assert len(errors) == 2 and all("not connected to Ray" in (e or "") for e in errors), errors


_LOOPBACK_AND_AUTH = """
import json, os
os.environ.pop("RAY_AUTH_MODE", None)
os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)  # a test session's Ray set it
import ray
from ray._private import services
from ray._raylet import AuthenticationMode, get_authentication_mode
from serve_app.startup import ray_compat
def seen():
    token = get_authentication_mode() == AuthenticationMode.TOKEN
    return [services.resolve_ip_for_localhost("127.0.0.1"), token]
before = seen()
ray_compat.keep_node_on_loopback()
os.environ["RAY_AUTH_MODE"] = "token"
ray_compat.reread_auth_mode()
after = seen()
print(json.dumps([before, after, os.environ[ray_compat.LOOPBACK_NODE_VAR]]))
"""


def test_loopback_stays_loopback_and_a_late_auth_mode_is_seen() -> None:
    """In a fresh process, where Ray was imported before the mode was set, as in a test run."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LOOPBACK_AND_AUTH], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, var = json.loads(done.stdout.strip().splitlines()[-1])
    assert before[1] is False and after == ["127.0.0.1", True] and var == "0"
    assert before[0] != "127.0.0.1"  # what Ray does unasked: the routable IP


@pytest.mark.parametrize(
    "name", ["embeddings", "emb app", "a/b#c", "x.y-z_1", "ünï cödé", "SERVE_REPLICA::a#m#r"]
)
def test_haproxys_names_follow_serves_own_rule(name: str) -> None:
    from ray.serve._private.haproxy import HAProxyManager

    safe = HAProxyManager.get_safe_name
    assert ray_compat.haproxy_server_key(name, f"SERVE_REPLICA::{name}#model#r1") == (
        f"{safe('http-' + name)}/{safe(f'SERVE_REPLICA::{name}#model#r1')}"
    )
    # As test_reliability's servers are named in a live HAProxy.
    assert ray_compat.haproxy_server_key("emb app", "SERVE_REPLICA::emb app#model#23o5dmxk") == (
        "http-emb_app/SERVE_REPLICA_emb_app-model-23o5dmxk"
    )
