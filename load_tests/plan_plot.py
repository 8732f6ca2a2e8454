"""Draw a plan's memory, cores and GPU time per GPU, and each model's predicted throughput and
p99 against its target: ``python -m load_tests.plan_plot OUT/plan.json`` writes OUT/plan.png
(``serve-app plan`` writes plan.json; the server never imports matplotlib)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from load_tests.harness.plots import pyplot

GIB = 1 << 30


def plot_plan(doc: dict[str, Any], out_png: Path) -> Path:
    plt = pyplot()
    gpus, models = doc["gpus"], doc["models"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [m["application"] for m in models]
    # 1: per GPU, each resource as a fraction of what the plan may use, stacked by model.
    ax = axes[0]
    labels = []
    for g, gpu in enumerate(gpus):
        for r, (res, cap_key) in enumerate(
            (("memory_bytes", "memory_cap_bytes"), ("cores", "cores_cap"))
        ):
            x = g * 3 + r
            bottom = 0.0
            for name in names:
                part = gpu["per_model"][name][res] / gpu[cap_key]
                ax.bar(x, part, bottom=bottom, label=name if (g, r) == (0, 0) else None,
                       color=f"C{names.index(name)}")  # fmt: skip
                bottom += part
            if r == 1 and gpu.get("ingress_cores"):  # HAProxy's and Ray's proxy's share
                ax.bar(x, gpu["ingress_cores"] / gpu[cap_key], bottom=bottom, color="grey",
                       hatch="//", label="ingress" if g == 0 else None)  # fmt: skip
            labels.append((x, f"GPU {g}\n{'memory' if r == 0 else 'cores'}"))
        x = g * 3 + 2
        ax.bar(x, gpu["gpu_time"] / gpu["gpu_time_cap"], color="grey")
        labels.append((x, f"GPU {g}\nGPU time"))
    ax.set_xticks([x for x, _ in labels], [t for _, t in labels], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("of the room less the reserve")
    ax.set_title("binds: " + "; ".join(", ".join(g["binds"]) for g in gpus))
    ax.legend(fontsize=8)
    # 2: predicted throughput per model.
    ax = axes[1]
    ax.bar(names, [m["predicted_throughput_rps"] for m in models],
           color=[f"C{i}" for i in range(len(names))])  # fmt: skip
    ax.set_ylabel("predicted requests/s")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    # 3: predicted p99 against the target.
    ax = axes[2]
    ax.bar(names, [m["predicted_p99_s"] * 1000 for m in models],
           color=[f"C{i}" for i in range(len(names))])  # fmt: skip
    ax.scatter(names, [m["p99_target_s"] * 1000 for m in models], marker="_", s=600,
               color="black", label="target")  # fmt: skip
    ax.set_ylabel("predicted p99, ms")
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend(fontsize=8)
    fig.suptitle(f"plan ({doc['mode']}): predicted, not measured")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("plan_json")
    parser.add_argument("--out", help="the PNG (default: plan.png beside plan.json)")
    ns = parser.parse_args(argv)
    src = Path(ns.plan_json)
    out = Path(ns.out) if ns.out else src.with_name("plan.png")
    print(plot_plan(json.loads(src.read_text()), out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
