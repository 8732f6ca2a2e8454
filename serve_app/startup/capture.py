"""Start-up's CUDA graph capture: within what the replica's cap leaves beside its weights, for at
most ``cuda_graph_startup_budget_s``; the shapes left are captured between batches once the
replica serves (serve_app.gpu.graphs)."""

from __future__ import annotations

import logging
from typing import Any

from serve_app.adapters.contract import Model
from serve_app.errors import StartupError
from serve_app.gpu.budget import GRAPH_MIN_ROOM_BYTES, GRAPH_POOL_ROOM_SHARE, format_bytes
from serve_app.gpu.graphs import GraphCaptureError, GraphMemory
from serve_app.gpu.partition import Partition

logger = logging.getLogger("serve_app")


def graph_memory(partition: Partition, room: int | None) -> GraphMemory:
    """Where a replica's CUDA graphs take their memory: its device, within GRAPH_POOL_ROOM_SHARE
    of ``room`` (the room beside the weights; no limit without a budget), counting what capture
    adds outside torch through the partition's reading."""
    return GraphMemory(
        memory=partition.memory,
        limit_bytes=None if room is None else int(room * GRAPH_POOL_ROOM_SHARE),
        outside_torch_bytes=partition.outside_torch_bytes,
    )


def capture_graphs(
    model: Model, partition: Partition, max_batch_size: int, budget_s: float | None = None
) -> dict[str, Any]:
    """The backend's forward pass as CUDA graphs for batches up to ``max_batch_size``, for at
    most ``budget_s`` (the shapes left are captured once the replica serves); what was
    captured (``GraphSet.describe``), empty when the cap leaves too little room for graphs.

    Raises:
        StartupError: capture failed for another reason than memory; the message names the
            model and the way out (shapes that run out of memory are skipped, with a warning).
    """
    room = partition.room_beside_allocated_bytes()
    if room is not None and room < GRAPH_MIN_ROOM_BYTES:
        logger.warning(
            "CUDA graphs: off for %r: the room its cap leaves beside the weights (%s) is under "
            "%s, and graphs' pool and their memory outside torch would crowd out the eager "
            "batches (the model runs eagerly); raise num_gpus or memory.memory_fraction to "
            "graph it",
            model.name,
            format_bytes(room),
            format_bytes(GRAPH_MIN_ROOM_BYTES),
        )
        return {}
    memory = graph_memory(partition, room)
    try:
        graphs = model.backend.capture_graphs(max_batch_size, budget_s, memory)
    except GraphCaptureError as exc:
        raise StartupError(
            f"CUDA graph capture of {model.name!r} failed ({exc}); set "
            "args.cuda_graphs: false to run this model eagerly"
        ) from None
    partition.memory.synchronize()
    partition.free_cache(count=False)  # the eager runs before each capture
    info = graphs.describe()
    logger.info(
        "CUDA graphs: %d captured in %.2f s (batches up to %d; %s reserved); %d left to "
        "capture between batches once serving (cuda_graph_startup_budget_s %s)",
        info["graphs"],
        info["capture_s"],
        max_batch_size,
        format_bytes(max(0, info["pool_bytes"])),
        info["pending"],
        budget_s,
    )
    if info["skipped_out_of_memory"]:
        logger.warning(
            "CUDA graphs: %d shapes ran out of memory under the cap while captured and run "
            "eagerly instead; lower args.cuda_graph_max_batch_size to skip them, or raise the "
            "replica's memory share",
            info["skipped_out_of_memory"],
        )
    if info["skipped_over_limit"]:
        logger.warning(
            "CUDA graphs: %d shapes would have taken the graphs' memory past %s (%.0f%% of "
            "the room the cap leaves beside the weights) and run eagerly instead, so that eager "
            "batches keep their room; raise the replica's memory share to graph them",
            info["skipped_over_limit"],
            format_bytes(memory.limit_bytes or 0),
            GRAPH_POOL_ROOM_SHARE * 100,
        )
    return info
