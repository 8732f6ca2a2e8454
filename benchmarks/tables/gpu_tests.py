"""What the GPU tests recorded: memory test 2, the cache policies, the controller's timeline."""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from benchmarks.tables.common import (
    BLOCK,
    MB,
    Ctx,
    Renderer,
    load,
    table,
)

MEMORY_TEST_2 = (
    ("cb06e10", "startup/memory_gpu_2_oversized_isolation_run6_cb06e10.json"),
    ("475a289", "startup/memory_gpu_2_oversized_isolation_run7_475a289.json"),
    ("475a289", "startup/memory_gpu_2_oversized_isolation_run7b_475a289.json"),
)


def r_memory_test_2(ctx: Ctx) -> str:
    body = []
    for code, rel in MEMORY_TEST_2:
        d = load(ctx.results / rel)
        over, steady = d["oversized"], d["steady"]
        statuses = ", ".join(f"{n} x {s}" for s, n in over["load"]["statuses"].items())
        ratio, limit = steady["p99_ratio"], steady.get("p99_limit_factor")
        # runs since issue 29 report the ratio without a limit (docs/memory.md says why)
        verdict = "reported" if limit is None else "passed" if ratio <= limit else "failed"
        judged = verdict if limit is None else f"{verdict}, limit x{limit:g}"
        body.append(
            [
                ctx.link(rel, rel.rsplit("_", 2)[-2] if "_run" in rel else rel),
                f"`{code}`",
                f"{over['cap_bytes']:,}",
                f"{over['nvml_max_bytes']:,}",
                f"{(over['cap_bytes'] - over['nvml_max_bytes']) / MB:.1f} MB",
                statuses,
                str(over["oom_recoveries"]),
                f"x{ratio:.2f} ({judged})",
            ]
        )
    header = ["run", "code", "cap bytes", "NVML max bytes", "under the cap", "answers"]
    return table(header + ["OOM recoveries", "steady replicas' p99 ratio"], body)


CACHE_COST_RUNS = (
    ("first GPU tests", "gpu_tests/cache_policy_cost.json"),
    ("after the batcher", "gpu_tests/batcher/cache_policy_cost.json"),
    ("with CUDA graphs", "gpu_tests/graphs/cache_policy_cost.json"),
)


def _model_label(m: Mapping[str, Any]) -> str:
    name = "MiniLM" if "MiniLM" in str(m["model"]) else str(m["model"])
    tokens = f" x {m['tokens_per_item']} tokens" if m.get("tokens_per_item") else ""
    return f"{name} {m['dtype']}, batch {m['batch']}{tokens}"


def r_cache_policy_cost(ctx: Ctx) -> str:
    d = load(ctx.results / CACHE_COST_RUNS[-1][1])
    order = ("always", "threshold", "threshold_1pct", "never")
    body = []
    for m in d["models"]:
        cells = []
        for pol in order:
            r = m["results"][pol]
            cost = "" if pol == "never" else f" ({r['cost_vs_never_pct']:+.1f}%, "
            cost += "" if pol == "never" else f"{r['frees']} frees)"
            cells.append(f"{r['mean_ms']:.3f} ms{cost}")
        body.append([_model_label(m), *cells])
    fr = {k: v["threshold_fraction"] for k, v in d["policies"].items()}
    header = ["model", "`always`", f"`threshold` ({fr['threshold']:g}, the default)"]
    header += [f"`threshold` at {fr['threshold_1pct']:g}", "`never`"]
    spread = []
    for label, rel in CACHE_COST_RUNS:
        runs = load(ctx.results / rel)["models"]
        pcts = ", ".join(
            f"{r['results']['threshold']['cost_vs_never_pct']:+.2f}% "
            f"({'MiniLM' if 'MiniLM' in str(r['model']) else r['model']})"
            for r in runs
        )
        spread.append(f"{ctx.link(rel, label)}: {pcts}")
    note = (
        f"Mean of {d['rounds']} interleaved rounds of {d['batches_per_round']} batches, "
        f"{d['device']}, a {d['num_gpus']:g} budget. `threshold` against `never` in each run: "
        + "; ".join(spread)
        + "."
    )
    return table(header, body) + "\n\n" + note


