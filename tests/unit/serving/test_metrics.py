"""serving/metrics: the names it declares, the batch's tokens, the error counters' routing, and
the dashboard in deploy/grafana, whose every query must name only metrics the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from serve_app.errors import BadRequest, Overloaded, RequestTimeout
from serve_app.serving import metrics

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "serve_app.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# PromQL words that are not metric names (functions are recognised by the "(" after them).
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip
IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers left once strings, label
    matchers, ranges, groupings and Grafana's variables are taken out, and not calls."""
    expr = re.sub(r'"[^"]*"', "", expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)
    names = set()
    for match in IDENT.finditer(expr):
        word = match.group()
        rest = expr[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        if match.start() > 0 and (
            expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."
        ):
            continue  # the exponent or unit of a number
        names.add(word)
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in doc["panels"] for t in p["targets"]]


def test_metric_names_of_a_promql_expression() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, application) (rate(ray_a_bucket{application=~"$x", '
        'reason="y"}[$__rate_interval]))) / on (application) ray_b + 1e3 * max without (x) (ray_c)'
    )
    assert metric_names(expr) == {"ray_a_bucket", "ray_b", "ray_c"}


def test_every_dashboard_query_names_only_exported_metrics() -> None:
    exported = metrics.exported_names()
    scraped = set(exported)
    for name, kind in exported.items():
        if kind == "histogram":
            scraped |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    queries = dashboard_queries()
    assert len(queries) >= 20
    used = set()
    for title, expr in queries:
        names = metric_names(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= scraped, f"{title}: {sorted(names - scraped)} not exported ({expr!r})"
        used |= names
    # The dashboard shows every stage, and the memory, controller and escape figures.
    for stage in ("decode", "queue", "inference", "encode", "request"):
        assert f"ray_serve_app_{stage}_seconds_bucket" in used
    for name in (
        "ray_serve_app_budget_bytes",
        "ray_serve_app_nvml_process_bytes",
        "ray_serve_app_batch_size_bucket",
        "ray_serve_app_rejections_total",
        "ray_serve_app_timeouts_total",
        "ray_serve_app_autoscale_decisions_total",
        "ray_serve_app_budget_escape_bytes",
    ):
        assert name in used, name


def test_the_dashboard_is_a_grafana_model_with_a_prometheus_datasource() -> None:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    assert doc["uid"] and doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    assert all(p["datasource"]["type"] == "prometheus" for p in doc["panels"])


def test_the_scrape_config_names_the_pinned_metrics_port() -> None:
    from serve_app.ops.launch import DEFAULT_METRICS_PORT

    assert f"127.0.0.1:{DEFAULT_METRICS_PORT}" in PROMETHEUS.read_text()


def test_names_carry_ray_prefix_and_units() -> None:
    names = metrics.exported_names()
    assert all(n.startswith("ray_") for n in names)
    for name, kind in names.items():
        if kind == "counter":
            assert name.endswith("_total"), name
    for key, (_, bounds) in metrics.HISTOGRAMS.items():
        assert bounds == sorted(bounds) and bounds[0] > 0, key
        if key.endswith("_seconds"):  # 1 ms to 10 s inside the buckets
            assert bounds[0] <= 0.001 and bounds[-1] >= 10.0


def test_a_local_histogram_counts_as_prometheus_buckets() -> None:
    hist = metrics.LocalHistogram([0.001, 0.01, 1048576.0])
    for value in (0.0005, 0.001, 0.002, 5.0, 2e6):
        hist.observe(value)
    # le: at or below the bound (0.001 falls in le="0.001"), cumulative, +Inf counts all
    assert hist.cumulative() == [2, 3, 4, 5]
    assert [d["le"] for d in hist.labels] == ["0.001", "0.01", "1048576", "+Inf"]
    assert hist.sum == pytest.approx(0.0005 + 0.001 + 0.002 + 5.0 + 2e6)


def test_batch_tokens_count_token_id_lists_only() -> None:
    assert metrics.batch_tokens([[101, 7, 102], [101, 102]]) == 5
    assert metrics.batch_tokens([b"jpeg bytes"]) is None
    assert metrics.batch_tokens([]) is None


@pytest.mark.parametrize(
    ("err", "counter", "reason"),
    [
        (Overloaded("full", code="queue_full"), "rejections", "queue_full"),
        (
            Overloaded("late", code="queue_deadline_exceeded"),
            "rejections",
            "queue_deadline_exceeded",
        ),
        (RequestTimeout("slow"), "timeouts", "timeout"),
    ],
)
def test_503_and_504_are_counted_by_reason(
    monkeypatch: pytest.MonkeyPatch, err: Any, counter: str, reason: str
) -> None:
    seen: list[tuple[str, dict[str, str]]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
            seen.append((self.name, dict(tags or {})))

    errors = object.__new__(metrics._ErrorCounters)
    errors.counters = {n: Recorder(n) for n in metrics.ERROR_COUNTERS}  # type: ignore[misc]
    monkeypatch.setattr(metrics, "_errors", errors)
    metrics.count_error(err)
    metrics.count_error(BadRequest("not counted"))
    assert seen == [(counter, {"reason": reason})]
