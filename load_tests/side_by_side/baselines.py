"""The in-process ceiling of each model, the client's own ceiling against a bare no-op server,
and the in-process no-op call."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from load_tests.side_by_side.analysis import _p, best_sustained
from load_tests.side_by_side.client import LoadClient, describe_point, sweep
from load_tests.side_by_side.cluster import _wait_answer
from load_tests.side_by_side.constants import MODELS, ROOT
from load_tests.side_by_side.deployments import (
    build_resnet50,
    create_noop_app,
    minilm_dir,
    noop_request,
    preprocess_image,
)
from load_tests.side_by_side.util import _error, log
from serve_app.ops.launch import free_port


def _time_it(fn: Callable[[], Any], sync: Callable[[], None], min_s: float) -> float:
    """Seconds per call of fn (after two warm-up calls), timed over at least min_s; calls are
    queued in growing groups between synchronisations, as a serving loop would issue them."""
    for _ in range(2):
        fn()
    sync()
    n, group = 0, 1
    t0 = time.perf_counter()
    while True:
        for _ in range(group):
            fn()
        n += group
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_s and n >= 3:
            return elapsed / n
        group = min(group * 2, 32)


def ceiling_worker(spec: Mapping[str, Any]) -> dict[str, Any]:
    """In one process, the model alone: items/s per batch size, plus one CPU thread's
    decode/tokenize rate for the same payloads."""
    import torch

    from load_tests import payloads

    cuda = spec["device"] == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.float16 if cuda else torch.float32
    torch.backends.cudnn.benchmark = True

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    out: dict[str, Any] = {}
    for name in spec["models"]:
        doc: dict[str, Any] = {
            "device": str(device),
            "dtype": str(dtype).replace("torch.", ""),
            "items_per_s": {},
        }
        out[name] = doc
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if MODELS[name]["kind"] == "image":
                model = build_resnet50().to(device, dtype).eval()
                if cuda:
                    model = model.to(memory_format=torch.channels_last)
                doc["layout"] = "channels_last" if cuda else "contiguous"
                for b in spec["batches"]:
                    x = torch.randn(b, 3, 224, 224, device=device, dtype=dtype)
                    if cuda:
                        x = x.to(memory_format=torch.channels_last)

                    def fwd(x: Any = x, model: Any = model) -> None:
                        with torch.inference_mode():
                            model(x)

                    per = _time_it(fwd, sync, spec["min_s"])
                    doc["items_per_s"][str(b)] = b / per
                blobs = [payloads.image_bytes(224, "jpeg", s) for s in range(4)]
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    preprocess_image(blobs[n % 4])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            else:
                from transformers import AutoConfig, AutoModel, AutoTokenizer

                tok = AutoTokenizer.from_pretrained(minilm_dir())
                model = AutoModel.from_config(AutoConfig.from_pretrained(minilm_dir()))
                model = model.to(device, dtype).eval()
                texts = payloads.texts("short", max(spec["batches"]), 0)
                for b in spec["batches"]:
                    enc = tok(texts[:b], padding=True, return_tensors="pt").to(device)

                    def fwd(enc: Any = enc, model: Any = model) -> None:
                        with torch.inference_mode():
                            h = model(**enc).last_hidden_state
                            m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                            pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                            torch.nn.functional.normalize(pooled.float(), p=2, dim=1)

                    per = _time_it(fwd, sync, spec["min_s"])
                    doc["items_per_s"][str(b)] = b / per
                    doc["tokens_per_text_padded"] = int(enc["input_ids"].shape[1])
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < spec["cpu_min_s"]:
                    tok(texts[n % len(texts)])
                    n += 1
                doc["cpu_preprocess_items_per_s_one_thread"] = n / (time.perf_counter() - t0)
            doc["items_per_s_max"] = max(doc["items_per_s"].values())
            if cuda:
                doc["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved())
            model = None  # free it before the next model
            doc["status"] = "ok"
        except Exception as exc:  # noqa: BLE001 - one model's failure must not hide the other
            doc.update(status="error", **_error(exc))
        log(
            f"ceiling {name}: "
            + ", ".join(f"batch {b}: {v:,.0f}/s" for b, v in doc["items_per_s"].items())
            + (f"  ({doc.get('error')})" if doc.get("status") == "error" else "")
        )
    return out


def client_ceiling(
    cfg: Mapping[str, Any], spec: Mapping[str, Any], models: Sequence[str], deadline: float
) -> dict[str, Any]:
    """The client against a bare uvicorn + Starlette no-op server: its highest throughput per
    payload kind, and the p50 of a tiny POST at the no-op rate (the HTTP baseline)."""
    from load_tests import bench

    doc: dict[str, Any] = {
        "client_procs": spec["client_procs"],
        "max_connections_per_proc": spec["max_connections"],
        "server_workers": cfg["noop_server_workers"],
    }
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "load_tests.side_by_side",
            "--_worker",
            "noop-server",
            "--_port",
            str(port),
            "--_workers",
            str(cfg["noop_server_workers"]),
        ],
        cwd=str(ROOT),
        start_new_session=True,
    )
    load = None
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_answer(noop_request(f"{base}/noop"), 60.0)
        load = LoadClient(
            spec["client_procs"], spec["max_connections"], spec["timeout_s"], spec["max_in_flight"]
        )
        s = load.point(
            [noop_request(f"{base}/noop")],
            cfg["noop_rate"],
            cfg["noop_duration_s"],
            1.0,
            cfg["seed"],
        )
        doc["bare_uvicorn_noop"] = {
            "p50_s": _p(s["latency_s"], "p50"),
            "p99_s": _p(s["latency_s"], "p99"),
            "summary": s,
        }
        log(f"client: bare uvicorn no-op: {describe_point(s)}")
        ceil_cfg = dict(
            cfg,
            duration_s=cfg["client_duration_s"],
            warmup_s=0.5,
            refine=0,
            pause_after_fail_s=1.0,
            max_rate=cfg["client_max_rate"],
            rate_factor=cfg["client_rate_factor"],
        )
        for kind in sorted({MODELS[m]["kind"] for m in models}):
            requests = bench.build_requests(f"{base}/noop", kind, seed=cfg["seed"])
            points = sweep(
                load,
                requests,
                ceil_cfg,
                p99_target_s=cfg["client_p99_s"],
                deadline=deadline,
                label=f"client/{kind}",
                start=cfg["client_start_rate"],
            )
            doc[kind] = {
                "sweep": points,
                "max_throughput_per_s": max((p["throughput_per_s"] for p in points), default=None),
                "best_sustained": best_sustained(
                    points, cfg["client_p99_s"], cfg["max_error_rate"]
                ),
                "p99_target_s": cfg["client_p99_s"],
            }
        doc["status"] = "ok"
    finally:
        if load is not None:
            load.close()
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=10)
        except Exception:  # noqa: BLE001
            server.kill()
    return doc


def in_process_noop(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """p50 of a direct await of a no-op handler, and of the Starlette no-op app called
    in-process through httpx's ASGI transport with the bench's run_rate."""
    import httpx

    from load_tests import bench

    async def handler() -> dict[str, bool]:
        return {"ok": True}

    async def direct() -> list[float]:
        out = []
        for _ in range(20000):
            t = time.perf_counter()
            await handler()
            out.append(time.perf_counter() - t)
        return out

    calls = asyncio.run(direct())
    app = create_noop_app()

    async def asgi() -> Any:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as client:
            req = noop_request("http://in-process/noop")
            return await bench.run_rate(
                [req], cfg["noop_rate"], cfg["noop_duration_s"], warmup_s=0.5, client=client
            )

    res = asyncio.run(asgi())
    return {
        "direct_call_p50_s": bench.percentile(calls, 50),
        "asgi_in_process_p50_s": _p(res.summary.latency_s, "p50"),
        "asgi_in_process_p99_s": _p(res.summary.latency_s, "p99"),
    }
