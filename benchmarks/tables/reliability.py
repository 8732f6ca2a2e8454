"""The fault suites (``reliability/``), each run's rows apart, and the CPU soaks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.tables.common import (
    BLOCK,
    GIB,
    INLINE,
    MB,
    Ctx,
    Renderer,
    fmt_range,
    load,
    table,
)

GPU_FAULT_RUNS = (
    "reliability/gpu_faults_h200_run1.json",
    "reliability/gpu_faults_h200_run2.json",
    "reliability/sigstop_h200_daef6d9.json",
    "reliability/sigstop_h200_887eda6.json",
)
CPU_FAULT_FILES = (
    "reliability/faults_cpu.json",
    "reliability/sigstop15_ray_defaults.json",
    "reliability/sigstop15.json",
    "reliability/sigstop40.json",
    "reliability/gpu_faults_cpu_dry_run.json",
    "reliability/sigstop_hung_before.json",
    "reliability/sigstop_watch_cpu.json",
)


def _kill_series(detail: Mapping[str, Any]) -> str:
    oor = [float(x) for x in detail["out_of_rotation_s"]]
    measured = [x for x in oor if x >= 0]
    text = (
        f"{detail['kills']} of {detail['kills_asked']} kills in {detail['series_s']:g} s; "
        f"replacements serving {fmt_range(detail['replacement_s'], 2)} s after their kill; "
        f"each victim out of HAProxy's rotation {fmt_range(measured, 2)} s after its kill"
    )
    if len(measured) < len(oor):
        bad = ", ".join(f"{x:g}" for x in oor if x < 0)
        unmeasured = len(oor) - len(measured)
        text += f" ({len(measured)} kills; {unmeasured} recorded {bad}, not a measurement)"
    return text


def _fault_notes(row: Mapping[str, Any]) -> str:
    d = row.get("detail") or {}
    fault = row["fault"]
    if fault == "kill20":
        return _kill_series(d)
    if fault == "poisoned":
        return f"the replica exited {d['exited_s']:g} s after the hook, its requests replayed"
    if fault == "sigstop":
        replaced = "replaced while stopped" if d.get("replaced_while_stopped") else "not replaced"
        held = (
            f"; the last request it held answered {d['last_held_answered_s']:g} s after SIGSTOP "
            f"(bound {d['held_bound_s']:g} s), the slowest took {d['slowest_s']:g} s"
            if d.get("last_held_answered_s") is not None and d.get("held_bound_s") is not None
            else ""
        )
        return (
            f"out of rotation {d['out_of_rotation_s']:g} s after SIGSTOP{held}; stopped "
            f"{d['stopped_s']:g} s, {replaced}; neighbours {d['neighbour_answers']:,} answers, "
            f"{d['neighbour_lost']} lost, {d['neighbour_failed']} failed"
        )
    if fault == "hog":
        if "hog" not in d:
            return str(d.get("skipped", "-"))
        h = d["hog"]
        return (
            f"another process took {h['taken_bytes'] / GIB:.1f} GiB, leaving "
            f"{h['free_while_held_bytes'] / GIB:.2f} GiB free for {h['held_s']:g} s; "
            f"{d['requests_while_hogged']:,} requests meanwhile, "
            f"{d['lost_while_hogged']} lost, {d['failed_while_hogged']} failed"
        )
    if fault == "overload_3x":
        s = d.get("statuses", {})
        text = f"capacity {d['capacity_rps']:g} req/s, offered {d['offered_rps']:g}"
        if "items_per_request" in d:
            text += f" ({d['items_per_request']} texts a request)"
        text += f"; {s.get('503', 0):,} x 503, {s.get('200', 0):,} x 200"
        if "accepted_p99_s" in d:
            text += f" (p99 {d['accepted_p99_s']:g} s)"
        return text
    if fault.startswith("hostile:"):
        return f"answer {d.get('answer')} in {d.get('took_s'):g} s"
    return "-"


def _fault_row(row: Mapping[str, Any]) -> list[str]:
    rec = row.get("recovery_s")
    return [
        f"`{row['fault']}`",
        f"{row['sent']:,}",
        str(row["lost"]),
        f"{row['failed']:,}",
        "-" if rec is None else f"{rec:g}",
        _fault_notes(row),
    ]


def r_gpu_faults(ctx: Ctx) -> str:
    body = []
    lines = []
    for i, rel in enumerate(GPU_FAULT_RUNS, start=1):
        d = load(ctx.results / rel)
        for row in d["rows"]:
            body.append([f"{i} ({ctx.link(rel, 'JSON')})", *_fault_row(row)])
        watch = d.get("memory")
        judged = (
            f"{watch['budget_violations']} budget violations in {watch['nvml_samples_judged']:,} "
            f"NVML samples of {watch['replica_pids_judged']} replica processes"
            if watch
            else "no NVML budget judging recorded"
        )
        lines.append(
            f"- Run {i}: `complete: {str(d['complete']).lower()}`, {d['took_s']:g} s, faults "
            f"{', '.join(r['fault'] for r in d['rows'])}; {judged}."
        )
    header = ["run", "fault", "sent", "lost", "failed", "recovery_s", "what the JSON shows"]
    return table(header, body) + "\n\n" + "\n".join(lines)


def r_cpu_faults(ctx: Ctx) -> str:
    body = []
    for rel in CPU_FAULT_FILES:
        d = load(ctx.results / rel)
        for row in d["rows"]:
            body.append([ctx.link(rel), *_fault_row(row)])
    header = ["file", "fault", "sent", "lost", "failed", "recovery_s", "what the JSON shows"]
    return table(header, body)


SOAK_FILES = (
    "reliability/soak_cpu_120s.json",
    "reliability/soak_cpu_600s.json",
    "reliability/soak_cpu_slope_1800s.json",
    "reliability/soak_cpu_slope_3600s.json",
    "reliability/soak_cpu_l0_1200s_default.json",
    "reliability/soak_cpu_l0_1200s_arena2.json",
    "reliability/soak_cpu_l0_1200s_1b0ced4.json",
    "reliability/soak_cpu_l0_1200s_943637b.json",
    "reliability/soak_cpu_l0_1200s_ab_arena2_fdb9b57.json",
)
MIB_PER_H = 60 / (1 << 20)  # bytes per minute to MiB per hour


def _duration(d: Mapping[str, Any], v: Mapping[str, Any]) -> str:
    """The planned duration (warm-up); for a soak cut short, the seconds its samples cover."""
    planned = f"{d['cli']['duration_s']:g} s ({v['warmup_s']:g} s)"
    if d.get("complete", True):
        return planned
    covered_s = max((s["t_s"] for s in d["samples"]), default=0.0)
    return f"{covered_s:.0f} s of {planned}, cut short"


def _soak_cells(ctx: Ctx, rel: str, d: Mapping[str, Any], commit: str) -> list[str]:
    """A soak row's first cells: file, commit, duration (warm-up), rate (peak), sent, lost,
    failed."""
    t, v = d["totals"], d["verdict"]
    return [
        ctx.link(rel),
        f"`{commit}`",
        _duration(d, v),
        f"{d['rate_rps']:g} ({d['peak_rps']:g})",
        f"{t['sent']:,}",
        str(t["lost"]),
        str(t["failed"]),
    ]


def r_soak_cpu(ctx: Ctx) -> str:
    """A row per soak, and per application of a soak with variants (``_soak_parts``)."""
    body = []
    for rel in SOAK_FILES:
        d = load(ctx.results / rel)
        cli = d["cli"]
        layers = [f"{n} encoder layers" for n in [cli.get("encoder_layers")] if n is not None]
        parts = _soak_parts(d)
        for env, part, v in parts:
            reps = v["replicas"]
            setup = layers + ([env] if len(parts) > 1 or cli.get("replica_env") else [])
            slopes = [r["rss_slope_bytes_per_min"] * MIB_PER_H for r in reps]
            body.append(
                [
                    *_soak_cells(ctx, rel, part, str(d["commit"])[:7]),
                    ", ".join(setup) or "MiniLM",
                    fmt_range((r["rss_spread_bytes"] / MB for r in reps), 1, " MB"),
                    fmt_range(slopes, 1, " MiB/h"),
                    "yes" if v["flat"] else "no",
                    "yes" if all(x <= 5 for x in slopes) else "no",
                ]
            )
    header = ["file", "commit", "duration (warm-up)", "req/s offered (peak)", "sent", "lost"]
    header += ["failed", "model, replica env", "RSS spread per replica after warm-up"]
    header += ["RSS slope per replica", "flat"]
    header += ["slope under 5 MiB/h"]
    return table(header, body)


SOAK_H200_FILES = (
    "reliability/soak_h200_slope_1320s.json",
    "reliability/soak_h200_slope_810s_arena2.json",
    "reliability/soak_h200_ab_arena2_840s.json",
    "reliability/soak_h200_ab_arena4_1080s.json",
    "reliability/soak_h200_slope_1200s_cut.json",
)


def _soak_parts(d: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """(replica env, the soak doc as one row would read it, verdict) per row: one for a plain
    soak, one per application for a soak with variants (its totals, peak and verdict)."""
    env = [f"`{kv}`" for kv in d["cli"].get("replica_env") or []]
    variants = d.get("variants") or ({"compare": d["compare_env"]} if d.get("compare_env") else {})
    if not variants:
        return [(", ".join(env) or "glibc's defaults", d, d["verdict"])]
    out = []
    for app, v in d["verdict_by_application"].items():
        extra = [f"`{k}={x}`" for k, x in variants.get(app, {}).items()]
        keys = ("sent", "ok", "failed", "lost")
        totals = {k: sum(c["by_application"][app][k] for c in d["chunks"]) for k in keys}
        peaks = d["peaks_rps"][app]
        mean_peak = round(sum(peaks) / len(peaks), 1)
        part = {**d, "totals": totals, "verdict": v, "peak_rps": mean_peak}
        out.append((", ".join(env + extra) or "glibc's defaults", part, v))
    return out


def _violations(mem: Mapping[str, Any] | None) -> str:
    if mem is None:
        return "not recorded (run cut short)"
    return f"{mem['budget_violations']} in {mem['nvml_samples_judged']:,}"


def r_soak_h200(ctx: Ctx) -> str:
    body = []
    for rel in SOAK_H200_FILES:
        d = load(ctx.results / rel)
        mem = d.get("memory")  # absent: the independent sampler's verdict was lost
        for env, part, v in _soak_parts(d):
            reps = v["replicas"]

            def slopes(key: str, reps: list[dict[str, Any]] = reps) -> str:
                rates = (r[f"{key}_slope_bytes_per_min"] * MIB_PER_H for r in reps)
                return fmt_range(rates, 1, "")

            body.append(
                [
                    *_soak_cells(ctx, rel, part, str(d["code_commit"])[:7]),
                    env,
                    _violations(mem),
                    slopes("rss"),
                    slopes("nvml"),
                    slopes("reserved"),
                    "yes" if v["slope_ok"] else f"no (max {v['max_slope_mib_per_h']:g})",
                ]
            )
    header = ["file", "code", "duration (warm-up)", "req/s offered (peak)", "sent", "lost"]
    header += ["failed", "replica env", "budget violations in NVML samples", "RSS slope (MiB/h)"]
    header += ["NVML slope (MiB/h)", "reserved slope (MiB/h)", "every slope under 5 MiB/h"]
    return table(header, body)


def _kill20(ctx: Ctx) -> Mapping[str, Any]:
    rows = load(ctx.results / GPU_FAULT_RUNS[1])["rows"]
    return next(r for r in rows if r["fault"] == "kill20")["detail"]


def r_kill20_oor(ctx: Ctx) -> str:
    return fmt_range((x for x in _kill20(ctx)["out_of_rotation_s"] if x >= 0), 2, " s")


def r_kill20_negative(ctx: Ctx) -> str:
    oor = _kill20(ctx)["out_of_rotation_s"]
    return "; ".join(f"kill {i} of {len(oor)}: {x:g} s" for i, x in enumerate(oor, 1) if x < 0)


RENDERERS: dict[str, tuple[str, Renderer]] = {
    "gpu-faults": (BLOCK, r_gpu_faults),
    "cpu-faults": (BLOCK, r_cpu_faults),
    "kill20-out-of-rotation": (INLINE, r_kill20_oor),
    "kill20-negative": (INLINE, r_kill20_negative),
    "soak-cpu": (BLOCK, r_soak_cpu),
    "soak-h200": (BLOCK, r_soak_h200),
}
