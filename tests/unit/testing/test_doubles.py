"""Test doubles stay out of production: serve_app.testing is imported only behind the one switch
(serve_app.env.doubles), and the switch turns each double on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serve_app import env
from serve_app.gpu import nvml

ROOT = Path(__file__).resolve().parents[3]

_IMPORT_ALL = """
import importlib, json, pathlib, sys
root = pathlib.Path("serve_app")
mods = sorted(
    ".".join(p.with_suffix("").parts).removesuffix(".__init__")
    for p in root.rglob("*.py")
    if "testing" not in p.parts and p.name != "__main__.py"
)
for m in mods:
    importlib.import_module(m)
from serve_app.config.args import parse_args
from serve_app.gpu.capping import start_partition
part = start_partition(parse_args({"device": "cpu"}), 0.0)
print(json.dumps({"modules": len(mods), "gpu_mode": part.gpu_mode,
                  "testing": sorted(m for m in sys.modules if m.startswith("serve_app.testing"))}))
"""


def _run(extra_env: dict[str, str]) -> dict[str, object]:
    import os

    environ = {
        k: v for k, v in os.environ.items() if k not in (env.FAKE_NVML_VAR, env.FAULT_HOOKS_VAR)
    }
    environ.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_production_never_imports_the_test_doubles_when_they_are_off() -> None:
    got = _run({})
    assert got["testing"] == [] and got["gpu_mode"] == "cpu"
    assert int(got["modules"]) > 50  # every production module was imported  # type: ignore[call-overload]


def test_the_switch_reads_both_doubles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(env.FAKE_NVML_VAR, raising=False)
    monkeypatch.delenv(env.FAULT_HOOKS_VAR, raising=False)
    assert env.doubles() == env.Doubles(nvml_script=None, fault_hooks=False)
    monkeypatch.setenv(env.FAKE_NVML_VAR, "/tmp/script.json")
    monkeypatch.setenv(env.FAULT_HOOKS_VAR, "1")
    assert env.doubles() == env.Doubles(nvml_script="/tmp/script.json", fault_hooks=True)
    monkeypatch.setenv(env.FAULT_HOOKS_VAR, "yes")  # only "1" turns the hooks on
    assert env.doubles().fault_hooks is False


def test_a_scripted_nvml_is_the_testing_double(tmp_path: Path) -> None:
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"devices": {"GPU-a": {"total_bytes": 1000}}, "steps": []}))
    got = _run({env.FAKE_NVML_VAR: str(script)})
    # A CPU replica with no GPU share stays a plain CPU replica; NVML was not even asked.
    assert got["gpu_mode"] == "cpu" and got["testing"] == []
    nvml.set_source(None)
    try:
        import os

        os.environ[env.FAKE_NVML_VAR] = str(script)
        source = nvml.get_source()
        assert source.scripted and type(source).__module__ == "serve_app.testing.nvml"
        assert nvml.is_scripted()
    finally:
        os.environ.pop(env.FAKE_NVML_VAR, None)
        nvml.set_source(None)
