"""A quick end-to-end check on a GPU host: deploy configs with dummy weights, print reports.

Usage (GPU host, from the repo root): python3 scripts/gpu_smoke.py [OUT_DIR]
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import httpx
import yaml

from serve_app.ops import launch
from serve_app.ops.status import render_status


def dummy(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    for app in doc["applications"]:
        app["args"]["load_format"] = "dummy"
    return doc


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/smoke")
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in ("gpu-shared", "multi-model"):
        doc = dummy(yaml.safe_load(Path(f"configs/{name}.yaml").read_text()))
        t0 = time.time()
        try:
            dep = launch.run(doc, haproxy=True, ready_timeout_s=240)
            print(name, "ready in", round(time.time() - t0, 1), "s", dep.notes, flush=True)
            r = httpx.post(f"{dep.url}/v1/embeddings", json={"input": ["hello", "world"]})
            print("embeddings", r.status_code, r.text[:200], flush=True)
            if name == "multi-model":
                from load_tests.payloads import image_bytes

                r2 = httpx.post(
                    f"{dep.url}/images/v1/classify",
                    content=image_bytes(224, "jpeg", 0),
                    headers={"content-type": "image/jpeg"},
                )
                print("classify", r2.status_code, r2.text[:300], flush=True)
            time.sleep(2)
            mem = httpx.get(f"{dep.url}/v1/memory", timeout=30).json()
            print(render_status(mem), flush=True)
            results[name] = mem
        except Exception as exc:  # noqa: BLE001
            print(name, "FAILED:", repr(exc), flush=True)
            results[name] = {"error": repr(exc)}
        finally:
            launch.shutdown()
    (out / "gpu_smoke.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
