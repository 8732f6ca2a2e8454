"""Plots: matplotlib, imported only when a plot is drawn (it is the optional extra ``plots``, not
a dependency of the server), and the headroom-controller timeline (``controller_timeline.json``)
drawn to a PNG.

``pyplot()`` gives matplotlib.pyplot on the Agg backend, or raises ``PlotsUnavailable`` with the
command that installs it. The timeline JSON is what ``tests/gpu/test_controller_gpu.py`` records
once per second::

    {
      "schema_version": 1,
      "margin_bytes": 2147483648,
      "replica_gpus": ["GPU-..."],                       # GPUs the replicas ran on
      "phases": [{"name": "load", "t_s": 0.0}, ...],    # when each phase began
      "samples": [
        {"t_s": 0.0, "replicas_running": 1, "replicas_total": 1, "controller_target": 1,
         "controller_reason": "hold_in_band", "gpu_free_bytes": {"GPU-...": 1.4e11},
         "offered_rps": 850.0, "ok_rps": 850.0, "errors_per_s": 0.0},
        ...
      ]
    }

Three panels share the time axis: replicas (running, and the controller's target), free GPU
memory (GiB, with the safety margin), and load (requests/s sent, and errors/s). Phases are
dashed vertical lines. Samples that also carry per-GPU series (``replicas_by_gpu``,
``controller_target_by_gpu``, ``ok_per_s_by_gpu``, ``errors_per_s_by_gpu``, keyed by GPU UUID:
load_tests.benchmarks.multigpu's grab timeline) get one line per GPU instead of the totals.

Usage::

    python -m load_tests.harness.plots controller_timeline.json [-o out.png]   # PNG beside it
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PlotsUnavailable", "load_timeline", "main", "plot_timeline", "pyplot"]

GIB = float(1 << 30)
INSTALL_HINT = (
    "matplotlib is not installed: it is the optional extra 'plots'. Install it with "
    "pip install -e '.[plots]' in a checkout of serve_app (or pip install 'serve-app[plots]')"
)


class PlotsUnavailable(RuntimeError):
    """matplotlib cannot be imported; the message says how to install it."""


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotsUnavailable(INSTALL_HINT) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_timeline(path: str | Path) -> dict[str, Any]:
    """Read a timeline JSON file."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("samples"), list):
        raise ValueError(f"{path}: not a controller timeline (no 'samples' list)")
    return doc


