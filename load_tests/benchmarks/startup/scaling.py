"""The replacement and decision parts, in one cluster of this process: a replica SIGKILLed and
its replacement serving; the headroom policy's scale-up decisions and the new replicas serving
(the package docstring has the clocks)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from load_tests.benchmarks.startup.output import Run
from load_tests.benchmarks.startup.probes import POLL_S, reports, serving
from load_tests.benchmarks.startup.rows import (
    DECISION_LOG_TEXT,
    count_rows,
    expand_ups,
    first_answers,
    make_row,
    parse_decisions,
)
from load_tests.harness.cluster import APP, Target, UpLog, pick_victim, replica_pids, wait_whole
from load_tests.harness.load import Load

DECISION_APP = "startup-decision"
REPLACEMENT_CLIENTS = 4
FIRST_RAMP_GUESS_S = 30.0  # one ramp up and down, before one has been timed
FIRST_KILL_GUESS_S = 20.0  # one kill until whole again, before one has been timed
UP_LAG_S = 3.0

# ---- replacement ---------------------------------------------------------------------------


def up_since(ups: UpLog, known: set[str], since: float, deadline: float) -> list[float]:
    """When replicas not in ``known`` were first seen UP after ``since``; waits for one until
    ``deadline`` (UpLog polls every 0.2 s: the first answer can come before its poll)."""
    while True:
        new = [t for t, r in ups.new_replicas() if r not in known and t > since]
        if new or time.monotonic() > deadline:
            return new
        time.sleep(POLL_S)


def replacement_part(run: Run, target: Target, repeats: int, deadline: float) -> None:
    killed: set[str] = set()
    kill_s = FIRST_KILL_GUESS_S  # then the longest seen
    with Load(target.url, clients=REPLACEMENT_CLIENTS) as load, UpLog(target) as ups:
        for repeat in range(repeats):
            t0 = time.monotonic()
            if wait_whole(target, timeout_s=max(0.0, deadline - t0), exclude=killed) is not None:
                time.sleep(1.0)  # a moment of load on the whole deployment
            victim = pick_victim(target, ups.up(killed), killed)
            if victim is None or deadline - time.monotonic() < kill_s:
                why = "budget" if victim else "no replica UP with a known pid"
                run.skipped.append(f"replacement: repeats {repeat + 1}-{repeats} ({why})")
                return
            rid, pid = victim
            # Every replica that was ever in HAProxy or answered: a new one must be neither.
            known = {r[4] for r in load.snapshot() if r[4]} | ups.initial | killed
            known |= {r for _, r in ups.new_replicas()}
            kill_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            killed.add(rid)
            serving(load, known, 1, deadline)
            answers = [a for a in first_answers(load.snapshot(), known) if a[0] > kill_at]
            new_up = up_since(ups, known, kill_at, min(deadline, time.monotonic() + UP_LAG_S))
            new = answers[0][1] if answers else None
            row_reports = reports(target.base, {new}, deadline) if new else []
            run.add(
                make_row(
                    "replacement",
                    repeat,
                    row_reports,
                    replacement_s=round(answers[0][0] - kill_at, 3) if answers else None,
                    replacement_up_s=round(new_up[0] - kill_at, 3) if new_up else None,
                    victim=rid,
                    note=None if answers else "no new replica answered before the deadline",
                )
            )
            kill_s = max(kill_s, time.monotonic() - t0)


# ---- decision ------------------------------------------------------------------------------


def deployment_counts() -> tuple[int, int]:
    """(target, running) replicas of the decision app's deployment, from Serve's details;
    (-1, -1) when they cannot be read."""
    from serve_app.serving.readiness import deployment_health, serve_details

    try:
        details = serve_details()
    except Exception:  # noqa: BLE001 - a slow controller: the next poll asks again
        return -1, -1
    app = (details.get("applications") or {}).get(DECISION_APP) or {}
    dep = (app.get("deployments") or {}).get("model")
    if not dep:
        return 0, 0
    health = deployment_health(DECISION_APP, "model", dep)
    return health.target, health.running


def settle_at(count: int, deadline: float) -> bool:
    """Wait until the decision app runs exactly ``count`` replicas, its target too."""
    while time.monotonic() < deadline:
        if deployment_counts() == (count, count):
            return True
        time.sleep(0.5)
    return False


def controller_log_lines() -> list[str]:
    """This Ray session's Serve controller log lines that carry the policy's decisions."""
    from serve_app.startup import ray_compat

    session = Path(ray_compat.session_dir() or "/tmp/ray/session_latest")
    lines: list[str] = []
    for path in sorted((session / "logs" / "serve").glob("controller_*.log")):
        with path.open(errors="replace") as f:
            lines += [line for line in f if DECISION_LOG_TEXT in line]
    return lines


def deploy_decision_app(
    args: dict[str, Any], options: dict[str, Any], autoscaling: dict[str, Any]
) -> None:
    """Deploy without waiting (settle_at waits, under the part's deadline)."""
    from ray.serve.api import _run

    from serve_app.config.args import parse_args
    from serve_app.serving.replica import ModelServer

    app = ModelServer.options(  # type: ignore[attr-defined]
        ray_actor_options=options, autoscaling_config=autoscaling
    ).bind(parse_args(args).model_dump())
    _run(app, _blocking=False, name=DECISION_APP, route_prefix=f"/{DECISION_APP}")


def running_ids(base: str) -> set[str]:
    """The replicas answering now: one request's, and every recent memory report's."""
    ids: set[str] = set()
    try:
        resp = httpx.post(f"{base}/v1/embeddings", json={"input": "x"}, timeout=30.0)
        ids.add(resp.headers.get("x-serve-app-replica", ""))
        ids |= set(replica_pids(Target(base, "")))
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return ids - {""}


def decision_ramp(
    run: Run, base: str, ramp: int, max_replicas: int, clients: int, deadline: float, seen: set[str]
) -> None:
    """One ramp from 1 replica to ``max_replicas`` under load; ``seen``: every replica id
    that answered before (a stopping one may still answer), updated."""
    url = f"{base}/v1/embeddings"
    seen |= running_ids(base)
    known = set(seen)
    offset_s = time.time() - time.monotonic()
    ramp_start_s = time.time()
    target_seen: dict[int, float] = {}

    def tick() -> None:
        target_seen.setdefault(deployment_counts()[0], time.time())

    with Load(url, clients=clients) as load:
        serving(load, known, max_replicas - 1, deadline, tick)
        answers = [(t + offset_s, rid) for t, rid in first_answers(load.snapshot(), known)]
        found = reports(base, {rid for _, rid in answers}, min(deadline, time.monotonic() + 10))
    seen.update(rid for _, rid in answers)
    ups = parse_decisions(controller_log_lines(), f"{DECISION_APP}/model", since_s=ramp_start_s)
    source = "controller_log"
    if not ups:
        source = "serve_target"
        ups = [(t, n - 1, n, "target_seen") for n, t in sorted(target_seen.items()) if n > 1]
    by_id = {r["replica_id"]: r for r in found}
    for (decided_s, before, after), (served_s, rid) in zip(expand_ups(ups), answers, strict=False):
        run.add(
            make_row(
                "decision",
                count_rows(run.rows, "decision"),
                [by_id[rid]] if rid in by_id else [],
                decision_to_serving_s=round(served_s - decided_s, 3),
                decision_epoch_s=round(decided_s, 3),
                decision_source=source,
                serve_target_epoch_s=round(target_seen[after], 3) if after in target_seen else None,
                ramp=ramp,
                step=f"{before}->{after}",
                replica_id=rid,
                note=None if served_s > decided_s else "answered before the decision's line",
            )
        )
    if len(answers) < max_replicas - 1:
        last = [line.strip()[-300:] for line in controller_log_lines() if DECISION_APP in line]
        run.skipped.append(
            f"decision: ramp {ramp} reached {1 + len(answers)} of {max_replicas} replicas "
            f"serving before its deadline; the policy's last lines: {last[-3:]}"
        )


def decision_part(
    run: Run,
    target: Target,
    args: dict[str, Any],
    options: dict[str, Any],
    autoscaling: dict[str, Any],
    clients: int,
    repeats: int,
    deadline: float,
) -> None:
    from ray import serve

    serve.delete(APP)  # the replacement part's app: its GPU share goes to this one
    deploy_decision_app(args, options, autoscaling)
    base = f"{target.base.rsplit('/', 1)[0]}/{DECISION_APP}"
    max_replicas = int(autoscaling["max_replicas"])
    ramp_s = FIRST_RAMP_GUESS_S  # then the longest ramp seen
    ramp = 0
    seen: set[str] = set()
    while count_rows(run.rows, "decision") < repeats:
        t0 = time.monotonic()
        if not settle_at(1, deadline) or deadline - time.monotonic() < ramp_s:
            run.skipped.append(f"decision: ramps from {ramp + 1} on (budget)")
            return
        ramp += 1
        decision_ramp(run, base, ramp, max_replicas, clients, deadline, seen)
        ramp_s = max(ramp_s, time.monotonic() - t0)
