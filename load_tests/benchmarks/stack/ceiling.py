"""Each family's in-process ceiling: the application's own model (serve_app's backend, built
from its config args, as a replica builds it) alone in this process, fed the benchmark's own
request decoded by the family's wire spec, items/s per batch size, eagerly and (on a GPU, when
the args keep ``cuda_graphs``) replaying the backend's CUDA graphs. The best of them is the
ceiling the served throughput is read against.

    python -m load_tests.benchmarks.stack.ceiling SPEC.json OUT.json

Run by the stack benchmark in a process of its own before the cluster starts, so that it has the
GPU to itself and gives all of it back when it exits.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from load_tests.harness.run import error_doc, log, write_json


def time_it(fn: Callable[[], Any], sync: Callable[[], None], min_s: float) -> float:
    """Seconds per call of ``fn`` after two warm-up calls, over at least ``min_s``."""
    for _ in range(2):
        fn()
    sync()
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if n % 4 == 0 or min_s <= 0:
            sync()
            elapsed = time.perf_counter() - t0
            if elapsed >= min_s and n >= 3:
                return elapsed / n


def family_ceiling(fam: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    from serve_app.adapters import build_model
    from serve_app.config.args import parse_args

    device = torch.device(spec["device"])
    torch.set_num_threads(int(fam.get("torch_threads", 1)))  # as its replica runs
    args = parse_args({**fam["app_args"], "device": spec["device"]})
    model = build_model(args)
    model.backend.setup(device)
    decoded = model.decode(base64.b64decode(fam["body_b64"]), fam["content_type"], {})
    one = list(decoded.items)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rates(label: str) -> dict[str, float]:
        out = {}
        for b in spec["batches"]:
            items = (one * (b // len(one) + 1))[:b]
            per = time_it(partial(model.backend.predict, items), sync, spec["min_s"])
            out[str(b)] = b / per
        log(
            f"ceiling {fam['application']} {label}: "
            + ", ".join(f"{k}: {v:,.0f}/s" for k, v in out.items())
        )
        return out

    doc: dict[str, Any] = {
        "device": str(device),
        "dtype": args.dtype,
        "eager_items_per_s": rates("eager"),
    }
    if device.type == "cuda" and args.cuda_graphs:
        from serve_app.gpu.graphs import GraphMemory
        from serve_app.gpu.snapshot import DeviceMemory

        try:
            top = max(b for b in spec["batches"] if b <= args.cuda_graph_max_batch_size)
            model.backend.capture_graphs(top, None, GraphMemory(memory=DeviceMemory(device)))
            doc["graph_items_per_s"] = rates("CUDA graphs")
        except Exception as exc:  # noqa: BLE001 - the eager figures still stand
            doc["graph_error"] = f"{type(exc).__name__}: {exc}"[:500]
    best = {**doc["eager_items_per_s"]}
    for b, v in (doc.get("graph_items_per_s") or {}).items():
        best[b] = max(best.get(b, 0.0), v)
    doc["best_batch"] = int(max(best, key=lambda k: best[k]))
    doc["items_per_s_max"] = max(best.values())
    if device.type == "cuda":
        doc["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
    return doc


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    spec = json.loads(Path(spec_path).read_text())
    out: dict[str, Any] = {}
    for fam in spec["families"]:
        try:
            out[fam["application"]] = {"status": "ok", **family_ceiling(fam, spec)}
        except Exception as exc:  # noqa: BLE001 - one family's failure must not hide the others
            out[fam["application"]] = {"status": "error", **error_doc(exc)}
            log(f"ceiling {fam['application']}: {out[fam['application']]['error']}")
        finally:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        write_json(Path(out_path), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
