"""Where a replica's CPU goes per batch and per request, measured in-process (no Ray, no HTTP).

On a GPU, for ResNet-50 and MiniLM (fp16, random weights) at small batch sizes:

- ``eager``: one forward pass as the replica runs it, timed to the synchronised end; and the CPU
  time of the call alone (``launch_cpu_ms``), which is the GIL the replica holds to launch it;
- ``graph``: the same pass captured once as a CUDA graph and replayed (input copied into a static
  buffer first); ``max_abs_diff`` compares its output with the eager one.

On any device, the CPU cost of serve_app's own per-request steps with the benchmark's payloads:
``adapter.decode`` of one request (JSON, base64, JPEG decode and crop; or tokenizing) and
``adapter.predict`` of a batch (model included).

    python -m research.launch_probe [--out DIR]

Writes ``launch_probe.json``. About a minute on an H200.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from load_tests import payloads
from serve_app.config.args import parse_args

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def _timed(fn: Callable[[], Any], device: torch.device, iters: int) -> dict[str, float]:
    """Wall ms per synchronised call and CPU ms of the call itself (before the sync)."""
    for _ in range(5):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall, cpu = [], []
    for _ in range(iters):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        c1 = time.thread_time()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((c1 - c0) * 1e3)
    return {
        "wall_ms_p50": round(statistics.median(wall), 3),
        "launch_cpu_ms_p50": round(statistics.median(cpu), 3),
    }


def _graph(
    forward: Callable[..., torch.Tensor], inputs: list[torch.Tensor], device: torch.device
) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """Capture ``forward(*static)`` as a CUDA graph; returns replay() and the static inputs."""
    static = [t.clone() for t in inputs]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), torch.inference_mode():
        for _ in range(3):
            forward(*static)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        out = forward(*static)

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay, static


def probe_forward(
    name: str,
    forward: Callable[..., torch.Tensor],
    make_inputs: Callable[[int], list[torch.Tensor]],
    device: torch.device,
    iters: int,
) -> list[dict[str, Any]]:
    rows = []
    capture_error = None
    for b in BATCHES:
        inputs = make_inputs(b)
        row: dict[str, Any] = {"model": name, "batch": b}

        def eager(inputs: list[torch.Tensor] = inputs) -> torch.Tensor:
            with torch.inference_mode():
                return forward(*inputs)

        row["eager"] = _timed(eager, device, iters)
        if capture_error is not None:  # a failed capture can leave the stream unusable
            row["graph"] = {"error": f"not tried: {capture_error}"}
            rows.append(row)
            continue
        try:
            replay, static = _graph(forward, inputs, device)

            def graphed(
                inputs: list[torch.Tensor] = inputs,
                static: list[torch.Tensor] = static,
                replay: Callable[[], torch.Tensor] = replay,
            ) -> torch.Tensor:
                for dst, src in zip(static, inputs, strict=True):
                    dst.copy_(src, non_blocking=True)
                return replay()

            row["graph"] = _timed(graphed, device, iters)
            ref, got = eager().float(), graphed().float()
            row["max_abs_diff"] = float((ref - got).abs().max())
        except Exception as exc:  # noqa: BLE001 - record why capture failed, keep probing
            capture_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            row["graph"] = {"error": capture_error}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def resnet_rows(device: torch.device, iters: int) -> list[dict[str, Any]]:
    from research.cache_policy_cost import resnet50

    model, _ = resnet50(device)

    def make(b: int) -> list[torch.Tensor]:
        x = torch.randn(b, 3, 224, 224, device=device, dtype=torch.float16)
        return [x.contiguous(memory_format=torch.channels_last)]

    return probe_forward("resnet50", model, make, device, iters)


def minilm_rows(device: torch.device, iters: int, tokens: int = 16) -> list[dict[str, Any]]:
    from serve_app.adapters.embeddings.backend import SentenceEncoder as EmbeddingAdapter

    args = parse_args({"adapter": "embeddings", "load_format": "dummy", "dtype": "float16"})
    adapter = EmbeddingAdapter(args)
    adapter.setup(device)
    model = adapter.model
    assert model is not None

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).last_hidden_state

    def make(b: int) -> list[torch.Tensor]:
        ids = torch.randint(1000, 2000, (b, tokens), device=device)
        mask = torch.ones((b, tokens), dtype=torch.long, device=device)
        mask[:, tokens - 3 :] = 0
        return [ids, mask]

    return probe_forward(f"minilm_{tokens}_tokens", forward, make, device, iters)


def request_costs(device: torch.device, iters: int) -> list[dict[str, Any]]:
    """CPU ms of adapter.decode per request and adapter.predict per batch."""
    from serve_app.adapters import build_model

    rows: list[dict[str, Any]] = []
    specs = [
        ("image", {"adapter": "image-classification", "model_name": "resnet50"}, "/v1/classify"),
        ("embeddings", {"adapter": "embeddings", "model_name": "minilm"}, "/v1/embeddings"),
    ]
    for kind, extra, _ in specs:
        args = parse_args(
            {**extra, "load_format": "dummy", "dtype": "float16", "device": device.type}
        )
        adapter = build_model(args)
        adapter.backend.setup(device)
        for per_request in (1, 16):
            if kind == "image":
                body = payloads.classify_body(
                    [payloads.image_b64(seed=i) for i in range(per_request)], model="resnet50"
                )
            else:
                body = payloads.embeddings_body(payloads.texts("short", per_request))
            cpu = []
            for _ in range(iters):
                c0 = time.thread_time()
                decoded = adapter.decode(body, "application/json", {})
                cpu.append((time.thread_time() - c0) * 1e3)
            rows.append(
                {
                    "kind": kind,
                    "step": "decode",
                    "inputs_per_request": per_request,
                    "cpu_ms_p50": round(statistics.median(cpu), 3),
                    "wall_note": "thread CPU time; Pillow's decode threads not counted"
                    if kind == "image" and per_request > 1
                    else "",
                }
            )
        items = decoded.items
        for b in (1, 4, 8, 16):
            batch = (items * b)[:b]
            step = functools.partial(adapter.backend.predict, batch)
            timing = _timed(step, device, iters)
            rows.append({"kind": kind, "step": "predict", "batch": b, **timing})
        print(json.dumps(rows[-6:]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m research.launch_probe", description=__doc__)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--iters", type=int, default=50)
    ns = p.parse_args(argv)
    out = ns.out or Path(os.environ.get("SERVE_APP_RESULTS_DIR", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    doc: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "forward": [],
    }
    if device.type == "cuda":
        doc["forward"] += resnet_rows(device, ns.iters)
        doc["forward"] += minilm_rows(device, ns.iters)
    doc["request_costs"] = request_costs(device, ns.iters)
    path = out / "launch_probe.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
