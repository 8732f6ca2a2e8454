"""What each cache policy costs per batch on the GPU, measured in-process (no Ray, no HTTP).

Two models, as the replica runs them:

- ResNet-50, fp16, channels-last, batches of 64 images (torchvision's model when installed,
  else serve_app's built-in one with the same layers), random weights;
- MiniLM (serve_app's ``SentenceEncoder`` with ``load_format: dummy``), fp16, batches of 64
  max-length inputs through ``adapter.predict`` (token padding and the copy back included).

After every batch the policy runs as ``Partition.after_batch`` does: ``always`` empties the cache,
``never`` keeps it, ``threshold`` asks ``serve_app.gpu.budget.should_free_cache`` with the default
``cache_threshold_fraction`` and the budget of a ``num_gpus: 0.25`` replica. ``threshold_1pct``
(1% of that budget) is shown as well, since the default rarely fires for these models. Policies run
in interleaved rounds so that clock and thermal drift fall on all of them alike. A batch's time
runs from the input copy to the synchronised end of the policy step.

    python -m research.cache_policy_cost [--batches 100] [--rounds 3] [--out DIR]

Writes ``cache_policy_cost.json`` under ``--out`` (default ``$SERVE_APP_RESULTS_DIR`` or
``benchmarks/results``). About a minute on an H200.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from serve_app.config.args import MemoryArgs, parse_args
from serve_app.gpu.budget import should_free_cache

BATCH = 64
NUM_GPUS = 0.25
POLICIES: dict[str, tuple[str, float]] = {
    "always": ("always", 0.0),
    "threshold": ("threshold", MemoryArgs().cache_threshold_fraction),
    "threshold_1pct": ("threshold", 0.01),
    "never": ("never", 0.0),
}


def resnet50(device: torch.device) -> tuple[torch.nn.Module, str]:
    try:
        import torchvision

        model, source = torchvision.models.resnet50(weights=None), "torchvision"
    except Exception:  # noqa: BLE001 - a missing or broken torchvision: use ours
        from serve_app.adapters.image.resnet import build_resnet

        model, source = build_resnet("resnet50"), "serve_app.adapters.image.resnet"
    model = model.to(device=device, dtype=torch.float16).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model.eval(), source


def resnet_step(device: torch.device) -> tuple[Callable[[], None], dict[str, Any]]:
    model, source = resnet50(device)
    images = torch.randn(BATCH, 3, 224, 224, dtype=torch.float16).pin_memory()

    def step() -> None:
        x = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            probs = torch.softmax(model(x).float(), dim=1)
            probs.topk(5, dim=1)[0].cpu()

    return step, {"model": "resnet50", "source": source, "dtype": "float16", "batch": BATCH}


def minilm_step(device: torch.device) -> tuple[Callable[[], None], dict[str, Any]]:
    from serve_app.adapters.embeddings.backend import SentenceEncoder as EmbeddingAdapter

    args = parse_args({"adapter": "embeddings", "load_format": "dummy", "dtype": "float16"})
    adapter = EmbeddingAdapter(args)
    adapter.setup(device)
    items = adapter.worst_case_items(BATCH)

    def step() -> None:
        adapter.predict(items)

    return step, {
        "model": "all-MiniLM-L6-v2 architecture (dummy weights)",
        "dtype": "float16",
        "batch": BATCH,
        "tokens_per_item": adapter.max_tokens,
    }


def after_batch(policy: str, device: torch.device, budget_bytes: int) -> bool:
    kind, fraction = POLICIES[policy]
    reserved = torch.cuda.memory_reserved(device)
    allocated = torch.cuda.memory_allocated(device)
    if should_free_cache(kind, reserved, allocated, budget_bytes, fraction):  # type: ignore[arg-type]
        torch.cuda.empty_cache()
        return True
    return False


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def measure(
    step: Callable[[], None], device: torch.device, batches: int, rounds: int, budget_bytes: int
) -> dict[str, Any]:
    for _ in range(10):  # warm-up: cuDNN/cuBLAS choices, lazy kernel loading
        step()
    torch.cuda.synchronize(device)
    times: dict[str, list[float]] = {p: [] for p in POLICIES}
    frees = dict.fromkeys(POLICIES, 0)
    reserved_after: dict[str, int] = {}
    for _ in range(rounds):
        for policy in POLICIES:
            torch.cuda.empty_cache()  # every policy's round starts from the same state
            step()
            torch.cuda.synchronize(device)
            for _ in range(batches):
                t0 = time.perf_counter()
                step()
                frees[policy] += after_batch(policy, device, budget_bytes)
                torch.cuda.synchronize(device)
                times[policy].append((time.perf_counter() - t0) * 1000)
            reserved_after[policy] = int(torch.cuda.memory_reserved(device))
    base = statistics.mean(times["never"])
    out = {}
    for policy, ms in times.items():
        mean = statistics.mean(ms)
        out[policy] = {
            "batches": len(ms),
            "mean_ms": round(mean, 3),
            "p50_ms": round(percentile(ms, 50), 3),
            "p90_ms": round(percentile(ms, 90), 3),
            "p99_ms": round(percentile(ms, 99), 3),
            "items_per_s": round(BATCH / (mean / 1000), 1),
            "cost_vs_never_pct": round((mean / base - 1) * 100, 2),
            "frees": frees[policy],
            "reserved_bytes_after_round": reserved_after[policy],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100, help="batches per policy per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    default_out = os.environ.get("SERVE_APP_RESULTS_DIR", "benchmarks/results")
    parser.add_argument("--out", default=default_out, help="results dir")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("cache_policy_cost: no CUDA device; run this on the GPU host", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(device)
    budget_bytes = int(NUM_GPUS * props.total_memory)
    doc: dict[str, Any] = {
        "what": "per-batch latency of each cache policy, in-process, no serving",
        "device": props.name,
        "device_total_bytes": int(props.total_memory),
        "torch": torch.__version__,
        "budget_bytes": budget_bytes,
        "num_gpus": NUM_GPUS,
        "policies": {p: {"policy": k, "threshold_fraction": f} for p, (k, f) in POLICIES.items()},
        "batches_per_round": opts.batches,
        "rounds": opts.rounds,
        "models": [],
    }
    for build in (resnet_step, minilm_step):
        t0 = time.monotonic()
        step, info = build(device)
        print(f"{info['model']}: measuring ...", flush=True)
        info["results"] = measure(step, device, opts.batches, opts.rounds, budget_bytes)
        info["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
        info["seconds"] = round(time.monotonic() - t0, 1)
        doc["models"].append(info)
        for policy, r in info["results"].items():
            print(
                f"  {policy:15s} mean {r['mean_ms']:8.3f} ms  p50 {r['p50_ms']:8.3f}  "
                f"p99 {r['p99_ms']:8.3f}  {r['cost_vs_never_pct']:+6.2f}% vs never  "
                f"frees {r['frees']}",
                flush=True,
            )
        del step
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cache_policy_cost.json"
    path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
