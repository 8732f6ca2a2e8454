"""Where a replica's memory outside PyTorch's allocator grows after start-up (GPU host only).

The replica's torch cap is its budget less the non-torch bytes it measured at start-up (the CUDA
context). Anything that later grows outside the allocator, such as kernels loaded lazily on
first use or the device memory of instantiated CUDA graphs, is not counted by that cap. This
probe runs MiniLM (fp16, random weights) in-process, as a replica would, and reads NVML's bytes
for this process against torch's reserved bytes after each step: the context, the weights, one
eager pass of each of a few shapes, then the graph captures in groups.

    python3 -m research.graph_memory_probe --out /tmp/out/graph_memory_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from serve_app.adapters.embeddings.backend import SentenceEncoder as EmbeddingAdapter
from serve_app.config.args import parse_args
from serve_app.gpu import devices, nvml
from serve_app.gpu.graphs import GraphMemory, GraphSet, graph_batch_sizes
from serve_app.gpu.snapshot import DeviceMemory


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True)
    p.add_argument("--max-batch", type=int, default=256)
    a = p.parse_args()
    device = torch.device("cuda", 0)
    uuid = devices.uuid_for_torch_device(0)
    assert uuid is not None, "no NVML UUID for CUDA device 0"
    rows: list[dict[str, Any]] = []

    def mark(step: str) -> None:
        torch.cuda.synchronize(device)
        proc = nvml.process_used_bytes(os.getpid(), uuid)
        reserved = int(torch.cuda.memory_reserved(device))
        row = {
            "step": step,
            "nvml_process_bytes": proc if isinstance(proc, int) else None,
            "reserved_bytes": reserved,
            "non_torch_bytes": proc - reserved if isinstance(proc, int) else None,
            "t_s": round(time.perf_counter() - t0, 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    t0 = time.perf_counter()
    torch.cuda.set_device(device)
    torch.zeros(1, device=device)
    mark("context")
    adapter = EmbeddingAdapter(
        parse_args({"adapter": "embeddings", "load_format": "dummy", "dtype": "float16"})
    )
    adapter.setup(device)
    mark("weights")
    for b, n in ((1, 16), (8, 64), (32, 128), (128, 256)):
        adapter.predict([[101] + [2000] * (n - 2) + [102]] * b)
        mark(f"eager {b}x{n}")
    torch.cuda.empty_cache()
    mark("eager done, cache emptied")
    graphs = adapter.capture_graphs(  # nothing captured yet: all pending
        a.max_batch, 0.0, GraphMemory(DeviceMemory(adapter.device))
    )
    per_group = 10
    done = 0
    while graphs.pending:
        for _ in range(per_group):
            if not graphs.capture_next():
                break
        done = len(graphs)
        mark(f"graphs {done}")
    info = graphs.describe()
    torch.cuda.empty_cache()
    mark("all captured, cache emptied")
    first = next(r for r in rows if r["step"] == "eager done, cache emptied")
    last = rows[-1]
    doc = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device),
        "batch_buckets": graph_batch_sizes(a.max_batch),
        "graphs": info,
        "rows": rows,
        "non_torch_growth_from_graphs_bytes": (
            None
            if last["non_torch_bytes"] is None or first["non_torch_bytes"] is None
            else last["non_torch_bytes"] - first["non_torch_bytes"]
        ),
    }
    assert isinstance(graphs, GraphSet)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print("non-torch growth from graphs:", doc["non_torch_growth_from_graphs_bytes"], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
