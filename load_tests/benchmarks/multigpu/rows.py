"""Pure functions of load_tests.benchmarks.multigpu: the time each part gets, placement per GPU
UUID, answers split by the GPU that served them, the grab timeline's samples and verdict, and the
two-GPU speedup. No I/O, no Ray.

Load results are harness.load.Load's tuples: (send time s, seconds taken, status or error text,
content type, the replica that answered from ``x-serve-app-replica`` or "").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from load_tests.harness.load import Result, classify
from load_tests.harness.nvml import budget_violations

UNATTRIBUTED = "unattributed"  # an answer with no replica header, or from an unknown replica
SPEEDUP_WANTED = 1.9  # issue #14: two GPUs against one at 64 texts per request


def allot_s(left_s: float, weights: Mapping[str, float], part: str, min_s: float = 0.0) -> float:
    """``part``'s share of the ``left_s`` seconds among the parts still to run (``weights``
    holds them, ``part`` included), so that what an earlier part left unused goes to the later
    ones; raised to ``min_s`` while ``left_s`` holds it (the earlier part is worth more)."""
    total = sum(weights.values())
    if left_s <= 0 or total <= 0:
        return 0.0
    return min(left_s, max(left_s * weights[part] / total, min_s))


def replica_gpus(replicas: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Replica id -> GPU UUID, from ``GET /v1/memory``'s ``replicas`` (CPU replicas left out)."""
    return {
        str(r["replica_id"]): str(r["gpu_uuid"])
        for r in replicas
        if r.get("replica_id") and r.get("gpu_uuid")
    }


