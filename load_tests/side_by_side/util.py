"""Small helpers: the run's log, free ports, JSON files, and what the machine is."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

_T0 = time.time()


def set_t0(t0_unix: float | None) -> None:
    """Log times relative to ``t0_unix`` (a worker takes its parent's start)."""
    global _T0
    if t0_unix is not None:
        _T0 = t0_unix


def start_time() -> float:
    return _T0


def log(msg: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[{stamp} +{time.time() - _T0:6.1f}s] {msg}", flush=True)


def _error(exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb[-6000:]}


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str))
    tmp.replace(path)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"


def nvml_devices() -> list[dict[str, Any]]:
    """Name, UUID, total bytes and driver of each GPU via NVML ([] when there is none)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPUs to describe
        return []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)

            def text(v: Any) -> str:
                return v.decode() if isinstance(v, bytes) else str(v)

            out.append(
                {
                    "index": i,
                    "name": text(pynvml.nvmlDeviceGetName(h)),
                    "uuid": text(pynvml.nvmlDeviceGetUUID(h)),
                    "total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "driver_version": text(driver),
                }
            )
        return out
    finally:
        pynvml.nvmlShutdown()


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
    }
    for mod in ("torch", "torchvision", "transformers", "ray", "httpx", "uvicorn", "starlette"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing package is recorded, not fatal
            info[f"{mod}_version"] = None
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        info["torch_cuda"] = None
    gpus = nvml_devices()
    info["gpus"] = gpus
    info["gpu_name"] = gpus[0]["name"] if gpus else None
    info["gpu_total_bytes"] = gpus[0]["total_bytes"] if gpus else None
    info["driver_version"] = gpus[0]["driver_version"] if gpus else None
    try:
        import uvloop  # noqa: F401

        info["client_event_loop"] = "uvloop"
    except ImportError:
        info["client_event_loop"] = "asyncio"
    return info
