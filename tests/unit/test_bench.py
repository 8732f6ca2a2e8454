"""Unit tests for load_tests.bench and load_tests.payloads (no Ray, no GPU)."""

from __future__ import annotations

import asyncio
import io
import json
import math
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # for plain `pytest` runs

from load_tests import bench, payloads  # noqa: E402
from load_tests.bench import Record  # noqa: E402

# ------------------------------------------------------------------ schedule


@pytest.mark.parametrize("rate_per_s,duration_s", [(50.0, 20.0), (200.0, 10.0), (5.0, 60.0)])
def test_poisson_schedule_count_order_and_gaps(rate_per_s: float, duration_s: float) -> None:
    times = bench.poisson_schedule(rate_per_s, duration_s, seed=1)
    expected = rate_per_s * duration_s
    # Count is Poisson(expected): allow 4 standard deviations (fixed seed, so deterministic).
    assert abs(len(times) - expected) <= 4 * math.sqrt(expected)
    assert all(0.0 <= t < duration_s for t in times)
    assert all(b > a for a, b in zip(times, times[1:], strict=False))
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean_gap = sum(gaps) / len(gaps)
    # Mean of n exponentials has relative sd 1/sqrt(n); 4 sd tolerance.
    assert abs(mean_gap * rate_per_s - 1.0) <= 4 / math.sqrt(len(gaps))


def test_poisson_schedule_is_seeded() -> None:
    assert bench.poisson_schedule(30.0, 5.0, seed=7) == bench.poisson_schedule(30.0, 5.0, seed=7)
    assert bench.poisson_schedule(30.0, 5.0, seed=7) != bench.poisson_schedule(30.0, 5.0, seed=8)


def test_poisson_schedule_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rate"):
        bench.poisson_schedule(0.0, 5.0)
    with pytest.raises(ValueError, match="duration"):
        bench.poisson_schedule(1.0, -1.0)
    assert bench.poisson_schedule(10.0, 0.0) == []


# ------------------------------------------------------------------ percentiles and summary


def test_percentile_exact_values() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert bench.percentile(values, 0) == 1.0
    assert bench.percentile(values, 50) == 2.5
    assert bench.percentile(values, 100) == 4.0
    assert bench.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # order does not matter
    hundred = [float(i) for i in range(1, 101)]
    assert bench.percentile(hundred, 99) == pytest.approx(99.01, abs=1e-12)
    assert bench.percentile(hundred, 90) == pytest.approx(90.1, abs=1e-12)
    assert bench.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        bench.percentile([], 50)
    with pytest.raises(ValueError):
        bench.percentile([1.0], 101)


def test_summarise_counts_errors_and_throughput() -> None:
    records = [
        Record(0.5, 0.2, 200, None, warmup=True),  # warm-up: counted apart, not measured
        Record(1.0, 0.1, 200, None),
        Record(2.0, 0.3, 200, None),
        Record(3.0, 0.2, 200, None),
        Record(4.0, 0.4, 200, None),
        Record(5.0, 0.05, 507, "http_507:out_of_memory"),
        Record(6.0, 30.0, 0, "timeout"),
        Record(7.0, None, 0, "dropped_client"),
        Record(8.0, 0.5, 200, None),
    ]
    s = bench.summarise(records, offered_rate_per_s=1.0, duration_s=10.0, warmup_s=1.0)
    assert s.requests == 8
    assert s.warmup_requests == 1
    assert s.ok == 5
    assert s.errors == 3
    assert s.error_rate == pytest.approx(3 / 8)
    assert s.scheduled_rate_per_s == pytest.approx(0.8)
    # Window is [1, 11) s; the warm-up success completes at 0.7 s, outside it: 5 ok / 10 s.
    assert s.completed_in_window == 5
    assert s.throughput_per_s == pytest.approx(0.5)
    assert s.status_counts == {"0": 2, "200": 5, "507": 1}
    assert s.error_counts == {"http_507:out_of_memory": 1, "timeout": 1, "dropped_client": 1}
    assert s.latency_s is not None
    assert s.latency_s["p50"] == pytest.approx(0.3)
    assert s.latency_s["max"] == pytest.approx(0.5)
    assert s.latency_all_s is not None and s.latency_all_s["max"] == pytest.approx(30.0)


