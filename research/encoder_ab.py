"""serve_app's BERT encoder (adapters/embeddings/bert.py) against transformers' BertModel, the
model the embeddings adapter ran before: the same MiniLM weights (random, as on the GPU host),
the same dtype, the same padded batches; items/s per batch size and token length, eager, with
the pooling the adapter adds, and the largest difference between their hidden states. With
``--graphs`` (CUDA only), each forward is also captured by serve_app's GraphSet and replayed
back to back, as a serving replica replays it: items/s bound by the GPU's time per replay,
which is what replicas that share a GPU by time-slicing compete for.

    python -m research.encoder_ab --device cuda --out encoder_ab.json [--graphs]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from load_tests.benchmarks.throughput.ceiling import time_it
from serve_app.adapters.embeddings import bert
from serve_app.adapters.embeddings.modeldir import SKELETON_DIR
from serve_app.gpu.graphs import GraphMemory, GraphSet
from serve_app.gpu.snapshot import DeviceMemory

BATCHES = (1, 8, 32, 128, 512, 1024)
TOKENS = (16, 128)


def graphed(forward: Any, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    """``forward(ids, mask) -> (pooled,)`` captured by serve_app's own GraphSet, as a replica
    captures it; a call that replays it as a replica does (the inputs copied in, the graph
    replayed)."""
    graphs = GraphSet(forward, GraphMemory(DeviceMemory(ids.device)))
    key = tuple(ids.shape)
    graphs.capture(key, (ids, mask))
    return lambda: graphs.run(key, (ids, mask))


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m research.encoder_ab")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--min-s", type=float, default=0.5, help="timing per point")
    p.add_argument("--graphs", action="store_true", help="also time CUDA graph replays (CUDA)")
    a = p.parse_args()
    if a.graphs and a.device != "cuda":
        p.error("--graphs needs --device cuda: CUDA graphs run on a GPU only")
    from transformers import AutoConfig, AutoModel

    device = torch.device(a.device)
    dtype = torch.float16 if a.device == "cuda" else torch.float32
    config = json.loads((SKELETON_DIR / "config.json").read_text())
    theirs = AutoModel.from_config(AutoConfig.from_pretrained(str(SKELETON_DIR)))
    theirs = theirs.to(device, dtype).eval()
    with torch.device("meta"):
        ours = bert.BertEncoder(bert.BertConfig.from_dict(config))
    ours.load_checkpoint({k: v.clone() for k, v in theirs.state_dict().items()}, "transformers")
    ours = ours.to(device, dtype).eval()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(hidden.dtype)
        out = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(out.float(), p=2, dim=1)

    rows: list[dict[str, Any]] = []
    for n in TOKENS:
        for b in BATCHES:
            ids = torch.randint(1000, 20000, (b, n), device=device)
            mask = torch.ones((b, n), dtype=torch.long, device=device)
            mask[:, n - n // 4 :] = 0  # a quarter padding, as batches of mixed lengths have
            with torch.inference_mode():
                diff = (ours(ids, mask) - theirs(input_ids=ids, attention_mask=mask)[0]).abs()
                keep = mask.bool()
                max_diff = float(diff[keep].max())

            def run_ours(ids: Any = ids, mask: Any = mask) -> None:
                with torch.inference_mode():
                    pooled(ours(ids, mask), mask)

            def run_theirs(ids: Any = ids, mask: Any = mask) -> None:
                with torch.inference_mode():
                    pooled(theirs(input_ids=ids, attention_mask=mask).last_hidden_state, mask)

            # alternate, so that a drift of the clock or the GPU falls on both
            t_ours = min(time_it(run_ours, sync, a.min_s) for _ in range(2))
            t_theirs = min(time_it(run_theirs, sync, a.min_s) for _ in range(2))
            row = {
                "tokens": n,
                "batch": b,
                "ours_items_per_s": round(b / t_ours, 1),
                "transformers_items_per_s": round(b / t_theirs, 1),
                "ours_over_transformers": round(t_theirs / t_ours, 4),
                "max_abs_diff_hidden": max_diff,
            }
            if a.graphs:
                replay_ours = graphed(lambda i, m: (pooled(ours(i, m), m),), ids, mask)
                replay_theirs = graphed(
                    lambda i, m: (pooled(theirs(input_ids=i, attention_mask=m)[0], m),), ids, mask
                )
                g_ours = min(time_it(replay_ours, sync, a.min_s) for _ in range(2))
                g_theirs = min(time_it(replay_theirs, sync, a.min_s) for _ in range(2))
                row.update(
                    ours_graph_items_per_s=round(b / g_ours, 1),
                    transformers_graph_items_per_s=round(b / g_theirs, 1),
                    graph_ours_over_transformers=round(g_theirs / g_ours, 4),
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    import transformers

    doc = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "graphs": a.graphs,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    a.out.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
