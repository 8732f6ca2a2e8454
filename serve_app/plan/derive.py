"""memory.budget in bytes -> ray_actor_options.num_gpus, written where ``serve deploy`` reads it.

Which GPU a deployment's bytes are a share of (docs/planning.md):

1. pinned by label (``label_selector: {serve-app/gpu: GPU-<uuid>}``): that GPU;
2. pinned by ``ray_actor_options.accelerator_type``: the GPUs of that type, from
   ``--gpu-memory TYPE=BYTES`` (serve_app reads no GPU names; on one host, ``serve-app run``
   uses the host's smallest GPU, the only kind the deployment can land on there);
3. otherwise the smallest GPU in the cluster: NVML's GPUs on this host, or ``--gpu-memory``.

The share is rounded up to Ray's 1/10000, so that the replica's budget (``int(num_gpus x
total)``) is at least the stated bytes. A num_gpus already in the file is kept when it holds the
budget on that GPU, and refused when it does not.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_app.config.args import IMPORT_PATH, AppArgs, parse_bytes
from serve_app.config.shares import PIN_LABEL, booked_share, share_for_budget


@dataclass(frozen=True)
class GpuFacts:
    """What the derivation knows of the GPUs the deployments may land on."""

    smallest_bytes: int | None = None
    by_uuid: dict[str, int] = field(default_factory=dict)
    by_type: dict[str, int] = field(default_factory=dict)
    source: str = "none"

    @property
    def any(self) -> bool:
        return self.smallest_bytes is not None or bool(self.by_uuid) or bool(self.by_type)


def facts_from_flags(specs: list[str]) -> GpuFacts:
    """``--gpu-memory`` values: ``141GiB`` (the smallest GPU), ``H200=141GiB`` (an accelerator
    type), ``GPU-<uuid>=141GiB`` (one GPU). ValueError naming a bad one."""
    smallest, by_uuid, by_type = None, {}, {}
    for spec in specs:
        name, _, size = spec.rpartition("=")
        total = parse_bytes(size)
        if not name:
            smallest = total if smallest is None else min(smallest, total)
        elif name.startswith(("GPU-", "MIG-")):
            by_uuid[name] = total
        else:
            by_type[name] = total
    return GpuFacts(smallest, by_uuid, by_type, "--gpu-memory")


def facts_from_nvml() -> GpuFacts:
    """This host's GPUs through NVML (no torch, no CUDA); none on a CPU-only host."""
    from serve_app.gpu import nvml

    found = nvml.value(nvml.all_devices()) or []
    if not found:
        return GpuFacts(source="NVML: no GPU")
    # The total a replica's share is taken of (torch's total_memory), not NVML's larger total.
    totals = {d.uuid: d.cuda_total_bytes for d in found}
    return GpuFacts(min(totals.values()), totals, {}, f"NVML: {len(found)} GPU(s) on this host")


def has_budgets(doc: dict[str, Any]) -> bool:
    """Whether any serve_app application of ``doc`` states memory.budget (else no NVML read)."""
    for app in doc.get("applications") or []:
        args = app.get("args") if isinstance(app, dict) else None
        memory = args.get("memory") if isinstance(args, dict) else None
        if isinstance(memory, dict) and memory.get("budget") is not None:
            return True
    return False