def r_cache_policy_nvml(ctx: Ctx) -> str:
    rel = "gpu_tests/graphs/memory_gpu_4_cache_policy.json"
    d = load(ctx.results / rel)
    body = []
    for pol in ("always", "threshold", "never"):
        r = d["policies"][pol]
        body.append(
            [
                f"`{pol}`",
                f"{r['baseline_nvml_bytes']:,}",
                f"{r['after_nvml_bytes']:,}",
                f"{r['nvml_delta_bytes']:+,}",
                str(r["cache_frees"]),
            ]
        )
    header = ["policy", "NVML bytes before", "after", "change", "cache frees"]
    return table(header, body) + f"\n\n{d['items']} inputs in one batch ({ctx.link(rel)})."


TIMELINE = "gpu_tests/controller_timeline.json"
LOG_TIME = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _decisions(d: Mapping[str, Any]) -> list[tuple[float, str]]:
    """(seconds after the test started, line) of each logged decision; the Serve controller
    logs in the host's time, which is UTC there."""
    out = []
    for line in d["controller_log"]:
        m = LOG_TIME.search(line)
        if m:
            t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
            out.append((t.timestamp() - float(d["started_at_unix_s"]), line))
    return out


def r_controller_timeline(ctx: Ctx) -> str:
    d = load(ctx.results / TIMELINE)
    phase = {p["name"]: float(p["t_s"]) for p in d["phases"]}
    dec = _decisions(d)

    def first(after: float, word: str) -> tuple[float, str]:
        return next((t, line) for t, line in dec if t >= after and word in line)

    def quote(line: str) -> str:
        return line.split("controller-gpu/model: ", 1)[-1].split(";")[0]

    up, up_line = first(phase["load"], "(scale_up)")
    shed, shed_line = first(phase["grab holds"], "(shed_memory_pressure)")
    back, _ = first(phase["release"], "(scale_up)")
    sheds = [t for t, line in dec if "(shed_memory_pressure)" in line and t < phase["release"]]
    gap_s = statistics.fmean(b - a for a, b in zip(sheds, sheds[1:], strict=False))
    grab = next(iter(d["grab"].values()))
    load_ = d["load"]
    rows = [
        [
            "load begins to the first scale-up decision",
            f"{up - phase['load']:.2f} s",
            f"`{quote(up_line)}`",
        ],
        [
            "the grab holds to the first shed",
            f"{shed - phase['grab holds']:.2f} s",
            f"`{quote(shed_line)}`; {len(sheds)} sheds in all, {gap_s:.2f} s apart",
        ],
        [
            "free bytes the grab left",
            f"{grab['free_bytes']:,}",
            f"of {grab['total_bytes']:,}; the grabbing process took {grab['grabbed_bytes']:,}",
        ],
        ["fewest replicas under the grab", str(d["fewest_replicas_under_grab"]), "`min_replicas`"],
        ["the release to the next scale-up decision", f"{back - phase['release']:.2f} s", ""],
        ["requests sent / failed", f"{load_['sent']:,} / {load_['failed']}", ""],
    ]
    note = (
        "Times run from the phase's start in the test's clock to the decision's line in the "
        f"Serve controller's log ({ctx.link(TIMELINE, 'JSON')}: `phases`, `controller_log`)."
    )
    return table(["figure", "value", "detail"], rows) + "\n\n" + note


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "memory-test-2": (BLOCK, r_memory_test_2),
    "cache-policy-cost": (BLOCK, r_cache_policy_cost),
    "cache-policy-nvml": (BLOCK, r_cache_policy_nvml),
    "controller-timeline": (BLOCK, r_controller_timeline),
}
