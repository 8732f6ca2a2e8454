"""Rows of throughput.json: one per measured (or skipped) setup, built by pure functions.

Setups: ``serve_app`` (the server, via wrk and via the open-loop client), ``ray_serve_noop``
(plain Ray Serve's no-op deployment behind the same HAProxy ingress), the peers
``ray_serve_batch`` (plain Ray Serve with ``@serve.batch``, same ingress) and ``litserve``
(LitServe's own server), ``client_ceiling`` (each client against the static HAProxy no-op) and
``in_process`` (the model alone). Every measured row carries the server's CPU seconds per 1,000
requests (proccpu), and a served row its ratio to the no-op's at the same replica count and
client (``server_cpu_vs_noop``). Rows of text payloads carry ``texts_per_s`` and
``tokens_per_s`` (requests/s x the payload's mean tokens per request, MiniLM's tokenizer), and
a served one its ratio to the in-process ceiling on the same workload in tokens/s
(``vs_ceiling_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HEADROOM_MIN = 3.0  # the client's ceiling must be at least this multiple of what it measured
OPENLOOP_MIN_CEILING_PER_S = 25000.0  # asked of the open-loop client on 16 client cores
SERVED = ("serve_app", "ray_serve_noop", "ray_serve_batch", "litserve")
MODEL_SERVED = ("serve_app", "ray_serve_batch", "litserve")  # read against the model alone
# proccpu's figures, copied from the kept wrk try or open-loop point into its row.
CPU_KEYS: tuple[str, ...] = (
    "server_cpu_s_per_1000_requests",
    "server_cpu_s_per_1000_requests_by_kind",
    "server_cpu_s",
    "server_cpu_s_by_kind",
    "server_processes_by_kind",
    "server_processes_started",
    "server_processes_exited",
    "server_processes_unmeasured",
    "server_processes_unmeasured_kinds",
    "server_cpu_window_s",
    "server_cpu_requests",
    "server_cores_busy",
)
ROW_KEYS: tuple[str, ...] = (
    "setup",
    "model",
    "payload",
    "inputs_per_request",
    "replicas",
    "num_gpus",
    "num_cpus",
    "mps",
    "client",
    "status",
    "requests_per_s",
    "items_per_s",
    "offered_per_s",
    "p50_ms",
    "p90_ms",
    "p99_ms",
    "max_ms",
    "errors",
    "error_counts",
    "requests",
    "connections",
    "threads",
    "duration_s",
    "ceiling_items_per_s",
    "ceiling_batch",
    "vs_ceiling",
    "workload",
    "tokens_per_request",
    "texts_per_s",
    "tokens_per_s",
    "ceiling_tokens_per_s",
    "vs_ceiling_tokens",
    "client_ceiling_requests_per_s",
    "client_headroom",
    "server_cpu_s_per_1000_requests",
    "server_cpu_s_per_1000_requests_by_kind",
    "server_cpu_vs_noop",
    "budget_violations",
    "nvml_samples",
    "peak_process_bytes",
    "budget_bytes",
    "server_cores",
    "client_cores",
    "flags",
    "note",
)


def new_row(**fields: Any) -> dict[str, Any]:
    """A row with every key of ROW_KEYS (None where not given) plus any extra fields."""
    row: dict[str, Any] = dict.fromkeys(ROW_KEYS)
    row["flags"] = []
    row.update(fields)
    return row


def row_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a measurement, for --merge."""
    return (
        row.get("setup"),
        row.get("model"),
        row.get("payload"),
        row.get("replicas"),
        row.get("mps"),
        row.get("client"),
        row.get("workload") or "short",
    )


def _items(requests_per_s: float | None, inputs_per_request: int | None) -> float | None:
    if requests_per_s is None:
        return None
    return requests_per_s * (inputs_per_request or 1)


def _token_rates(row: dict[str, Any]) -> None:
    """``texts_per_s`` and ``tokens_per_s`` of a text payload's row (one with
    ``tokens_per_request``), from its requests/s."""
    per_request, rate = row.get("tokens_per_request"), row.get("requests_per_s")
    if per_request is None or rate is None:
        return
    row["texts_per_s"] = _items(rate, row.get("inputs_per_request"))
    row["tokens_per_s"] = rate * per_request