def for_run(doc: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``serve-app run``: num_gpus derived from memory.budget on this host's GPUs (NVML), or,
    with no GPU, the budgets dropped as num_gpus is (said). ConfigError when one cannot be."""
    from serve_app.errors import ConfigError

    if not has_budgets(doc):
        return doc, []
    facts = facts_from_nvml()
    if not facts.any:
        doc = copy.deepcopy(doc)
        notes = []
        for app in doc.get("applications") or []:
            memory = ((app.get("args") or {}).get("memory") or {}) if isinstance(app, dict) else {}
            if isinstance(memory, dict) and memory.pop("budget", None) is not None:
                notes.append(f"no GPU: {app.get('name')}'s memory.budget is ignored on the CPU")
        return doc, notes
    derived, notes, errors = derive_shares(doc, facts)
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(errors))
    return derived, notes


def target_bytes(opts: dict[str, Any], facts: GpuFacts) -> tuple[int | None, str]:
    """The memory of the GPU a deployment's share is derived from, and which GPU that is."""
    labels = opts.get("label_selector")
    pin = labels.get(PIN_LABEL) if isinstance(labels, dict) else None
    if pin is not None:
        return facts.by_uuid.get(str(pin)), f"GPU {pin} (label {PIN_LABEL})"
    kind = opts.get("accelerator_type")
    if kind is not None:
        if str(kind) in facts.by_type:
            return facts.by_type[str(kind)], f"accelerator_type {kind}"
        if facts.source.startswith("NVML") and facts.smallest_bytes is not None:
            return facts.smallest_bytes, f"accelerator_type {kind}: this host's smallest GPU"
        return None, f"accelerator_type {kind} (pass --gpu-memory {kind}=BYTES)"
    return facts.smallest_bytes, f"the smallest GPU ({facts.source})"


def derive_shares(
    doc: dict[str, Any], facts: GpuFacts
) -> tuple[dict[str, Any], list[str], list[str]]:
    """A copy of ``doc`` with num_gpus derived for each deployment of an application that
    states memory.budget; the notes (what was derived, from which GPU) and the errors."""
    out = copy.deepcopy(doc)
    notes: list[str] = []
    errors: list[str] = []
    for i, app in enumerate(out.get("applications") or []):
        if not isinstance(app, dict) or app.get("import_path") != IMPORT_PATH:
            continue
        try:
            args = AppArgs.model_validate(app.get("args") or {})
        except Exception:  # noqa: BLE001 - check_deploy_config names it
            continue
        budget = args.memory.budget_bytes
        if budget is None:
            continue
        deps = app.setdefault("deployments", []) or [{"name": "model"}]
        app["deployments"] = deps
        for j, dep in enumerate(deps):
            path = f"applications[{i}].deployments[{j}]"
            opts = dep.setdefault("ray_actor_options", {})
            total, which = target_bytes(opts, facts)
            given = opts.get("num_gpus")
            stated = isinstance(given, (int, float)) and not isinstance(given, bool) and given > 0
            if total is None and stated:
                notes.append(
                    f"{path}: num_gpus {given:g} kept; whether it holds memory.budget on "
                    f"{which} is not checked here (pass --gpu-memory)"
                )
                continue
            if total is None:
                errors.append(
                    f"{path}: memory.budget ({budget:,} bytes) needs the memory of {which}, "
                    "which is not known here; pass --gpu-memory BYTES (or TYPE=BYTES, "
                    "GPU-<uuid>=BYTES), or run where NVML sees the GPU"
                )
                continue
            try:
                derived = share_for_budget(budget, total)
            except ValueError as exc:
                errors.append(f"{path}: {which}: {exc}")
                continue
            if stated:
                booked = booked_share(given)  # what Ray gives the replica (it truncates)
                if int(booked * total) < budget:
                    errors.append(
                        f"{path}.ray_actor_options.num_gpus: {given:g} (Ray books {booked:g}) of "
                        f"{which} ({total:,} bytes) holds {int(booked * total):,} bytes, less than "
                        f"memory.budget ({budget:,}); use {derived:g}"
                    )
                continue
            opts["num_gpus"] = derived
            notes.append(
                f"{app.get('name', path)}/{dep.get('name', 'model')}: memory.budget "
                f"{budget:,} bytes of {which}, {total:,} bytes -> num_gpus {derived:g} "
                f"({int(derived * total):,} bytes)"
            )
        need = stored_need_bytes(args)
        where = f"applications[{i}].args.memory.budget"
        if need is None:
            notes.append(
                f"{where}: no calibration cache entry for this model here; whether "
                f"{budget:,} bytes hold its context, weights and smallest input is checked "
                "at start-up"
            )
        elif need[0] > budget:
            errors.append(
                f"{where}: {budget:,} bytes is below what this model needs: {need[0]:,} bytes "
                f"(context, weights and batch {need[1]}, measured at a start-up and kept in "
                "the calibration cache); raise memory.budget"
            )
    return out, notes, errors


def stored_need_bytes(args: AppArgs) -> tuple[int, int] | None:
    """The least peak of the smallest batch any calibration cache entry measured for this
    model (name, path, adapter, weights format, dtype), with that batch; None when none."""
    from serve_app.gpu.calibcache import resolve_dir

    root = resolve_dir(args.memory.calibration_cache_dir)
    if root is None or not root.is_dir():
        return None
    want = {
        "adapter": args.adapter,
        "model_name": args.model_name,
        "model_path": args.model_path,
        "load_format": args.load_format,
        "dtype": args.dtype,
    }
    best: tuple[int, int] | None = None
    for path in sorted(Path(root).glob("*.json"))[:10_000]:
        try:
            doc = json.loads(path.read_text())
            key, probes = doc["key"], doc["result"]["probes"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(key, dict) or any(key.get(k) != v for k, v in want.items()):
            continue
        fitted = [(int(p[1]), int(p[0])) for p in probes if isinstance(p, list) and p[1]]
        if fitted:
            peak, size = min(fitted, key=lambda f: f[1])
            if best is None or peak < best[0]:
                best = (peak, size)
    return best
