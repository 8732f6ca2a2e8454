"""Pure functions of the stack benchmark: the families a deploy config serves and where, the
request each family is loaded with, the CPU ``--quick`` variant of the config, and the verdict
(p99 with neighbours over p99 alone, throughput beside the in-process ceiling, budget
violations, errors)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from serve_app.config.args import IMPORT_PATH
from serve_app.serving.index import public_route

P99_RATIO_MAX = 1.25  # issue 26: each family's p99 with its neighbours flat out <= 1.25x alone
# Routes of the families whose wire specs merge from other branches (issue 26), by name: the
# benchmark loads them when serve_app knows them (serve_app.adapters.ROUTES wins).
KNOWN_ROUTES = {
    "embeddings": "/v1/embeddings",
    "image-classification": "/v1/classify",
    "rerank": "/v1/rerank",
    "text-classification": "/predict",
}
DEFAULT_NAMES = {"embeddings": "all-MiniLM-L6-v2"}
QUERY = "which of these passages says how the memory budget of a replica is enforced?"


@dataclass(frozen=True)
class Family:
    """One application of the config as the benchmark loads it."""

    application: str
    adapter: str
    model: str
    route: str  # the public path on the base URL
    app_args: dict[str, Any]
    torch_threads: int = 1  # as a replica has them: Ray's OMP_NUM_THREADS, its num_cpus


def families(doc: Mapping[str, Any], served: Mapping[str, str] | None = None) -> list[Family]:
    """The serve_app applications of ``doc`` with a route; ``served``: adapter -> route of the
    families serve_app knows (default: KNOWN_ROUTES)."""
    routes = dict(KNOWN_ROUTES if served is None else served)
    out = []
    for app in doc.get("applications") or []:
        if app.get("import_path") != IMPORT_PATH:
            continue
        args = dict(app.get("args") or {})
        adapter = str(args.get("adapter", "embeddings"))
        if adapter not in routes:
            continue
        route = public_route(app.get("route_prefix", "/"), routes[adapter])
        if route is None:
            continue
        default = args.get("arch", "resnet50") if adapter == "image-classification" else None
        model = str(args.get("model_name") or default or DEFAULT_NAMES.get(adapter, adapter))
        deps = app.get("deployments") or [{}]
        cpus = ((deps[0] or {}).get("ray_actor_options") or {}).get("num_cpus", 1)
        threads = max(1, int(cpus)) if isinstance(cpus, (int, float)) else 1
        out.append(Family(str(app["name"]), adapter, model, route, args, threads))
    return out


@dataclass(frozen=True)
class Request:
    body: bytes
    content_type: str
    items: int  # batch items the request carries (texts, query-document pairs, images)


def request_for(family: Family, items: int, image_size: int = 224) -> Request:
    """The one request wrk repeats on ``family``'s route: ``items`` short texts (documents for
    the reranker), or one JPEG."""
    from load_tests import payloads

    texts = payloads.texts("short", items, seed=26)
    body: dict[str, Any]
    if family.adapter == "image-classification":
        blob = payloads.image_bytes(image_size, "jpeg", seed=26)
        return Request(blob, "image/jpeg", 1)
    if family.adapter == "embeddings":
        body = {"model": family.model, "input": texts}
    elif family.adapter == "rerank":  # Cohere/Jina shape: each pair is one batch item
        body = {"model": family.model, "query": QUERY, "documents": texts}
    elif family.adapter == "text-classification":  # TEI's /predict: a batch of sequences
        body = {"inputs": [[t] for t in texts]}
    else:
        raise ValueError(f"no request for adapter {family.adapter!r}")
    return Request(json.dumps(body).encode(), "application/json", items)


def quick_config(
    doc: Mapping[str, Any], known: Sequence[str], port: int
) -> tuple[dict[str, Any], list[str]]:
    """``doc`` for a CPU run in seconds: one replica per application with no GPU share, small
    batches, no warm workers, ResNet-18 at 64 px for images; applications whose family serve_app
    does not know yet are dropped (and named in the notes)."""
    out = copy.deepcopy(dict(doc))
    notes = []
    apps = []
    for app in out.get("applications") or []:
        args = app.setdefault("args", {})
        adapter = args.get("adapter", "embeddings")
        if app.get("import_path") == IMPORT_PATH and adapter not in known:
            notes.append(f"{app['name']}: adapter {adapter!r} is not in this checkout; left out")
            continue
        args.update(device="cpu", max_batch_size=8, warm_workers=0, dtype="float32")
        if adapter == "image-classification":
            args.update(arch="resnet18", image_size=64, load_format="dummy")
            args.pop("model_name", None)
        for dep in app.get("deployments") or []:
            dep["num_replicas"] = 1
            dep.pop("autoscaling_config", None)
            dep["ray_actor_options"] = {"num_cpus": 0.25}
        apps.append(app)
    out["applications"] = apps
    out["http_options"] = {**(out.get("http_options") or {}), "host": "127.0.0.1", "port": port}
    return out, notes


def with_port(doc: Mapping[str, Any], port: int) -> dict[str, Any]:
    out = copy.deepcopy(dict(doc))
    out["http_options"] = {**(out.get("http_options") or {}), "host": "127.0.0.1", "port": port}
    return out


def items_per_s(run: Mapping[str, Any] | None, items: int) -> float | None:
    if not run or run.get("requests_per_s") is None:
        return None
    return float(run["requests_per_s"]) * items


def family_row(
    family: Family,
    request: Request,
    alone: Mapping[str, Any] | None,
    mixed: Mapping[str, Any] | None,
    ceiling: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One family's figures: wrk alone and with its neighbours, the p99 ratio and its verdict,
    items/s in both beside the in-process ceiling (best batch)."""
    p99_alone = (alone or {}).get("p99_ms")
    p99_mixed = (mixed or {}).get("p99_ms")
    ratio = p99_mixed / p99_alone if p99_alone and p99_mixed is not None else None
    best = (ceiling or {}).get("items_per_s_max")
    rate_alone = items_per_s(alone, request.items)
    rate_mixed = items_per_s(mixed, request.items)
    return {
        **{k: v for k, v in asdict(family).items() if k not in ("app_args", "torch_threads")},
        "items_per_request": request.items,
        "body_bytes": len(request.body),
        "alone": dict(alone or {}),
        "mixed": dict(mixed or {}),
        "p99_alone_ms": p99_alone,
        "p99_mixed_ms": p99_mixed,
        "p99_ratio": round(ratio, 3) if ratio is not None else None,
        "p99_ok": ratio is not None and ratio <= P99_RATIO_MAX,
        "items_per_s_alone": rate_alone,
        "items_per_s_mixed": rate_mixed,
        "ceiling_items_per_s": best,
        "ceiling_batch": (ceiling or {}).get("best_batch"),
        "alone_of_ceiling": rate_alone / best if rate_alone is not None and best else None,
        "mixed_of_ceiling": rate_mixed / best if rate_mixed is not None and best else None,
        "errors": int((alone or {}).get("errors", 0)) + int((mixed or {}).get("errors", 0)),
        "failed": [k for k, r in (("alone", alone), ("mixed", mixed)) if not r or "error" in r],
    }


def verdict(
    rows: Sequence[Mapping[str, Any]], budget: Mapping[str, Any], on_gpu: bool
) -> dict[str, Any]:
    """The criteria of issue 26's proof over the family rows and the budget watch (on a GPU,
    a watch that judged no NVML sample proves nothing and fails)."""
    violations = budget.get("budget_violations")
    judged = int(budget.get("nvml_samples_judged") or 0)
    errors = sum(int(r["errors"]) for r in rows)
    failed = [f"{r['application']} {k}" for r in rows for k in r["failed"]]
    out = {
        "p99_ratio_max": P99_RATIO_MAX,
        "p99_ok": bool(rows) and all(r["p99_ok"] for r in rows),
        "budget_violations": violations,
        "nvml_samples_judged": budget.get("nvml_samples_judged"),
        "budget_ok": violations == 0 and (judged > 0 or not on_gpu),
        "errors": errors,
        "errors_ok": errors == 0 and not failed,
        "failed_runs": failed,
    }
    out["all_ok"] = out["p99_ok"] and out["budget_ok"] and out["errors_ok"]
    return out
