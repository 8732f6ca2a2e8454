"""Start-up's batch cap: calibrated on a GPU (the largest worst-case batch that fits the cap,
serve_app.gpu.calibrate), from the calibration cache when it holds a valid entry for this
replica's key (serve_app.gpu.calibcache); else ``max_batch_size`` or CPU_DEFAULT_BATCH.

A backend with ``calibrates = False`` (a user model without ``example_inputs``: no worst-case
inputs to measure) is not calibrated; on a GPU it then needs ``max_batch_size``
(``check_batch_cap_source``, before its weights load)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from serve_app.adapters.contract import ModelBackend
from serve_app.config.args import AppArgs
from serve_app.errors import ConfigError
from serve_app.gpu import calibcache
from serve_app.gpu.budget import format_bytes
from serve_app.gpu.calibrate import CalibrationResult, find_max_batch
from serve_app.gpu.partition import Partition
from serve_app.startup.warmup import run_fits

logger = logging.getLogger("serve_app")
CPU_DEFAULT_BATCH = 32


@dataclass(frozen=True)
class BatchCap:
    """The batch cap a replica starts serving with, and where it came from.

    Attributes:
        batch_cap: the largest batch to run.
        calibration: the calibration result (measured or from the cache), or None.
        source: ``"measured"``, ``"cache"``, or None without calibration.
        entry: the cache entry the result came from or went to (to invalidate it on the first
            out-of-memory batch), or None.
    """

    batch_cap: int
    calibration: CalibrationResult | None = None
    source: Literal["measured", "cache"] | None = None
    entry: calibcache.CacheEntry | None = None


def calibrates(backend: ModelBackend) -> bool:
    """Whether the backend has worst-case items to calibrate with (every family's has; a user
    model's only with ``example_inputs``)."""
    return bool(getattr(backend, "calibrates", True))


def check_batch_cap_source(args: AppArgs, backend: ModelBackend, partition: Partition) -> None:
    """Fail fast, before the weights load, when a GPU replica would have no batch cap: its
    backend cannot calibrate and ``max_batch_size`` is unset.

    Raises:
        ConfigError: naming ``args.max_batch_size`` and the two fixes.
    """
    if partition.on_gpu and args.memory.calibrate and args.max_batch_size is None:
        if not calibrates(backend):
            describe = backend.describe()
            raise ConfigError(
                f"args.max_batch_size: {describe.get('adapter', describe.get('id'))} has no "
                "example_inputs(n), so calibration cannot size its batches to the replica's "
                "budget on this GPU; set max_batch_size (a batch that fits the budget), or give "
                "the class example_inputs(n) returning n of the largest inputs a request may "
                "carry (docs/custom-models.md)"
            )


def initial_batch_cap(args: AppArgs, backend: ModelBackend, partition: Partition) -> BatchCap:
    """The batch cap to start serving with (see the module docstring)."""
    configured = args.max_batch_size
    if not partition.on_gpu:
        logger.info("calibration skipped: the device is a CPU")
        return BatchCap(configured or CPU_DEFAULT_BATCH)
    mem = args.memory
    if not mem.calibrate:
        logger.info("calibration off (memory.calibrate: false)")
        return BatchCap(configured or CPU_DEFAULT_BATCH)
    if not calibrates(backend):
        check_batch_cap_source(args, backend, partition)
        assert configured is not None
        logger.info(
            "calibration skipped: the model has no example_inputs(n) to measure with; "
            "batch cap %d from args.max_batch_size",
            configured,
        )
        return BatchCap(configured)
    limit = min(mem.calibration_max_batch_size, configured or mem.calibration_max_batch_size)
    budget = partition.budget
    assert budget is not None
    entry = calibration_entry(args, backend, partition, limit)
    if entry is not None:
        cached = calibcache.load(
            entry, cap_bytes=budget.cap_bytes, overhead_bytes=budget.overhead_bytes, limit=limit
        )
        if cached is not None:
            logger.info(
                "calibration: batch %d from the cache (%s), peak %s of a %s cap",
                cached.batch_size,
                entry.path,
                format_bytes(cached.peak_bytes),
                format_bytes(budget.cap_bytes),
            )
            return BatchCap(cached.batch_size, cached, "cache", entry)
    result = calibrate_batch_size(backend, partition, limit)
    if entry is not None:
        calibcache.store(entry, result, budget.overhead_bytes)
    return BatchCap(int(result.batch_size), result, "measured", entry)


def calibration_entry(
    args: AppArgs, backend: ModelBackend, partition: Partition, limit: int
) -> calibcache.CacheEntry | None:
    """This replica's calibration cache entry; None when the cache is off (or its key cannot
    be built, which is logged: the replica then measures, as without a cache)."""
    directory = calibcache.resolve_dir(args.memory.calibration_cache_dir)
    if directory is None:
        logger.info("calibration cache off (memory.calibration_cache_dir: null)")
        return None
    try:
        key = calibcache.replica_key(args, backend.describe(), partition, limit)
    except Exception as exc:  # noqa: BLE001 - the cache is an optimisation, never a failure
        logger.warning("calibration cache: no key for this replica (%r); measuring", exc)
        return None
    return calibcache.CacheEntry.at(directory, key)


def calibrate_batch_size(
    backend: ModelBackend, partition: Partition, max_batch_size: int
) -> CalibrationResult:
    """Run worst-case batches of doubling size under the cap; the largest that fits wins.

    The peak compared with the budget is NVML's view of the process: the caching allocator's
    peak reserved bytes plus the non-torch overhead measured at start-up.
    """
    budget = partition.budget
    assert budget is not None
    memory = partition.memory

    def probe(n: int) -> int | None:
        partition.free_cache(count=False)
        memory.reset_peak()
        if not run_fits(backend, partition, backend.worst_case_items(n)):
            return None
        return memory.peak_reserved_bytes() + budget.overhead_bytes

    result = find_max_batch(probe, budget_bytes=budget.cap_bytes, max_batch_size=max_batch_size)
    partition.free_cache(count=False)
    memory.reset_peak()
    logger.info(
        "calibration: batch %d peaks at %s of a %s cap; next step %s -> %s",
        result.batch_size,
        format_bytes(result.peak_bytes),
        format_bytes(budget.cap_bytes),
        result.first_failure_size,
        result.first_failure,
    )
    return result


def length_packing(args: AppArgs, backend: ModelBackend, batch_cap: int) -> dict[str, Any]:
    """The batcher's token packing for a backend that reports its items' lengths (the text
    families' ``token_cost`` and ``max_tokens``): ``cost`` and ``max_batch_tokens`` (see
    serving/packing), else nothing. The default budget is the batch cap x ``max_tokens``: on a
    GPU the cap was calibrated with worst-case items of ``max_tokens`` each, so that many
    padded tokens are what was measured to fit the memory budget."""
    cost = getattr(backend, "token_cost", None)
    max_tokens = getattr(backend, "max_tokens", None)
    if cost is None or not isinstance(max_tokens, int):
        return {}
    budget = args.max_batch_tokens or batch_cap * max_tokens
    logger.info("batches packed by tokens: at most %d padded tokens a batch", budget)
    return {"cost": cost, "max_batch_tokens": budget}