def test_summarise_throughput_counts_completions_inside_the_window() -> None:
    records = [
        Record(0.5, 1.0, 200, None, warmup=True),  # completes at 1.5 s: inside [1, 3)
        Record(1.2, 0.5, 200, None),  # 1.7 s: inside
        Record(1.5, 4.5, 200, None),  # 6.0 s: after the window, not counted
        Record(2.0, 0.1, 503, "http_503"),  # errors never count as throughput
    ]
    s = bench.summarise(records, offered_rate_per_s=2.0, duration_s=2.0, warmup_s=1.0)
    assert s.completed_in_window == 2
    assert s.throughput_per_s == pytest.approx(1.0)
    assert (s.requests, s.ok, s.errors) == (3, 2, 1)


def test_summarise_empty() -> None:
    s = bench.summarise([], offered_rate_per_s=5.0, duration_s=2.0)
    assert (s.requests, s.ok, s.error_rate, s.throughput_per_s) == (0, 0, 0.0, 0.0)
    assert s.latency_s is None


# ------------------------------------------------------------------ loopback check


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1/embeddings",
        "http://127.4.5.6/",
        "http://localhost:8000/readyz",
        "http://LOCALHOST/",
        "http://[::1]:8000/v1/memory",
        "http://[::ffff:127.0.0.1]:80/",
    ],
)
def test_loopback_urls_accepted(url: str) -> None:
    assert bench.is_loopback_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000/v1/embeddings",
        "http://example.com/",
        "http://localhost.example.com/",
        "http://192.168.1.1/",
        "http://0.0.0.0:8000/",
        "not a url",
    ],
)
def test_remote_urls_rejected(url: str) -> None:
    assert not bench.is_loopback_url(url)


def test_cli_refuses_remote_target_without_allow_remote() -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--url", "http://10.0.0.1:8000/v1/embeddings", "--rate", "1"])
    assert exc.value.code == 2


def test_cli_refuses_sweep_over_max_requests() -> None:
    args = ["--url", "http://127.0.0.1:9/v1/embeddings", "--rates", "100,200"]
    with pytest.raises(SystemExit) as exc:
        bench.main([*args, "--duration-s", "10", "--max-requests", "1000"])
    assert exc.value.code == 2


# ------------------------------------------------------------------ payloads


def test_texts_deterministic_and_sized() -> None:
    assert payloads.texts("mixed", 20, seed=3) == payloads.texts("mixed", 20, seed=3)
    assert payloads.texts("short", 5, seed=3) != payloads.texts("short", 5, seed=4)
    for text in payloads.texts("short", 50, seed=1):
        assert 3 <= len(text.split()) <= 8
    for text in payloads.texts("long", 20, seed=1):
        assert 150 <= len(text.split()) <= 200
        assert text.count("\n\n") >= 2  # several paragraphs
    with pytest.raises(ValueError, match="text kind"):
        payloads.texts("medium", 1)


@pytest.mark.parametrize("fmt", ["jpeg", "png"])
@pytest.mark.parametrize("size", [224, 512])
def test_images_decode_at_requested_size(fmt: str, size: int) -> None:
    data = payloads.image_bytes(size, fmt, seed=2)
    assert data == payloads.image_bytes(size, fmt, seed=2)
    img = Image.open(io.BytesIO(data))
    assert img.format == fmt.upper()
    assert img.size == (size, size)
    assert img.mode == "RGB"
    img.load()


def test_images_deterministic_across_cache() -> None:
    a = payloads.image_bytes(64, "png", seed=5)
    payloads.image_bytes.cache_clear()
    payloads.image_b64.cache_clear()
    assert payloads.image_bytes(64, "png", seed=5) == a


def test_default_model_names_are_what_serve_app_serves() -> None:
    """The clients' defaults must be names the README's server answers to (else every request
    is a 404): configs/default.yaml's model, AppArgs' default, and an image app's default."""
    import yaml

    from serve_app.config.args import parse_args

    default_yaml = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    served = default_yaml["applications"][0]["args"]["model_name"]
    assert payloads.DEFAULT_EMBEDDINGS_MODEL == served == "all-MiniLM-L6-v2"
    assert parse_args({}).model_name == payloads.DEFAULT_EMBEDDINGS_MODEL
    image_default = parse_args({"adapter": "image-classification"}).model_name
    assert payloads.DEFAULT_IMAGE_MODEL == image_default == "resnet50"
    assert bench.DEFAULT_MODELS == {"embeddings": "all-MiniLM-L6-v2", "image": "resnet50"}
    assert json.loads(payloads.embeddings_body("x"))["model"] == "all-MiniLM-L6-v2"
    assert json.loads(payloads.classify_body("eA=="))["model"] == "resnet50"


