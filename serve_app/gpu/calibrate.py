"""Batch-size calibration: the largest batch whose measured peak fits the replica's budget.

After the weights load, the replica runs worst-case batches (longest inputs) of growing size and
measures each one's peak. The search itself is pure: it takes a ``probe`` callable, so it is
tested with scripted probes and run on the GPU with a real one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from serve_app.gpu.budget import GpuMemoryError, format_bytes

__all__ = ["CalibrationError", "CalibrationResult", "candidate_sizes", "find_max_batch"]


class CalibrationError(GpuMemoryError):
    """Even the smallest batch does not fit in the replica's budget."""


@dataclass(frozen=True)
class CalibrationResult:
    """What ``find_max_batch`` chose and what it measured.

    Attributes:
        batch_size: the largest probed size whose peak fitted the budget.
        peak_bytes: the measured peak of that size.
        budget_bytes: the budget the peaks were compared against.
        first_failure_size: the next doubling step after ``batch_size``, which did not fit; None
            when the search reached ``max_batch_size`` without a failure.
        first_failure: that step's measured peak bytes, ``"oom"`` when it ran out of memory, or
            None when there was no failure.
        probes: every probe in order, as ``(size, peak_bytes or None for OOM)``.
    """

    batch_size: int
    peak_bytes: int
    budget_bytes: int
    first_failure_size: int | None
    first_failure: int | Literal["oom"] | None
    probes: tuple[tuple[int, int | None], ...]


def candidate_sizes(start: int, max_batch_size: int) -> list[int]:
    """The sizes to probe: ``start`` doubled while below ``max_batch_size``, then the cap itself.

    Examples: ``(1, 16) -> [1, 2, 4, 8, 16]``; ``(1, 24) -> [1, 2, 4, 8, 16, 24]``;
    ``(3, 10) -> [3, 6, 10]``.
    """
    if not 1 <= start <= max_batch_size:
        raise ValueError(
            f"need 1 <= start <= max_batch_size, got start={start}, max_batch_size={max_batch_size}"
        )
    sizes = []
    size = start
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    sizes.append(max_batch_size)
    return sizes


def find_max_batch(
    probe: Callable[[int], int | None],
    *,
    budget_bytes: int,
    max_batch_size: int,
    start: int = 1,
) -> CalibrationResult:
    """Find the largest batch size, among doubling steps, whose peak memory fits the budget.

    ``probe(n)`` runs the worst-case batch of ``n`` items and returns the measured peak in bytes
    on the same scale as the budget (the NVML-equivalent: peak reserved plus non-torch overhead),
    or None when it ran out of memory. Sizes ``start, 2*start, 4*start, ...`` are probed in turn,
    with ``max_batch_size`` as the last candidate when the doubling does not land on it. The
    search stops at the first size whose peak exceeds ``budget_bytes`` or that ran out of memory;
    the size before it is chosen. A peak equal to the budget fits.

    The answer is exact only to a doubling step: the true limit lies between ``batch_size`` and
    ``first_failure_size`` ("one step larger" is the next doubling step). Pass a budget with some
    headroom (for fragmentation, or inputs longer than the probe's) if you need one.

    Example: budget 10,000 bytes, peak ``4,000 + 500 n``, cap 64: sizes 1, 2, 4, 8 peak at
    4,500, 5,000, 6,000, 8,000 and fit; 16 peaks at 12,000 and does not. Result: batch 8, peak
    8,000, first failure 16 at 12,000.

    Raises:
        CalibrationError: the first size (``start``) already exceeds the budget or runs out of
            memory; the message says by how much and what to change.
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
    probes: list[tuple[int, int | None]] = []
    chosen: tuple[int, int] | None = None
    failure: tuple[int, int | Literal["oom"]] | None = None
    for size in candidate_sizes(start, max_batch_size):
        peak_bytes = probe(size)
        probes.append((size, peak_bytes))
        if peak_bytes is None or peak_bytes > budget_bytes:
            failure = (size, "oom" if peak_bytes is None else peak_bytes)
            break
        chosen = (size, peak_bytes)
    if chosen is None:
        assert failure is not None
        size, outcome = failure
        what = (
            "ran out of memory"
            if isinstance(outcome, str)
            else f"peaked at {format_bytes(outcome)} ({outcome:,} bytes)"
        )
        raise CalibrationError(
            f"calibration failed: even a batch of {size} {what}, over the budget of "
            f"{format_bytes(budget_bytes)} ({budget_bytes:,} bytes). Raise "
            "ray_actor_options.num_gpus (or memory_fraction) in the deploy config, or lower the "
            "model's maximum input size"
        )
    return CalibrationResult(
        batch_size=chosen[0],
        peak_bytes=chosen[1],
        budget_bytes=budget_bytes,
        first_failure_size=None if failure is None else failure[0],
        first_failure=None if failure is None else failure[1],
        probes=tuple(probes),
    )
