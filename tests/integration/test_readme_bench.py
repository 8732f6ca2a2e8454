"""The README's load-test commands, as written there, against the server the README starts.

`serve-app run` serves configs/default.yaml (model "all-MiniLM-L6-v2" at route prefix "/"); the
README's `python -m load_tests.bench ...` and locust lines must get answers from it, not 404s.
The commands are parsed from README.md, so an edit there is what runs here. Only the origin
(this session's cluster listens on a free port, not 8000), the output paths and the durations
are replaced, so that the test stays short: the model, kinds, rates and every other default are
the README's.
"""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README_ORIGIN = "http://127.0.0.1:8000"
# Appended after the README's arguments (argparse keeps the last occurrence): short points.
BENCH_SHORTER = ["--duration-s", "2", "--warmup-s", "0.5", "--pause-s", "0.2", "--no-progress"]


def readme_command(program: str) -> list[str]:
    """The README's shell command (joined over backslash continuations) that runs `program`,
    as an argument list. Fails the test when the README has none."""
    text = (ROOT / "README.md").read_text()
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("#") and program in line:
            return shlex.split(line)
    raise AssertionError(f"README.md has no command running {program!r}")


def _readme_server_args() -> dict[str, object]:
    """The app args of configs/default.yaml: what `serve-app run` deploys."""
    doc = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    app = doc["applications"][0]
    assert app["route_prefix"] == "/", app
    return dict(app["args"])


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return argv[: i + 1] + [value] + argv[i + 2 :]


def test_readme_bench_parsed_as_expected() -> None:
    argv = readme_command("-m load_tests.bench")
    assert argv[:3] == [".venv/bin/python", "-m", "load_tests.bench"], argv
    assert argv[argv.index("--url") + 1].startswith(README_ORIGIN + "/v1/embeddings"), argv
    assert "--model" not in argv  # the README relies on the default model name


@pytest.fixture(scope="module")
def readme_server(cluster) -> Iterator[str]:
    """What `serve-app run` serves, at route prefix "/": deployed once for both commands."""
    base = cluster.deploy("readme", "/", _readme_server_args(), ray_actor_options={"num_cpus": 0.5})
    yield base
    cluster.delete("readme")


def test_readme_bench_command_gets_answers(cluster, readme_server: str, tmp_path: Path) -> None:
    assert readme_server == cluster.base_url
    argv = readme_command("-m load_tests.bench")
    url = argv[argv.index("--url") + 1]
    argv = _replace(argv, "--url", url.replace(README_ORIGIN, cluster.base_url))
    out = tmp_path / "bench"
    argv = _replace(argv, "--out", str(out)) + BENCH_SHORTER
    proc = subprocess.run(
        [sys.executable, *argv[1:]], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    assert len(doc["rates"]) == 3, doc["rates"]
    for rate in doc["rates"]:
        assert rate["errors"] == 0, rate["error_counts"]  # a wrong model name: all 404
        assert rate["ok"] >= 1, rate
    assert doc["config"]["model"] == "all-MiniLM-L6-v2"


def test_readme_locust_command_gets_answers(cluster, readme_server: str, tmp_path: Path) -> None:
    argv = readme_command("load_tests/locustfile.py")
    assert Path(argv[0]).name == "locust", argv
    argv = _replace(argv, "--host", cluster.base_url)
    argv = _replace(argv, "--csv", str(tmp_path / "locust"))
    argv = _replace(argv, "-t", "4s")
    locust = Path(sys.executable).with_name("locust")
    proc = subprocess.run(
        [str(locust), *argv[1:], "--only-summary"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=90,
    )
    stats = list(csv.DictReader((tmp_path / "locust_stats.csv").open()))
    total = next(r for r in stats if r["Name"] == "Aggregated")
    detail = proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(total["Failure Count"]) == 0, detail
    assert int(total["Request Count"]) >= 1, detail