def test_embeddings_body_encoding_format() -> None:
    assert "encoding_format" not in json.loads(payloads.embeddings_body(["a", "b"]))
    body = json.loads(payloads.embeddings_body(["a", "b"], encoding_format="base64"))
    assert body == {"model": "all-MiniLM-L6-v2", "input": ["a", "b"], "encoding_format": "base64"}


def test_build_requests_bodies() -> None:
    reqs = bench.build_requests("http://127.0.0.1:1/v1/embeddings", "embeddings", batch=3)
    body = json.loads(reqs[0].content)
    assert body["model"] == "all-MiniLM-L6-v2" and len(body["input"]) == 3
    raw = bench.build_requests("http://127.0.0.1:1/v1/classify", "image", binary=True, top_k=3)
    assert raw[0].url.endswith("?top_k=3") and raw[0].headers["Content-Type"] == "image/jpeg"
    js = bench.build_requests("http://127.0.0.1:1/v1/classify", "image", image_format="png")
    assert json.loads(js[0].content)["model"] == "resnet50"
    with pytest.raises(ValueError, match="--binary"):
        bench.build_requests("http://127.0.0.1:1/v1/classify", "image", binary=True, batch=2)


# ------------------------------------------------------------------ live runs


async def _embeddings(request: Request) -> JSONResponse:
    body = await request.json()
    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
    if any("fail" in text for text in inputs):
        return JSONResponse({"error": {"message": "too big", "type": "out_of_memory"}}, 507)
    data = [{"object": "embedding", "index": i, "embedding": [0.0] * 4} for i in range(len(inputs))]
    return JSONResponse({"object": "list", "data": data, "model": body["model"]})


async def _memory(request: Request) -> JSONResponse:
    replica = {
        "replica_id": "r0",
        "pid": 1,
        "gpu_uuid": None,
        "budget_bytes": 1 << 30,
        "nvml_process_bytes": None,
        "peak_reserved_bytes": 0,
    }
    return JSONResponse({"replicas": [replica]})


APP = Starlette(
    routes=[
        Route("/v1/embeddings", _embeddings, methods=["POST"]),
        Route("/v1/memory", _memory),
    ]
)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(APP, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5.0
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start within 5 s"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5.0)
    sock.close()


def test_run_rate_against_live_server(server_url: str) -> None:
    url = f"{server_url}/v1/embeddings"
    reqs = bench.build_requests(url, "embeddings", texts="mixed")
    res = asyncio.run(bench.run_rate(reqs, rate_per_s=20.0, duration_s=2.0, warmup_s=0.2, seed=3))
    expected = bench.poisson_schedule(20.0, 2.2, seed=3)
    assert res.scheduled == len(expected) == len(res.records)
    assert not res.truncated
    s = res.summary
    assert s.requests + s.warmup_requests == len(expected)
    assert s.errors == 0 and s.ok == s.requests > 0
    assert all(r.latency_s is not None and r.latency_s > 0 for r in res.records)
    assert all(r.status == 200 for r in res.records)
    # Each record keeps its scheduled time.
    assert [r.scheduled_s for r in res.records] == pytest.approx(expected)


def test_run_rate_counts_http_errors_and_client_drops() -> None:
    async def slow(request: Request) -> JSONResponse:
        await asyncio.sleep(0.3)
        return await _embeddings(request)

    app = Starlette(routes=[Route("/v1/embeddings", slow, methods=["POST"])])
    url = "http://testserver/v1/embeddings"
    reqs = [
        bench.PreparedRequest(
            "POST", url, {"Content-Type": "application/json"}, payloads.embeddings_body(text)
        )
        for text in ("ok", "fail")
    ]

    async def go() -> bench.RateResult:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            return await bench.run_rate(reqs, 40.0, 1.0, seed=1, max_in_flight=4, client=client)

    res = asyncio.run(go())
    s = res.summary
    assert s.requests == res.scheduled
    counts = s.error_counts
    assert counts.get("dropped_client", 0) > 0  # 40/s x 0.3 s = ~12 wanted in flight, cap 4
    assert counts.get("http_507:out_of_memory", 0) > 0
    assert s.ok + sum(counts.values()) == s.requests
    assert s.latency_s is not None and s.latency_s["p50"] >= 0.3


class _StallingClient:
    """Answers 200 at once, but blocks the event loop for 0.5 s on its first request."""

    def __init__(self) -> None:
        self.calls = 0

    async def request(self, method: str, url: str, **kwargs: object) -> httpx.Response:
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.5)  # a stalled client: nothing else can be sent meanwhile
        return httpx.Response(200, json={})


