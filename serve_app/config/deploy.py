"""Checks of whole ``serve deploy`` files: Ray Serve's own schema, then each serve_app
application's args and its deployments (shares per GPU, MPS settings, the headroom policy's
kwargs). ``serve-app check`` and ``serve-app run`` report every problem with its field path."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from serve_app import env
from serve_app.config.args import IMPORT_PATH, MPS_VARS, AppArgs, validation_messages
from serve_app.config.shares import share_errors
from serve_app.config.walk import applications
from serve_app.errors import ConfigError

_LIMIT_ENTRY = re.compile(r"^(?P<dev>GPU-[0-9a-fA-F-]+|MIG-[^=]+|\d+)=(?P<num>\d+)(?P<unit>[MG])$")


def check_limit_value(value: str, visible_devices: int = 1) -> list[str]:
    """Problems with a ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` value that the driver would drop
    without a word: a bare number (no ``M``/``G``), or a device index the client cannot see
    (which drops every entry). Empty when the value is sound."""
    problems = []
    for entry in (e.strip() for e in value.split(",")):
        m = _LIMIT_ENTRY.match(entry)
        if m is None:
            problems.append(
                f"{entry!r} is not DEVICE=SIZE with a unit (e.g. 0=4096M or 0=4G); MPS silently "
                "ignores a bare byte count"
            )
            continue
        dev = m.group("dev")
        if dev.isdigit() and int(dev) >= visible_devices:
            problems.append(
                f"{entry!r} names device {dev}, but a replica sees {visible_devices} device(s) "
                "(its own GPU as device 0); MPS drops every limit in the list when one names a "
                "device the client cannot see"
            )
    return problems


def check_deploy_config(doc: Any, gpus: int = 1, gpu_memory_bytes: int | None = None) -> list[str]:
    """Validate a whole ``serve deploy`` document; returns every error with its field path.
    ``gpus``: the GPUs that deployments not pinned to one share (config/shares.py)."""
    errors: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("applications"), list):
        return ["applications: missing; a Serve config needs a list of applications"]
    from ray.serve.schema import ServeDeploySchema

    try:
        ServeDeploySchema.model_validate(doc)
    except ValidationError as exc:
        errors.extend(validation_messages(exc, prefix=""))
    for i, app in enumerate(doc["applications"]):
        if not isinstance(app, dict):
            continue
        if app.get("import_path") != IMPORT_PATH:
            continue
        where = f"applications[{i}]"
        try:
            args = AppArgs.model_validate(app.get("args") or {})
        except ValidationError as exc:
            errors.extend(validation_messages(exc, prefix=f"{where}.args"))
            continue
        errors.extend(_check_deployments(args, app.get("deployments") or [], where))
        if args.memory.budget_bytes is not None:
            from serve_app.config.shares import budget_share_error

            for j, dep in enumerate(app.get("deployments") or [{}]):
                opts = (dep.get("ray_actor_options") or {}) if isinstance(dep, dict) else {}
                # The GPU's memory is not known here: serve_app.plan.derive checks the share.
                path = f"{where}.deployments[{j}]"
                problem = budget_share_error(
                    args.memory.budget_bytes, opts.get("num_gpus"), None, path
                )
                if problem:
                    errors.append(problem)
    if not env.doubles_allowed():
        errors.extend(f"{field}: {TEST_DOUBLE_REFUSAL}" for field in doubles_in_runtime_envs(doc))
    errors.extend(share_errors(doc, gpus))
    return errors


TEST_DOUBLE_REFUSAL = (
    "a test double (serve_app/testing): with it, any API key holder can allocate GPU memory "
    "outside the cap or kill a replica (fault hooks), or the GPU readings are made up "
    f"(scripted NVML); remove it, or set {env.ALLOW_TEST_DOUBLES_VAR}=1 where you check and "
    "deploy a test cluster"
)


def doubles_in_runtime_envs(doc: dict[str, Any]) -> list[str]:
    """The field paths of every test-double variable (env.TEST_DOUBLE_VARS) that a deploy
    file's runtime_envs set, an application's or a deployment's."""
    found: list[str] = []
    for i, app in enumerate(doc.get("applications") or []):
        if not isinstance(app, dict):
            continue
        envs = [(f"applications[{i}].runtime_env", app.get("runtime_env"))]
        for j, dep in enumerate(app.get("deployments") or []):
            opts = dep.get("ray_actor_options") if isinstance(dep, dict) else None
            if isinstance(opts, dict):
                path = f"applications[{i}].deployments[{j}].ray_actor_options.runtime_env"
                envs.append((path, opts.get("runtime_env")))
        for path, runtime_env in envs:
            env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
            if isinstance(env_vars, dict):
                found.extend(f"{path}.env_vars.{v}" for v in env.TEST_DOUBLE_VARS if v in env_vars)
    return found


def doubles_warning(doc: dict[str, Any]) -> str | None:
    """The warning ``serve-app run`` prints when test doubles are on: in its own environment
    (Ray's processes inherit it) or in the deploy file (accepted only under
    SERVE_APP_ALLOW_TEST_DOUBLES=1); None when neither."""
    doubles = env.doubles()
    where = [
        f"{v} in this environment"
        for v, on in (
            (env.FAULT_HOOKS_VAR, doubles.fault_hooks),
            (env.FAKE_NVML_VAR, doubles.nvml_script),
        )
        if on
    ]
    where += doubles_in_runtime_envs(doc)
    if not where:
        return None
    return (
        "WARNING: TEST DOUBLES ARE ON (" + "; ".join(where) + "): replicas may serve "
        "POST /v1/_faults, which lets any API key holder allocate GPU memory outside the cap "
        "or kill a replica, or read made-up GPU memory. Never run this in production."
    )


def _check_deployments(args: AppArgs, deployments: list[Any], where: str) -> list[str]:
    errors: list[str] = []
    for j, dep in enumerate(deployments):
        if not isinstance(dep, dict):
            continue
        path = f"{where}.deployments[{j}]"
        opts = dep.get("ray_actor_options") or {}
        num_gpus = opts.get("num_gpus", 0) or 0
        fraction = args.memory.memory_fraction
        if fraction is not None and num_gpus and fraction > num_gpus:
            errors.append(
                f"{where}.args.memory.memory_fraction: {fraction} is larger than "
                f"{path}.ray_actor_options.num_gpus ({num_gpus}); a replica's cap must fit in "
                "its GPU share: lower memory_fraction or raise num_gpus"
            )
        errors.extend(_check_mps_deployment(args, opts, num_gpus, where, path))
        if isinstance(num_gpus, (int, float)) and num_gpus > 1:
            errors.append(
                f"{path}.ray_actor_options.num_gpus: {num_gpus} is more than one GPU; "
                "serve_app replicas use one GPU or a share of one: use a value in (0, 1]"
            )
        policy = (dep.get("autoscaling_config") or {}).get("policy") or {}
        if isinstance(policy, dict) and str(policy.get("policy_function", "")).startswith(
            "serve_app."
        ):
            from serve_app.control.settings import config_errors, reading_delay_errors

            where_kwargs = f"{path}.autoscaling_config.policy.policy_kwargs"
            problems = config_errors(policy.get("policy_kwargs") or {})
            if not problems:
                problems = reading_delay_errors(dep.get("autoscaling_config") or {})
            for msg in problems:
                # Model-level problems already start with "policy_kwargs"; fields do not.
                rest = (
                    msg.removeprefix("policy_kwargs")
                    if msg.startswith("policy_kwargs")
                    else f".{msg}"
                )
                errors.append(where_kwargs + rest)
    return errors


def _check_mps_deployment(
    args: AppArgs, opts: dict[str, Any], num_gpus: Any, where: str, path: str
) -> list[str]:
    """MPS settings that would fail at start-up, or silently not apply, said at check time."""
    errors: list[str] = []
    enforcement = args.memory.enforcement
    env_vars = ((opts.get("runtime_env") or {}).get("env_vars") or {}) if opts else {}
    if enforcement != "torch" and not num_gpus:
        errors.append(
            f"{where}.args.memory.enforcement: {enforcement} needs a GPU share, but "
            f"{path}.ray_actor_options.num_gpus is not set; set it (e.g. 0.25) or use "
            "enforcement: torch"
        )
    if not isinstance(env_vars, dict):
        return errors
    for var in MPS_VARS:
        if var in env_vars and enforcement != "torch":
            errors.append(
                f"{path}.ray_actor_options.runtime_env.env_vars.{var}: serve_app sets it for "
                f"each replica under enforcement {enforcement} (from num_gpus, memory_fraction "
                "and compute_share); remove it"
            )
    limit = env_vars.get(MPS_VARS[0])
    if limit is not None and enforcement == "torch":
        for problem in check_limit_value(str(limit)):
            errors.append(f"{path}.ray_actor_options.runtime_env.env_vars.{MPS_VARS[0]}: {problem}")
    return errors


def enforcements(doc: dict[str, Any]) -> dict[str, str]:
    """``memory.enforcement`` of each serve_app application in a (checked) deploy config."""
    out: dict[str, str] = {}
    for i, app in applications(doc):
        if app.get("import_path") == IMPORT_PATH:
            args = AppArgs.model_validate(app.get("args") or {})
            out[str(app.get("name", f"applications[{i}]"))] = args.memory.enforcement
    return out


def load_deploy_config(path: str | Path, rayservice: bool = False) -> dict[str, Any]:
    """Read a YAML deploy config; raise ConfigError if it is not valid YAML. ``rayservice``:
    a KubeRay RayService manifest (several documents allowed) gives its ``serveConfigV2``."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}; pass a path such as configs/default.yaml")
    try:
        docs = list(yaml.safe_load_all(p.read_text()))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from None
    services = [d for d in docs if isinstance(d, dict) and d.get("kind") == "RayService"]
    if rayservice and services:
        return embedded_serve_config(p, services)
    if len(docs) != 1:
        raise ConfigError(
            f"{p}: {len(docs)} YAML documents; a Serve config is one"
            + ("" if rayservice else " (serve-app check reads a RayService manifest's)")
        )
    doc = docs[0]
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected a mapping with 'applications', got {type(doc).__name__}")
    return doc


def embedded_serve_config(path: Path, services: list[dict[str, Any]]) -> dict[str, Any]:
    """The Serve config a KubeRay RayService manifest embeds (``spec.serveConfigV2``, a YAML
    string); ConfigError naming the field when there is not exactly one."""
    if len(services) != 1:
        raise ConfigError(f"{path}: {len(services)} RayService documents; check them one by one")
    embedded = (services[0].get("spec") or {}).get("serveConfigV2")
    if not isinstance(embedded, str):
        raise ConfigError(f"{path}: the RayService has no spec.serveConfigV2 (a YAML string)")
    try:
        doc = yaml.safe_load(embedded)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: spec.serveConfigV2 is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: spec.serveConfigV2 must be a mapping with 'applications'")
    return doc
