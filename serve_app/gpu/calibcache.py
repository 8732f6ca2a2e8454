"""The calibration cache: a replica whose calibration key matches a stored entry starts from it
instead of probing again.

An entry is one JSON file, ``<sha256 of the key>.json``, under ``memory.calibration_cache_dir``
(``auto``: ``$XDG_CACHE_HOME/serve_app/calibration``, else ``~/.cache/serve_app/calibration``;
null or empty: no cache). The key holds everything that decides calibration's answer: the model
(name, path, adapter, architecture, weights format, dtype), the input limits, the batch limit,
the replica's cap and budget, the enforcement, the CUDA graph settings, the GPU's name and total
memory, and the torch, CUDA and serve_app versions.

Nothing read back is trusted blindly: an entry that cannot be read, is not this format, holds
another key, is not owned by this user, or whose figures are out of range (a batch above the
limit, a peak over today's cap once today's non-torch overhead replaces the one measured then) is
ignored with a warning, and the replica measures again and rewrites it. Entries are written to a
temporary file in the same directory and moved into place with ``os.replace``, so a reader (or a
replica writing the same key at the same time) sees a whole entry or none. A replica whose batch
runs out of memory while serving deletes its entry (``invalidate``): the next start measures.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_app import env
from serve_app.config.args import AppArgs
from serve_app.gpu.calibrate import CalibrationResult
from serve_app.gpu.partition import Partition

logger = logging.getLogger("serve_app")

FORMAT = 1
AUTO = "auto"
SUBDIR = ("serve_app", "calibration")


def resolve_dir(setting: str | None) -> Path | None:
    """The cache directory for ``memory.calibration_cache_dir``; None when the cache is off."""
    if setting is None or not setting.strip():
        return None
    if setting.strip() == AUTO:
        xdg = env.get("XDG_CACHE_HOME") or ""
        # XDG: a relative value is invalid and must be ignored.
        root = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
        return root.joinpath(*SUBDIR)
    return Path(setting.strip()).expanduser()


def build_key(**fields: Any) -> dict[str, Any]:
    """A key from JSON scalars (str, int, float, bool, None); sorted, so that equal fields give
    an equal key and an equal file name."""
    for name, value in fields.items():
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"calibration key field {name}: {value!r} is not a JSON scalar")
    return dict(sorted(fields.items()))


def key_file_name(key: dict[str, Any]) -> str:
    canonical = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32] + ".json"


@dataclass(frozen=True)
class CacheEntry:
    """Where one key's entry lives."""

    path: Path
    key: dict[str, Any]

    @classmethod
    def at(cls, directory: Path, key: dict[str, Any]) -> CacheEntry:
        return cls(directory / key_file_name(key), key)


