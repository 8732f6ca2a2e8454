"""examples/custom_model served as the README says, `serve-app run` from the repository root: a
subprocess on a real local Ray (CPU), requests through HTTP checked against the model's own
output computed here, the generic route's errors and OpenAPI entry, schemathesis against that
document (every check, fewer examples than test_schemathesis.py's), then SIGINT and exit 0."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import torch
import yaml

from examples.custom_model.model import MAX_CHARS, ByteScorer
from tests.helpers import start_serve_app_run, wait_http
from tests.integration.test_schemathesis import schemathesis

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "custom_model" / "config.yaml"
TEXTS = ["hello", "a longer text, with punctuation and digits 123", "", "\u00e9t\u00e9"]
FUZZ_EXAMPLES = 60


def expected(texts: list[str]) -> list[float]:
    """The example's scores computed in this process, as its class computes them."""
    args = yaml.safe_load(CONFIG.read_text())["applications"][0]["args"]
    model = ByteScorer(**args.get("adapter_options", {}))
    model.setup(torch.device("cpu"))
    with torch.inference_mode():
        return model.predict([model.decode_request(t) for t in texts])


def test_serve_app_run_serves_the_example_user_model(tmp_path: Path) -> None:
    doc = yaml.safe_load(CONFIG.read_text())
    t0 = time.monotonic()
    # Without PYTHONPATH: the example imports because the run starts at the root.
    run = start_serve_app_run(doc, tmp_path, drop_env=("PYTHONPATH",))
    proc, url = run.proc, run.url
    try:
        wait_http(f"{url}/readyz", 240.0)
        ready_s = time.monotonic() - t0
        with httpx.Client(base_url=url, timeout=30.0) as client:
            resp = client.post("/v1/predict", json={"inputs": TEXTS})
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert body["model"] == "ByteScorer" and body["object"] == "list"
            got = body["outputs"]
            assert len(got) == len(TEXTS)
            want = expected(TEXTS)
            assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= 1e-6, (got, want)
            # One input at a time gives the same score as in a batch (rows are independent).
            one = client.post("/v1/predict", json={"inputs": [TEXTS[1]], "model": "ByteScorer"})
            assert abs(one.json()["outputs"][0] - want[1]) <= 1e-6
            # The user's decode_request rejects an input: 400 naming it.
            bad = client.post("/v1/predict", json={"inputs": ["ok", "x" * (MAX_CHARS + 1)]})
            assert bad.status_code == 400
            assert bad.json()["error"]["param"] == "inputs[1]", bad.text
            assert "at most 2000 characters" in bad.json()["error"]["message"]
            empty = client.post("/v1/predict", json={"inputs": []})
            assert empty.status_code == 400 and empty.json()["error"]["param"] == "inputs"
            other = client.post("/v1/predict", json={"inputs": ["a"], "model": "gpt"})
            assert other.status_code == 404 and "ByteScorer" in other.json()["error"]["message"]
            # Other families' routes answer the JSON 404 of a route not served here.
            emb = client.post("/v1/embeddings", json={"input": "a"})
            assert emb.status_code == 404 and emb.json()["error"]["code"] == "route_not_served"
            spec = client.get("/openapi.json").json()
            request = spec["components"]["schemas"]["PredictRequest"]
            assert "/v1/predict" in spec["paths"] and request["properties"]["inputs"]["maxItems"]
            card = client.get("/v1/models").json()["data"][0]
            assert card["adapter"] == "examples.custom_model.model:ByteScorer"
            (report,) = client.get("/v1/memory").json()["replicas"]
            assert report["app"] == "ByteScorer" and report["batches"] >= 2, report
            assert report["model"]["user_model"] == card["adapter"]
        fuzz = tmp_path / "schemathesis"
        fuzz.mkdir()
        done, statuses = schemathesis(url, fuzz, FUZZ_EXAMPLES)
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        assert {k: n for k, n in statuses.items() if k[1] >= 500 or k[1] == 0} == {}
        posts = {code: n for (label, code), n in statuses.items() if label == "POST /v1/predict"}
        assert posts.get(200, 0) >= 20 and posts.get(400, 0) >= 20, posts
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        output = run.stop()
    assert "serving at" in output, output[-3000:]
    print(f"serve-app run of the example: ready in {ready_s:.1f} s")