def _series(samples: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    out = []
    for s in samples:
        value = s.get(key)
        out.append(float("nan") if value is None else float(value))
    return out


def _by_gpu(samples: Sequence[Mapping[str, Any]], key: str, uuid: str) -> list[float]:
    out = []
    for s in samples:
        value = (s.get(key) or {}).get(uuid)
        out.append(float("nan") if value is None else float(value))
    return out


def _gpus(doc: Mapping[str, Any]) -> list[str]:
    named = [str(u) for u in doc.get("replica_gpus") or []]
    if named:
        return named
    seen: list[str] = []
    for s in doc["samples"]:
        for uuid in (s.get("gpu_free_bytes") or {}).keys():
            if uuid not in seen:
                seen.append(uuid)
    return seen


def plot_timeline(doc: Mapping[str, Any] | str | Path, out_png: str | Path) -> Path:
    """Draw the timeline (a document, or the path of its JSON) to ``out_png``; returns it.
    Raises PlotsUnavailable without matplotlib."""
    plt = pyplot()
    data: Mapping[str, Any] = doc if isinstance(doc, Mapping) else load_timeline(doc)
    samples: list[Mapping[str, Any]] = list(data["samples"])
    t = _series(samples, "t_s")
    fig, (ax_rep, ax_mem, ax_load) = plt.subplots(
        3, 1, figsize=(11, 8.5), sharex=True, gridspec_kw={"height_ratios": [1, 1, 1]}
    )
    title = str(data.get("title") or "serve_app headroom controller")
    if data.get("device"):
        title += f" ({data['device']})"
    fig.suptitle(title)

    per_gpu = any("replicas_by_gpu" in s for s in samples)
    if per_gpu:
        for uuid in _gpus(data):
            line = ax_rep.step(
                t, _by_gpu(samples, "replicas_by_gpu", uuid), where="post", label=f"{uuid[:12]}"
            )
            ax_rep.step(
                t,
                _by_gpu(samples, "controller_target_by_gpu", uuid),
                where="post",
                linestyle="--",
                color=line[0].get_color(),
                label=f"target {uuid[:12]}",
            )
    else:
        ax_rep.step(t, _series(samples, "replicas_running"), where="post", label="running")
        ax_rep.step(
            t,
            _series(samples, "controller_target"),
            where="post",
            linestyle="--",
            label="controller target",
        )
    ax_rep.set_ylabel("replicas")
    ax_rep.set_ylim(bottom=0)
    ax_rep.legend(loc="lower right", fontsize="small")
    ax_rep.grid(alpha=0.3)

    for uuid in _gpus(data):
        free = [
            float("nan")
            if (s.get("gpu_free_bytes") or {}).get(uuid) is None
            else float(s["gpu_free_bytes"][uuid]) / GIB
            for s in samples
        ]
        ax_mem.plot(t, free, label=f"free {uuid[:12]}")
    margin = data.get("margin_bytes")
    if margin is not None:
        ax_mem.axhline(float(margin) / GIB, color="red", linestyle=":", label="safety margin")
    ax_mem.set_ylabel("GPU free (GiB)")
    ax_mem.set_ylim(bottom=0)
    ax_mem.legend(loc="best", fontsize="small")
    ax_mem.grid(alpha=0.3)

    ax_err = ax_load.twinx()
    if per_gpu:
        width = min(0.8, float(data.get("sample_period_s") or 1.0)) / 2
        errors = {u: _by_gpu(samples, "errors_per_s_by_gpu", u) for u in _gpus(data)}
        for i, (uuid, errs) in enumerate(errors.items()):
            ax_load.plot(t, _by_gpu(samples, "ok_per_s_by_gpu", uuid), label=f"ok/s {uuid[:12]}")
            shifted = [x + i * width for x in t]
            ax_err.bar(shifted, errs, width=width, alpha=0.6, label=f"errors/s {uuid[:12]}")
        top = max([1.0, *(e for errs in errors.values() for e in errs if not math.isnan(e))])
        ax_err.legend(loc="upper right", fontsize="small")
    else:
        ax_load.plot(t, _series(samples, "offered_rps"), label="requests sent /s")
        ax_err.bar(t, _series(samples, "errors_per_s"), width=0.8, color="red", alpha=0.6)
        top = max([1.0, *_series(samples, "errors_per_s")])
    ax_load.set_ylabel("requests/s")
    ax_load.set_ylim(bottom=0)
    ax_err.set_ylabel("errors/s", color="red")
    ax_err.set_ylim(bottom=0, top=top * 1.2)
    ax_load.legend(loc="upper left" if per_gpu else "best", fontsize="small")
    ax_load.grid(alpha=0.3)
    ax_load.set_xlabel("time (s)")

    for i, phase in enumerate(data.get("phases") or []):
        for ax in (ax_rep, ax_mem, ax_load):
            ax.axvline(float(phase["t_s"]), color="grey", linestyle="--", linewidth=0.8)
        ax_rep.annotate(  # labels alternate between two rows so close phases stay readable
            str(phase["name"]),
            (float(phase["t_s"]), 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, 4 + 10 * (i % 2)),
            textcoords="offset points",
            fontsize="small",
            color="dimgrey",
        )
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m load_tests.harness.plots",
        description="Plot controller_timeline.json to a PNG (needs the extra 'plots').",
    )
    parser.add_argument("timeline", help="path of controller_timeline.json")
    parser.add_argument("-o", "--out", help="PNG path (default: next to the JSON, .png)")
    ns = parser.parse_args(argv)
    src = Path(ns.timeline)
    out = Path(ns.out) if ns.out else src.with_suffix(".png")
    try:
        written = plot_timeline(src, out)
    except (OSError, ValueError, KeyError, PlotsUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(written)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