def replica_key(
    args: AppArgs, described: Mapping[str, Any], partition: Partition, limit: int
) -> dict[str, Any]:
    """The key of a replica on a GPU (``partition.budget`` set), for a search up to ``limit``;
    ``described`` is the model backend's ``describe()`` (its token limit in force, its
    architecture)."""
    import torch

    import serve_app
    from serve_app.gpu.graphs import graph_batch_limit

    budget = partition.budget
    assert budget is not None, "calibration runs on a GPU partition"
    return build_key(
        format=FORMAT,
        serve_app_version=serve_app.__version__,
        torch_version=str(torch.__version__),
        cuda_version=torch.version.cuda,
        gpu_name=str(torch.cuda.get_device_name(partition.device)),
        gpu_total_bytes=int(budget.device_total_bytes),
        adapter=args.adapter,
        model_name=args.model_name,
        model_path=args.model_path,
        load_format=args.load_format,
        arch=described.get("arch"),
        dtype=args.dtype,
        max_input_tokens=args.max_input_tokens,
        max_tokens=described.get("max_input_tokens"),  # the limit in force, model's own too
        image_size=args.image_size,
        max_image_pixels=args.max_image_pixels,
        image_decode=args.image_decode,
        max_batch_size=limit,
        cap_bytes=int(budget.cap_bytes),
        budget_bytes=int(budget.budget_bytes),
        enforcement=partition.enforcement,
        cuda_graphs=bool(args.cuda_graphs),
        cuda_graph_max_batch_size=graph_batch_limit(args) if args.cuda_graphs else None,
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_entry(
    doc: Any, key: dict[str, Any], *, cap_bytes: int, overhead_bytes: int, limit: int
) -> tuple[CalibrationResult | None, str]:
    """The result an entry holds, checked against this replica; ``(None, why)`` when it is not
    to be used."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None, "not a calibration entry of this format"
    if doc.get("key") != key:
        return None, "its key does not match this replica's"
    res = doc.get("result")
    if not isinstance(res, dict):
        return None, "no result"
    fields = ("batch_size", "peak_bytes", "budget_bytes", "overhead_bytes")
    if not all(_is_int(res.get(f)) for f in fields):
        return None, "batch_size, peak_bytes, budget_bytes, overhead_bytes must be integers"
    size, peak, budget, then_overhead = (int(res[f]) for f in fields)
    if not 1 <= size <= limit:
        return None, f"batch size {size} outside 1..{limit}"
    if budget != cap_bytes:
        return None, f"measured against {budget} bytes, the cap is {cap_bytes}"
    if not 0 <= then_overhead <= peak <= budget:
        return None, f"peak {peak} or overhead {then_overhead} out of range"
    if peak - then_overhead + overhead_bytes > cap_bytes:
        return None, (
            f"its peak with today's non-torch overhead ({overhead_bytes} bytes, "
            f"{then_overhead} then) would be over the cap"
        )
    fail_size, fail = res.get("first_failure_size"), res.get("first_failure")
    if fail_size is None:
        if fail is not None or size != limit:
            return None, "no failure recorded, but the search stopped below its limit"
    elif not (_is_int(fail_size) and size < fail_size <= limit):
        return None, f"next step {fail_size!r} out of range"
    elif not (fail == "oom" or (isinstance(fail, int) and _is_int(fail) and fail > budget)):
        return None, f"next step's outcome {fail!r} is neither 'oom' nor over the budget"
    probes = res.get("probes", [])
    if not isinstance(probes, list) or not all(
        isinstance(p, list) and len(p) == 2 and _is_int(p[0]) and (p[1] is None or _is_int(p[1]))
        for p in probes
    ):
        return None, "probes malformed"
    result = CalibrationResult(
        batch_size=size,
        peak_bytes=peak,
        budget_bytes=budget,
        first_failure_size=fail_size,
        first_failure=fail,
        probes=tuple((int(p[0]), p[1]) for p in probes),
    )
    return result, "ok"


def load(
    entry: CacheEntry, *, cap_bytes: int, overhead_bytes: int, limit: int
) -> CalibrationResult | None:
    """The entry's result when it exists and holds, else None (logged unless simply absent)."""
    try:
        with open(entry.path, "rb") as f:
            if hasattr(os, "getuid") and os.fstat(f.fileno()).st_uid != os.getuid():
                why = "it belongs to another user"
                doc: Any = None
            else:
                why, doc = "", json.loads(f.read())
    except FileNotFoundError:
        logger.info("calibration cache: no entry at %s; measuring", entry.path)
        return None
    except (OSError, ValueError) as exc:  # unreadable, not JSON, not UTF-8
        why = f"cannot be read ({type(exc).__name__}: {exc})"
        doc = None
    result = None
    if not why:
        result, why = parse_entry(
            doc, entry.key, cap_bytes=cap_bytes, overhead_bytes=overhead_bytes, limit=limit
        )
    if result is None:
        logger.warning("calibration cache: ignoring %s: %s; measuring again", entry.path, why)
    return result


def store(entry: CacheEntry, result: CalibrationResult, overhead_bytes: int) -> bool:
    """Write the entry atomically (temporary file, then ``os.replace``); False, logged, when
    the directory cannot take it."""
    doc = {
        "format": FORMAT,
        "key": entry.key,
        "written_at_s": time.time(),
        "pid": os.getpid(),
        "result": {
            "batch_size": result.batch_size,
            "peak_bytes": result.peak_bytes,
            "budget_bytes": result.budget_bytes,
            "overhead_bytes": overhead_bytes,
            "first_failure_size": result.first_failure_size,
            "first_failure": result.first_failure,
            "probes": [list(p) for p in result.probes],
        },
    }
    tmp: str | None = None
    try:
        entry.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=entry.path.parent, prefix=f".{entry.path.stem}.", suffix=".tmp"
        )
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, entry.path)
        tmp = None
    except OSError as exc:
        logger.warning("calibration cache: cannot write %s (%s); not cached", entry.path, exc)
        return False
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    logger.info("calibration cache: wrote %s (batch %d)", entry.path, result.batch_size)
    return True


def invalidate(entry: CacheEntry, why: str) -> bool:
    """Delete the entry, so that the next replica with this key measures; True when one was."""
    try:
        entry.path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("calibration cache: cannot delete %s (%s)", entry.path, exc)
        return False
    logger.warning("calibration cache: deleted %s: %s", entry.path, why)
    return True