def wrk_row(common: Mapping[str, Any], tries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The best wrk try (most 2xx/s) as a row; every try is kept under ``tries``."""
    from load_tests.harness.wrk import best_try

    best = best_try(tries)
    row = new_row(**common, client="wrk", tries=[_try_summary(t) for t in tries])
    if best is None:
        errs = "; ".join(str(t.get("error")) for t in tries if t.get("error"))
        row.update(status="error", note=f"no wrk run succeeded: {errs}"[:1500])
        return row
    for key in ("requests_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms", "errors"):
        row[key] = best[key]
    row.update(
        status="ok",
        error_counts=best["error_counts"],
        requests=best["requests"],
        connections=best["connections"],
        threads=best["threads"],
        duration_s=best["duration_s"],
        items_per_s=_items(best["requests_per_s"], common.get("inputs_per_request")),
    )
    row.update({k: best[k] for k in CPU_KEYS if k in best})
    _token_rates(row)
    return row


def _try_summary(t: Mapping[str, Any]) -> dict[str, Any]:
    keys: tuple[str, ...] = (
        "connections",
        "threads",
        "requests_per_s",
        "p50_ms",
        "p99_ms",
        "errors",
        "error",
    )
    keys += ("server_cpu_s_per_1000_requests", "server_cores_busy")
    return {k: t[k] for k in keys if k in t}


def openloop_row(common: Mapping[str, Any], summary: Mapping[str, Any]) -> dict[str, Any]:
    """One open-loop point as a row (latency from the scheduled send time)."""
    row = new_row(**common, client="open-loop")
    for key in ("requests_per_s", "offered_per_s", "p50_ms", "p90_ms", "p99_ms", "max_ms"):
        row[key] = summary.get(key)
    row.update(
        status="ok",
        errors=summary.get("errors"),
        error_counts=summary.get("error_counts"),
        requests=summary.get("requests"),
        connections=summary.get("connections"),
        threads=summary.get("procs"),
        duration_s=summary.get("duration_s"),
        items_per_s=_items(summary.get("requests_per_s"), common.get("inputs_per_request")),
        send_lag_p99_ms=summary.get("send_lag_p99_ms"),
        client_cpu_frac_max=summary.get("client_cpu_frac_max"),
        client_keeps_up=summary.get("client_keeps_up"),
    )
    row.update({k: summary[k] for k in CPU_KEYS if k in summary})
    _token_rates(row)
    if not summary.get("client_keeps_up"):
        row["flags"] = [*row["flags"], "open-loop client fell behind its schedule"]
    return row


def status_row(common: Mapping[str, Any], client: str, status: str, note: str) -> dict[str, Any]:
    """A row for a setup that was skipped (``status="skipped"``) or failed (``"error"``)."""
    return new_row(**common, client=client, status=status, note=note)


def ceiling_row(model: str, doc: Mapping[str, Any], cores: str) -> dict[str, Any]:
    """The in-process ceiling of ``model`` (ceiling.ceiling_worker's result): its best batch by
    items/s, or by tokens/s on the mixed workload (whose batches differ in length)."""
    per_batch = {int(b): float(v) for b, v in (doc.get("items_per_s") or {}).items()}
    tokens = {int(b): float(v) for b, v in (doc.get("tokens_per_s") or {}).items()}
    rank = tokens if doc.get("workload") == "mixed" and tokens else per_batch
    best = max(rank, key=rank.__getitem__) if rank else None
    return new_row(
        setup="in_process",
        model=model,
        status=doc.get("status", "error") if per_batch else "error",
        items_per_s=per_batch[best] if best is not None else None,
        ceiling_items_per_s=per_batch[best] if best is not None else None,
        ceiling_batch=best,
        workload=doc.get("workload", "short"),
        texts_per_s=per_batch[best] if best is not None and tokens else None,
        tokens_per_s=tokens.get(best) if best is not None else None,
        ceiling_tokens_per_s=tokens.get(best) if best is not None else None,
        server_cores=cores,
        items_per_s_by_batch={str(b): round(v, 1) for b, v in sorted(per_batch.items())},
        tokens_per_s_by_batch={str(b): round(v, 1) for b, v in sorted(tokens.items())},
        ceiling_texts=doc.get("texts"),  # the mixed workload's distinct texts it embedded
        note=doc.get("error") or f"{doc.get('dtype', '?')} on {doc.get('device', '?')}, eager",
        peak_process_bytes=doc.get("peak_reserved_bytes"),
    )


def _lookup(rows: Iterable[Mapping[str, Any]], **match: Any) -> Mapping[str, Any] | None:
    """The first measured row with the fields of ``match`` (a row without ``workload``, from
    before it was recorded, is of the short workload)."""

    def get(row: Mapping[str, Any], key: str) -> Any:
        return (row.get(key) or "short") if key == "workload" else row.get(key)

    for row in rows:
        if row.get("status") == "ok" and all(get(row, k) == v for k, v in match.items()):
            return row
    return None


def apply_ceilings(rows: list[dict[str, Any]]) -> list[str]:
    """Fill each served row's model ceiling and client ceiling (same payload, same client),
    the headroom (client ceiling / measured requests/s) and its flags. Returns the run's
    flags: every served row whose client had less than HEADROOM_MIN x headroom, or whose
    client ceiling was not measured."""
    run_flags: list[str] = []
    for row in rows:
        if row.get("setup") not in SERVED or row.get("status") != "ok":
            continue
        workload = row.get("workload") or "short"
        model_row = _lookup(rows, setup="in_process", model=row.get("model"), workload=workload)
        if model_row is not None and row.get("setup") in MODEL_SERVED:
            row["ceiling_items_per_s"] = model_row["ceiling_items_per_s"]
            row["ceiling_batch"] = model_row["ceiling_batch"]
            if row.get("items_per_s") is not None and model_row["ceiling_items_per_s"]:
                row["vs_ceiling"] = row["items_per_s"] / model_row["ceiling_items_per_s"]
            ceiling_tokens = model_row.get("ceiling_tokens_per_s")
            row["ceiling_tokens_per_s"] = ceiling_tokens
            if row.get("tokens_per_s") is not None and ceiling_tokens:
                row["vs_ceiling_tokens"] = row["tokens_per_s"] / ceiling_tokens
        noop = _lookup(
            rows, setup="ray_serve_noop", replicas=row.get("replicas"), client=row.get("client")
        )
        cpu, noop_cpu = row.get("server_cpu_s_per_1000_requests"), None
        if noop is not None and row.get("setup") != "ray_serve_noop":
            noop_cpu = noop.get("server_cpu_s_per_1000_requests")
        row["server_cpu_vs_noop"] = cpu / noop_cpu if cpu is not None and noop_cpu else None
        client = _lookup(
            rows, setup="client_ceiling", payload=row.get("payload"), client=row.get("client")
        )
        ceiling = client.get("requests_per_s") if client else None
        row["client_ceiling_requests_per_s"] = ceiling
        measured = row.get("requests_per_s") or 0.0
        flags = [f for f in row.get("flags") or [] if not f.startswith("client ceiling")]
        if ceiling is None:
            flags.append("client ceiling not measured for this payload")
        else:
            row["client_headroom"] = ceiling / measured if measured > 0 else None
            if measured > 0 and ceiling < HEADROOM_MIN * measured:
                flags.append(f"client ceiling under {HEADROOM_MIN:g}x: the client may be the limit")
        row["flags"] = flags
        model = f" {row['model']}" if row.get("model") else ""
        what = (
            f"{row['setup']}{model} x{row.get('inputs_per_request')} "
            f"at {row.get('replicas')} replicas via {row['client']}"
        )
        if ceiling is None:
            run_flags.append(f"{what}: {measured:,.0f}/s, no client ceiling to compare with")
        elif measured > 0 and ceiling < HEADROOM_MIN * measured:
            run_flags.append(
                f"{what}: {measured:,.0f}/s against a client ceiling of {ceiling:,.0f}/s "
                f"(under {HEADROOM_MIN:g}x)"
            )
    return run_flags


def openloop_ceiling_flags(rows: Iterable[Mapping[str, Any]], client_cores: int) -> list[str]:
    """Flags when the open-loop client's ceiling stayed under 25,000/s on 16 or more cores."""
    out = []
    for row in rows:
        if row.get("setup") != "client_ceiling" or row.get("client") != "open-loop":
            continue
        ceiling = row.get("requests_per_s")
        if client_cores >= 16 and (ceiling or 0.0) < OPENLOOP_MIN_CEILING_PER_S:
            out.append(
                f"open-loop ceiling for {row.get('payload')} is {ceiling or 0:,.0f}/s, under "
                f"{OPENLOOP_MIN_CEILING_PER_S:,.0f}/s on {client_cores} cores"
            )
    return out


def merge_rows(
    previous: Iterable[Mapping[str, Any]], current: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``current`` plus the rows of ``previous`` whose measurement ``current`` lacks (a skipped
    or failed current row gives way to a previous measured one)."""
    measured = {row_key(r) for r in current if r.get("status") == "ok"}
    kept = [dict(r) for r in previous if row_key(r) not in measured and r.get("status") == "ok"]
    kept_keys = {row_key(r) for r in kept}
    fresh = [dict(r) for r in current if r.get("status") == "ok" or row_key(r) not in kept_keys]
    return kept + fresh