def placement_rows(
    memory_doc: Mapping[str, Any], samples: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per GPU UUID of ``/v1/memory``: its replicas, the sum of their budgets against
    the GPU's total, and NVML's per-process bytes (``samples``: MemorySampler's) against each
    replica's budget. NVML figures are None where no sample was judged (no NVML: the CPU)."""
    replicas = [r for r in memory_doc.get("replicas") or [] if r.get("gpu_uuid")]
    gpus = {str(g["uuid"]): g for g in memory_doc.get("gpus") or [] if g.get("uuid")}
    out = []
    for uuid in sorted({str(r["gpu_uuid"]) for r in replicas} | set(gpus)):
        mine = sorted(
            (r for r in replicas if r["gpu_uuid"] == uuid), key=lambda r: str(r["replica_id"])
        )
        budgets = {int(r["pid"]): int(r["budget_bytes"]) for r in mine if r.get("budget_bytes")}
        on_gpu = [s for s in samples if s.get("gpu_uuid") == uuid]
        judged = budget_violations(on_gpu, budgets)
        seen = judged["nvml_samples_judged"] > 0
        total = gpus.get(uuid, {}).get("total_bytes")
        budgets_sum = sum(budgets.values())
        out.append(
            {
                "gpu_uuid": uuid,
                "node_id": gpus.get(uuid, {}).get("node_id")
                or next((r.get("node_id") for r in mine), None),
                "replicas": [str(r["replica_id"]) for r in mine],
                "replica_count": len(mine),
                "num_gpus_sum": round(sum(float(r.get("num_gpus") or 0.0) for r in mine), 6),
                "budgets_bytes": budgets_sum,
                "total_bytes": total,
                "budgets_within_total": None if total is None else budgets_sum <= int(total),
                "nvml_samples": judged["nvml_samples_judged"] if seen else None,
                "budget_violations": judged["budget_violations"] if seen else None,
                "replica_detail": [
                    {
                        "replica_id": str(r["replica_id"]),
                        "pid": r.get("pid"),
                        "budget_bytes": r.get("budget_bytes"),
                        "nvml_peak_bytes": judged["peak_bytes"].get(int(r["pid"])),
                        "over_budget": None
                        if judged["peak_bytes"].get(int(r["pid"])) is None
                        else judged["peak_bytes"][int(r["pid"])] > int(r["budget_bytes"] or 0),
                    }
                    for r in mine
                    if r.get("pid") is not None
                ],
            }
        )
    return out


def answers_by_gpu(
    results: Iterable[Result], gpu_of: Mapping[str, str], t0_s: float, t1_s: float
) -> dict[str, dict[str, int]]:
    """ok / failed / lost answers completed in [t0_s, t1_s), by the GPU of the replica that
    answered (``UNATTRIBUTED`` when there is no replica header or its GPU is unknown)."""
    out: dict[str, dict[str, int]] = {}
    for sent_s, took_s, status, ctype, replica in results:
        if not t0_s <= sent_s + took_s < t1_s:
            continue
        key = gpu_of.get(replica, UNATTRIBUTED) if replica else UNATTRIBUTED
        counts = out.setdefault(key, {"ok": 0, "failed": 0, "lost": 0})
        counts[classify(status, ctype)] += 1
    return out


def grab_sample(
    *,
    t_s: float,
    dt_s: float,
    phase: str | None,
    running_by_gpu: Mapping[str, int],
    target_by_gpu: Mapping[str, int | None],
    reason_by_gpu: Mapping[str, str | None],
    free_by_gpu: Mapping[str, int],
    by_app: Mapping[str, Mapping[str, int]],
    by_answering_gpu: Mapping[str, Mapping[str, int]],
    answered_elsewhere: int = 0,
) -> dict[str, Any]:
    """One sample of the grab timeline; ``by_app``: counts of the requests sent to each GPU's
    application (ok/failed/lost), ``by_answering_gpu``: the same answers by who served them,
    ``answered_elsewhere``: answers of a GPU's application from a replica on another GPU (the
    pinning failed). The keys load_tests.harness.plots draws are filled as totals, and per
    GPU beside them."""
    dt = max(dt_s, 1e-3)
    errors = {u: c.get("failed", 0) + c.get("lost", 0) for u, c in by_app.items()}
    ok = {u: c.get("ok", 0) for u, c in by_app.items()}
    targets = [t for t in target_by_gpu.values() if t is not None]
    return {
        "t_s": round(t_s, 2),
        "phase": phase,
        "replicas_running": sum(running_by_gpu.values()),
        "controller_target": sum(targets) if targets else None,
        "replicas_by_gpu": dict(running_by_gpu),
        "controller_target_by_gpu": dict(target_by_gpu),
        "controller_reason_by_gpu": dict(reason_by_gpu),
        "gpu_free_bytes": dict(free_by_gpu),
        "offered_rps": round((sum(ok.values()) + sum(errors.values())) / dt, 1),
        "ok_rps": round(sum(ok.values()) / dt, 1),
        "errors_per_s": round(sum(errors.values()) / dt, 1),
        "ok_per_s_by_gpu": {u: round(n / dt, 1) for u, n in ok.items()},
        "errors_by_gpu": errors,
        "errors_per_s_by_gpu": {u: round(n / dt, 1) for u, n in errors.items()},
        "answers_by_answering_gpu": {u: dict(c) for u, c in by_answering_gpu.items()},
        "answered_elsewhere": answered_elsewhere,
    }


def grab_verdict(
    samples: Sequence[Mapping[str, Any]],
    grabbed: str,
    spared: str,
    from_phase: str = "steady",
    grab_phase: str = "grab",
) -> dict[str, Any]:
    """What the grab timeline shows: the replicas each GPU ran when the grab began and the
    fewest after, the errors of each GPU's application and answers served from the other GPU
    (from ``from_phase`` on), whether a shed decision was sampled, and the issue's expectation:
    the grabbed GPU lost replicas, the spared one none, and the spared one had 0 errors."""
    phases = [s.get("phase") for s in samples]
    judged = samples[phases.index(from_phase) :] if from_phase in phases else []
    after = samples[phases.index(grab_phase) :] if grab_phase in phases else []
    at_grab = dict(after[0]["replicas_by_gpu"]) if after else {}

    def fewest(uuid: str) -> int | None:
        seen = [s["replicas_by_gpu"][uuid] for s in after if uuid in s["replicas_by_gpu"]]
        return min(seen) if seen else None

    def errors(uuid: str) -> int:
        return sum(int(s["errors_by_gpu"].get(uuid, 0)) for s in judged)

    low = {grabbed: fewest(grabbed), spared: fewest(spared)}
    start = {grabbed: at_grab.get(grabbed), spared: at_grab.get(spared)}
    g0, g1, s0, s1 = start[grabbed], low[grabbed], start[spared], low[spared]
    shed = g0 is not None and g1 is not None and g1 < g0
    kept = s0 is not None and s1 is not None and s1 >= s0
    return {
        "samples_judged": len(judged),
        "replicas_at_grab": start,
        "fewest_replicas_after_grab": low,
        "errors_by_gpu": {grabbed: errors(grabbed), spared: errors(spared)},
        "answers_from_other_gpus": sum(int(s.get("answered_elsewhere", 0)) for s in judged),
        "shed_decision_seen": any(
            s.get("controller_reason_by_gpu", {}).get(grabbed) == "shed_memory_pressure"
            for s in after
        ),
        "only_grabbed_gpu_shed": shed and kept,
        "spared_gpu_errors_zero": bool(judged) and errors(spared) == 0,
    }


def transitions(samples: Sequence[Mapping[str, Any]], limit: int = 80) -> list[dict[str, Any]]:
    """The samples where a GPU's running replicas, controller target or reason changed (the
    first ``limit``), with each GPU's free GiB then: the timeline in a few lines."""
    keys = ("replicas_by_gpu", "controller_target_by_gpu", "controller_reason_by_gpu")
    out: list[dict[str, Any]] = []
    last: tuple[Any, ...] | None = None
    for s in samples:
        now = tuple(tuple(sorted((s.get(k) or {}).items())) for k in keys)
        if now == last:
            continue
        last = now
        free = {u: round(b / (1 << 30), 2) for u, b in (s.get("gpu_free_bytes") or {}).items()}
        out.append({"t_s": s.get("t_s"), "phase": s.get("phase")} | {k: s.get(k) for k in keys})
        out[-1]["gpu_free_gib"] = free
        if len(out) >= limit:
            break
    return out


def speedup(
    rows: Sequence[Mapping[str, Any]], one_gpu_replicas: int, two_gpu_replicas: int
) -> list[dict[str, Any]]:
    """Texts/s on two GPUs against one, per inputs per request, from throughput.json's wrk rows
    of serve_app (the closed-loop maximum); None where a side was not measured."""
    best: dict[tuple[int, int], Mapping[str, Any]] = {}
    for r in rows:
        if r.get("setup") != "serve_app" or r.get("client") != "wrk" or r.get("status") != "ok":
            continue
        if r.get("items_per_s") is None or r.get("inputs_per_request") is None:
            continue
        best[(int(r["replicas"]), int(r["inputs_per_request"]))] = r
    per_request = sorted(
        {int(r["inputs_per_request"]) for r in rows if r.get("setup") == "serve_app"},
        reverse=True,
    )
    out = []
    for n in per_request:
        one_row, two_row = best.get((one_gpu_replicas, n)), best.get((two_gpu_replicas, n))
        one = float(one_row["items_per_s"]) if one_row else None
        two = float(two_row["items_per_s"]) if two_row else None
        ratio = round(two / one, 3) if one and two is not None else None
        out.append(
            {
                "inputs_per_request": n,
                "one_gpu_replicas": one_gpu_replicas,
                "two_gpu_replicas": two_gpu_replicas,
                "one_gpu_texts_per_s": None if one is None else round(one, 1),
                "two_gpu_texts_per_s": None if two is None else round(two, 1),
                "speedup": ratio,
                "wanted": SPEEDUP_WANTED if n > 1 else None,
                # wrk's own ceiling against the no-op over what it measured on two GPUs (filled
                # once the clients' ceiling is measured): under 3 the client may be the limit
                "two_gpu_client_headroom": two_row.get("client_headroom") if two_row else None,
            }
        )
    return out


def violations_total(rows: Sequence[Mapping[str, Any]]) -> dict[str, int | None]:
    """Budget violations and NVML samples over the serve_app rows that were judged (None when
    none was: no NVML)."""
    judged = [r for r in rows if r.get("setup") == "serve_app" and r.get("nvml_samples")]
    if not judged:
        return {"budget_violations": None, "nvml_samples": None}
    return {
        "budget_violations": sum(int(r.get("budget_violations") or 0) for r in judged),
        "nvml_samples": sum(int(r["nvml_samples"]) for r in judged),
    }


def replicas_per_gpu(reports: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """How many of a job's replicas sat on each GPU (its server report; "cpu" for none)."""
    out: dict[str, int] = {}
    for r in reports:
        if "replica_id" not in r:
            continue
        key = str(r.get("gpu_uuid") or "cpu")
        out[key] = out.get(key, 0) + 1
    return out


def layout_check(by_job: Mapping[str, Mapping[str, int]], per_gpu: int) -> dict[str, bool | None]:
    """Whether the throughput jobs had the layout compared: ``per_gpu`` replicas all on one
    GPU, and twice that as ``per_gpu`` on each of two (None when a job has no report)."""
    one = by_job.get(f"minilm/r{per_gpu}")
    two = by_job.get(f"minilm/r{2 * per_gpu}")
    return {
        "one_gpu": None if not one else list(one.values()) == [per_gpu] and "cpu" not in one,
        "two_gpus": None
        if not two
        else sorted(two.values()) == [per_gpu, per_gpu] and "cpu" not in two,
    }
