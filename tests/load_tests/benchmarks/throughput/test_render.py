"""load_tests.benchmarks.throughput.render: the markdown tables of a throughput.json."""

from __future__ import annotations

from load_tests.benchmarks.throughput import rows
from load_tests.benchmarks.throughput.render import render_markdown
from tests.load_tests.benchmarks.throughput.samples import common_row


def test_render_markdown_tables() -> None:
    table = [
        rows.new_row(
            setup="in_process",
            model="minilm",
            status="ok",
            ceiling_items_per_s=56000.0,
            ceiling_batch=256,
            items_per_s_by_batch={"64": 16600.0, "256": 56000.0},
            note="float16 on cuda, eager",
        ),
        rows.new_row(
            setup="client_ceiling",
            payload="minilm-x1-float",
            client="wrk",
            status="ok",
            requests_per_s=150000.0,
            connections=256,
            p99_ms=2.0,
        ),
        rows.new_row(
            **common_row(payload="minilm-x1-float", inputs_per_request=1, num_gpus=0.25),
            client="wrk",
            status="ok",
            requests_per_s=2700.0,
            items_per_s=2700.0,
            p50_ms=20.0,
            p99_ms=45.5,
            errors=0,
            requests=21600,
            client_ceiling_requests_per_s=150000.0,
            client_headroom=55.6,
            budget_violations=0,
        ),
        rows.new_row(
            setup="ray_serve_noop",
            replicas=4,
            client="wrk",
            status="skipped",
            note="time budget: 12 s left",
        ),
    ]
    md = render_markdown(table, {"flags": ["x: 1/s against 2/s"], "host": "h", "machine": {}})
    assert "### The model alone (in-process ceiling)" in md
    assert "| minilm | 56,000 | 256 | 64: 16,600, 256: 56,000 | float16 on cuda, eager |" in md
    assert "| minilm-x1-float | 150,000 (c256) | 2.0 ms | - | - | - | ok |" in md
    assert (
        "| 4 x 0.25 | 1 | wrk | 2,700 | 2,700 | - | 20.0 ms | 45.5 ms | 0 (0.00%) | 150,000 "
        "| 55.60x | 0 | ok |"
    ) in md
    assert "| 4 | wrk | - | - | - | - | - | - | skipped: time budget: 12 s left |" in md
    assert "- x: 1/s against 2/s" in md


def test_render_shows_the_peers_and_the_server_cpu_table() -> None:
    peer = rows.new_row(
        **common_row(setup="ray_serve_batch", payload="minilm-x1-float", inputs_per_request=1),
        client="wrk",
        status="ok",
        requests_per_s=1500.0,
        server_cpu_s_per_1000_requests=4.25,
        server_cpu_s_per_1000_requests_by_kind={"replica": 3.0, "haproxy": 0.5, "other": 0.75},
        server_cpu_vs_noop=2.5,
        server_cores_busy=6.375,
    )
    ceiling = rows.new_row(
        setup="client_ceiling",
        payload="noop",
        client="open-loop",
        status="ok",
        requests_per_s=9000.0,
        server_cpu_s_per_1000_requests=0.02,
        server_cpu_s_per_1000_requests_by_kind={"haproxy": 0.02},
    )
    reloaded = rows.new_row(
        **common_row(setup="ray_serve_noop", payload="noop", inputs_per_request=1),
        client="wrk",
        status="ok",
        requests_per_s=800.0,
        server_cpu_s_per_1000_requests=1.1,
        server_cpu_s_per_1000_requests_by_kind={"replica": 0.8, "ray-daemons": 0.3},
        server_processes_unmeasured=1,
    )
    md = render_markdown([ceiling, peer, reloaded])
    assert "| 800 | 1.100 (short: 1 process unmeasured) | - |" in md
    assert "### Plain Ray Serve with @serve.batch (peer): MiniLM-L6 embeddings" in md
    assert "### Server CPU per 1,000 requests (every server process, from /proc)" in md
    assert (
        "| ray_serve_batch | minilm-x1-float | 4 | wrk | 1,500 | 4.250 | 2.50x | 6.38 "
        "| 3.000 | 0.500 | - | - | - | 0.750 |"
    ) in md
    assert "| client_ceiling | noop | - | open-loop | 9,000 | 0.020 | - | - | - | 0.020 |" in md


def test_render_gives_the_mixed_workload_its_own_table_and_the_tokens_table() -> None:
    common = {"setup": "serve_app", "model": "minilm", "inputs_per_request": 16, "replicas": 4}
    table = [
        rows.new_row(**common, payload="minilm-x16-float", client="wrk", status="ok"),
        rows.new_row(
            **common,
            payload="minilm-x16-mixed-float",
            workload="mixed",
            client="wrk",
            status="ok",
            tokens_per_request=800.0,
            texts_per_s=1600.0,
            tokens_per_s=80000.0,
            vs_ceiling_tokens=0.5,
        ),
    ]
    text = render_markdown(table)
    assert "### serve_app: MiniLM-L6 embeddings, fp16 (dummy weights), short texts" in text
    assert "### serve_app: MiniLM-L6 embeddings, fp16 (dummy weights), mixed queries" in text
    assert "### Texts and tokens per second" in text
    assert "| serve_app | mixed | 4 (no GPU) | 16 | wrk | 800.0 | 1,600 | 80,000 | 0.50x |" in text
