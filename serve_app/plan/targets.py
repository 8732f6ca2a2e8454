"""What ``serve-app plan --measure`` is asked to plan for (the targets file), the batch caps it
measures at, and the request it drives each application with. Pure: no Ray, no GPU.

The targets file (JSON or YAML, docs/planning.md) holds what a measurement cannot give: each
application's p99 target, its load or weight, its replica bounds, and the reserve per GPU. It is
a file beside the config, not a section of the serve_app args, so that one config can be planned
for several loads, and so that the args every replica validates stay as they are.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve_app.config.args import IMPORT_PATH, AppArgs, parse_args, validation_messages
from serve_app.errors import ConfigError
from serve_app.gpu.calibrate import candidate_sizes
from serve_app.plan.measurements import MAX_UTILIZATION, UTILIZATION_HELP, ReserveSpec

# Texts a request carries by default: the committed MiniLM throughputs the example measurements
# cite were measured at 16 short texts a request (docs/planning.md, The proof).
DEFAULT_TEXTS_PER_REQUEST = 16
RERANK_QUERY = "which of these describes a replica of a model server"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelTarget(_Strict):
    p99_target_s: float = Field(gt=0, le=600)
    load_rps: float | None = Field(default=None, gt=0, description="stated load; null: weight")
    weight: float = Field(default=1.0, gt=0)
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=16, ge=1, le=256)
    items_per_request: int | None = Field(
        default=None, ge=1, le=4096, description="texts (or images) a request carries"
    )
    request: dict[str, Any] | None = Field(
        default=None, description="the JSON body to send instead of the built-in one"
    )


class Targets(_Strict):
    format: Literal[1] = 1
    margin_fraction: float = Field(default=0.1, ge=0, le=1)
    max_utilization: float = Field(
        default=MAX_UTILIZATION, gt=0, le=1, description=UTILIZATION_HELP
    )
    reserve: ReserveSpec = Field(default_factory=ReserveSpec)
    models: dict[str, ModelTarget] = Field(min_length=1, description="application -> target")


def load_targets(path: str | Path) -> Targets:
    """Read and validate a targets file (JSON, or YAML); ConfigError naming each bad field."""
    import yaml

    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())  # JSON is YAML
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"{p}: cannot read the targets ({exc})") from None
    try:
        return Targets.model_validate(raw)
    except ValidationError as exc:
        lines = validation_messages(exc, prefix="")
        raise ConfigError(f"{p}: invalid targets:\n  " + "\n  ".join(lines)) from None


def serve_app_apps(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The config's serve_app applications by name, in order."""
    apps = [a for a in doc.get("applications") or [] if isinstance(a, dict)]
    return {str(a.get("name")): a for a in apps if a.get("import_path") == IMPORT_PATH}


def check_targets(doc: dict[str, Any], targets: Targets) -> list[str]:
    """Every serve_app application of the config has a target and every target an
    application; a model needing a body the measurer cannot make has one. The errors."""
    apps = serve_app_apps(doc)
    errors = []
    for name in sorted(set(apps) - set(targets.models)):
        errors.append(f"application {name}: no target; add models.{name} to the targets file")
    for name in sorted(set(targets.models) - set(apps)):
        errors.append(f"targets models.{name}: no serve_app application of that name")
    for name in sorted(set(apps) & set(targets.models)):
        args = parse_args(apps[name].get("args"), prefix=f"{name}.args")
        if targets.models[name].request is None and builtin_kind(args) is None:
            errors.append(
                f"application {name}: a user model on the json wire takes inputs only it "
                f"knows; give models.{name}.request, the JSON body to send"
            )
    return errors


def batch_cap(args: AppArgs, on_gpu: bool) -> int:
    """The largest batch cap measured: ``max_batch_size``, else what calibration searches up
    to on a GPU (``memory.calibration_max_batch_size``) or the CPU default (32); on a GPU
    never above ``calibration_max_batch_size``, where calibration stops."""
    from serve_app.startup.calibration import CPU_DEFAULT_BATCH

    if not on_gpu:
        return args.max_batch_size or CPU_DEFAULT_BATCH
    limit = args.memory.calibration_max_batch_size
    return min(args.max_batch_size or limit, limit)


def candidate_batch_sizes(cap: int, count: int) -> list[int]:
    """The batch caps measured: the ``count`` largest of the sizes calibration probes up to
    ``cap`` (1 doubled while below it, then the cap itself), so that each has a measured peak.
    ``(256, 3) -> [64, 128, 256]``; ``(24, 3) -> [8, 16, 24]``; ``(2, 3) -> [1, 2]``."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    return candidate_sizes(1, cap)[-count:]


def builtin_kind(args: AppArgs) -> str | None:
    """Which built-in request the measurer sends: the family, or a user model's built-in wire
    (embeddings, rerank, predict); None for a user model on the json wire."""
    from serve_app.config.args import is_import_path

    if not is_import_path(args.adapter):
        return args.adapter
    wire = args.wire or "json"
    return {"embeddings": "embeddings", "rerank": "rerank", "predict": "text-classification"}.get(
        wire
    )


def texts(count: int) -> list[str]:
    """``count`` short, distinct texts (a few words each, as search queries are)."""
    words = "model replica budget memory batch token cluster query answer vector".split()
    return [" ".join(words[(i + j) % len(words)] for j in range(4 + i % 5)) for i in range(count)]


def jpeg_bytes(size: int) -> bytes:
    """A ``size`` x ``size`` JPEG of seeded noise (a photo's worth of entropy to decode)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(27).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def request_for(args: AppArgs, target: ModelTarget) -> tuple[bytes, str, int]:
    """The request one application is driven with: (body, content type, items)."""
    if target.request is not None:
        items = target.items_per_request or 1
        return json.dumps(target.request).encode(), "application/json", items
    kind = builtin_kind(args)
    if kind == "image-classification":
        return jpeg_bytes(args.image_size), "image/jpeg", 1
    n = target.items_per_request or DEFAULT_TEXTS_PER_REQUEST
    body: dict[str, Any]
    if kind == "embeddings":
        body = {"model": args.model_name, "input": texts(n)}
    elif kind == "rerank":
        body = {"model": args.model_name, "query": RERANK_QUERY, "documents": texts(n)}
    elif kind == "text-classification":
        body = {"inputs": [[t] for t in texts(n)]}
    else:
        raise ConfigError(f"no built-in request for adapter {args.adapter!r}; set request")
    return json.dumps(body).encode(), "application/json", n


def measured_mode(doc: dict[str, Any]) -> tuple[str, list[str]]:
    """``mps`` when every application's memory.enforcement runs it under MPS, ``time-sliced``
    when none does; a mix is an error (the measurements file states one mode)."""
    from serve_app.config.deploy import enforcements
    from serve_app.gpu import mps

    uses = {name: mps.uses_mps(e) for name, e in enforcements(doc).items()}
    if uses and all(uses.values()):
        return "mps", []
    if any(uses.values()):
        on = sorted(n for n, u in uses.items() if u)
        return "time-sliced", [
            f"applications {on} set memory.enforcement mps and the others do not: a measurements "
            "file states one mode; set the same enforcement on every application"
        ]
    return "time-sliced", []
