"""load_tests.bench.stats: percentiles, a rate's summary and the loopback check."""

from __future__ import annotations

import pytest

from load_tests import bench
from load_tests.bench import Record


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