def test_run_rate_measures_from_scheduled_time_when_the_client_stalls() -> None:
    reqs = [bench.PreparedRequest("POST", "http://127.0.0.1:1/x", {}, b"{}")]
    res = asyncio.run(bench.run_rate(reqs, 50.0, 1.0, seed=4, client=_StallingClient()))
    first = res.records[0]
    stall_end_s = first.scheduled_s + 0.5
    stalled = [r for r in res.records[1:] if r.scheduled_s < stall_end_s]
    assert len(stalled) >= 5  # 50/s over 0.5 s: ~25 expected
    for r in stalled:
        # Latency counts the time spent waiting for the stall, not just the (instant) request.
        assert r.latency_s is not None and r.scheduled_s + r.latency_s >= stall_end_s - 0.02
        assert r.send_lag_s is not None and r.send_lag_s > 0.0
    assert res.summary.latency_s is not None and res.summary.latency_s["max"] >= 0.45


def test_sharded_client_splits_connections() -> None:
    async def sizes(total: int) -> tuple[int, ...]:
        async with bench.ShardedClient(total, 5.0, connections_per_shard=16) as client:
            return client.shard_sizes

    assert asyncio.run(sizes(40)) == (14, 13, 13)
    assert asyncio.run(sizes(256)) == (16,) * 16
    assert asyncio.run(sizes(3)) == (3,)


def test_cli_end_to_end_writes_json_and_plots(server_url: str, tmp_path: Path) -> None:
    args = [
        "--url",
        f"{server_url}/v1/embeddings",
        "--rates",
        "20,40",
        "--duration-s",
        "0.5",
        "--warmup-s",
        "0",
        "--pause-s",
        "0",
        "--out",
        str(tmp_path),
        "--raw",
        "--no-progress",
        "--no-nvml",
        "--max-error-rate",
        "0",
        "--memory-interval-s",
        "0.2",
    ]
    assert bench.main(args) == 0
    doc = json.loads((tmp_path / "bench.json").read_text())
    assert doc["schema_version"] == 1
    assert [r["offered_rate_per_s"] for r in doc["rates"]] == [20.0, 40.0]
    assert all(r["error_rate"] == 0.0 and len(r["raw"]) == r["requests"] for r in doc["rates"])
    assert doc["verdict"]["passed"] is True
    server = [m for m in doc["memory"]["samples"] if m["source"] == "server"]
    assert server and server[0]["budget_bytes"] == 1 << 30
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert (tmp_path / "memory.png").stat().st_size > 0


def test_judge_budgets_counts_each_sample_over_its_own_pids_budget() -> None:
    from load_tests.bench.memory import judge_budgets

    samples = [
        {"source": "nvml", "pid": 1, "used_bytes": 90},
        {"source": "nvml", "pid": 1, "used_bytes": 120},  # over 100
        {"source": "nvml", "pid": 2, "used_bytes": 150},
        {"source": "nvml", "pid": 3, "used_bytes": 10**9},  # the hog: no budget, not judged
        {"source": "http", "pid": 2, "used_bytes": 10**9},  # not an NVML sample
    ]
    got = judge_budgets(samples, {1: 100, 2: 200})
    assert got == {
        "budget_violations": 1,
        "nvml_samples_judged": 3,
        "replica_pids_judged": 2,
        "max_used_over_budget": 1.2,
        "bytes_over_budget_by_pid": {1: 20},
    }
    assert judge_budgets([], {1: 100})["max_used_over_budget"] is None
