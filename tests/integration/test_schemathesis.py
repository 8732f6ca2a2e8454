"""Schemathesis against a CPU replica's own /openapi.json: every check, bodies fuzzed both
schema-valid and schema-violating (``--mode all``), 500 examples per operation.

It asserts that schemathesis found nothing (every status and header a route answered is in the
document, every valid body is accepted, every invalid one refused with a 4xx) and that no
response was a 5xx. A second application with API keys runs the same checks, fewer examples,
with a key: the document's bearer scheme and 401s must hold too (``ignored_auth`` sends
requests without it). Measured on the 2-core CI machine: 500 examples per operation, about
1,100 requests, take about 25 s. The reranker's and the text classifier's POST routes get the
same checks, 150 examples each, on one-layer random-weight directories (about 70 s for both
with their deployments, on a CI machine shared with other sessions).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import App

MAX_EXAMPLES = 250
KEYED_EXAMPLES = 60
SEED = 20261130  # fixed, so that a failure reproduces with the command the test prints
RUN_TIMEOUT_S = 300
# What `serve-app run configs/cpu.yaml` serves, less the GPU.
ARGS = {"adapter": "embeddings", "max_batch_size": 32, "batch_wait_timeout_s": 0.0}
KEY = "schemathesis-key-5f2a"
TEXT_EXAMPLES = 60
TEXT_ARGS = {"max_batch_size": 32, "max_inputs_per_request": 16, "batch_wait_timeout_s": 0.0}


@pytest.fixture(scope="module")
def apps(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    keys_file = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    keys_file.write_text(KEY + "\n")
    opts = {"num_cpus": 0.5}
    keyed_env = {"env_vars": {"SERVE_APP_API_KEYS_FILE": str(keys_file)}}
    st, stkey = cluster.deploy_many(
        App("st", "/st", ARGS, {"ray_actor_options": opts}),
        App("stkey", "/stkey", ARGS, {"ray_actor_options": {**opts, "runtime_env": keyed_env}}),
    )
    yield st, stkey
    cluster.delete("st")
    cluster.delete("stkey")


def schemathesis(
    base: str, workdir: Path, examples: int, *extra: str
) -> tuple[subprocess.CompletedProcess[str], Counter[tuple[str, int]]]:
    """Run the CLI against ``base``; its result and the responses' (operation, status) counts
    from its NDJSON event log."""
    events = workdir / "events.ndjson"
    cmd = [
        str(Path(sys.executable).parent / "schemathesis"),
        "run",
        f"{base}/openapi.json",
        "--url",
        base,
        "--checks",
        "all",
        "--mode",
        "all",
        "--max-examples",
        str(examples),
        "--seed",
        str(SEED),
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(events),
        *extra,
    ]
    # cwd: schemathesis and hypothesis keep their databases under the working directory.
    done = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    statuses: Counter[tuple[str, int]] = Counter()
    for line in events.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        label = finished["recorder"]["label"]
        for interaction in (finished["recorder"].get("interactions") or {}).values():
            response = interaction.get("response")
            statuses[(label, response["status_code"] if response else 0)] += 1
    return done, statuses


def test_the_document_holds_under_all_checks(apps, tmp_path: Path) -> None:
    base, _ = apps
    done, statuses = schemathesis(base, tmp_path, MAX_EXAMPLES)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout, done.stdout[-3000:]
    server_errors = {k: n for k, n in statuses.items() if k[1] >= 500 or k[1] == 0}
    assert server_errors == {}, server_errors
    posts = Counter({code: n for (label, code), n in statuses.items() if label.startswith("POST")})
    # Enough cases to mean something, both accepted and refused bodies.
    assert sum(posts.values()) >= MAX_EXAMPLES, posts
    assert posts[200] >= 50 and posts[400] >= 50, posts


@pytest.fixture(scope="module")
def text_apps(cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The reranker and the text classifier, each from a one-layer random-weight directory
    (tests/fixtures/text_models.py): the fuzzing is of the wire specs, not the model."""
    from tests.fixtures.text_models import classifier_dir

    root = tmp_path_factory.mktemp("text-models")
    dirs = {
        "rerank": classifier_dir(root / "rerank", layers=1),
        "text-classification": classifier_dir(root / "textclass", ["no", "yes"], layers=1),
    }
    opts = {"ray_actor_options": {"num_cpus": 0.5}}
    urls = cluster.deploy_many(
        *(
            App(f"st-{f}", f"/st-{f}", {**TEXT_ARGS, "adapter": f, "model_path": str(p)}, opts)
            for f, p in dirs.items()
        )
    )
    bases = dict(zip(dirs, urls, strict=True))
    yield bases
    for family in bases:
        cluster.delete(f"st-{family}")


@pytest.mark.parametrize("family", ["rerank", "text-classification"])
def test_the_text_families_documents_hold(text_apps, family: str, tmp_path: Path) -> None:
    """The same checks on the reranker's and the text classifier's POST routes (TEXT_EXAMPLES
    each, about 10 s apiece on the 2-core CI machine)."""
    done, statuses = schemathesis(
        text_apps[family], tmp_path, TEXT_EXAMPLES, "--include-method", "POST"
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "No issues found" in done.stdout, done.stdout[-3000:]
    server_errors = {k: n for k, n in statuses.items() if k[1] >= 500 or k[1] == 0}
    assert server_errors == {}, server_errors
    posts = Counter({code: n for (label, code), n in statuses.items() if label.startswith("POST")})
    assert posts[200] >= 20 and posts[400] >= 20, posts


def test_the_document_holds_with_api_keys(apps, tmp_path: Path) -> None:
    _, keyed = apps
    done, statuses = schemathesis(
        keyed, tmp_path, KEYED_EXAMPLES, "--header", f"Authorization: Bearer {KEY}"
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    server_errors = {k: n for k, n in statuses.items() if k[1] >= 500 or k[1] == 0}
    assert server_errors == {}, server_errors
    assert any(code == 200 for (label, code) in statuses if label.startswith("POST")), statuses
    # ignored_auth sent requests without the key: the protected routes answered 401, the
    # probes did not.
    refused = {label for (label, code) in statuses if code == 401}
    assert refused == {"POST /v1/embeddings", "GET /v1/memory", "GET /v1/models"}, statuses
