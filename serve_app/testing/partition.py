"""A logical GPU partition: a CPU replica that Ray gave a share of a *logical* GPU, under scripted
NVML (serve_app.testing.nvml). It names its GPU through the script and takes ``num_gpus x`` the
scripted total as its budget (no overhead, no torch cap: there is no CUDA), so that the headroom
controller runs end to end on a machine without a GPU. serve_app.gpu.partition starts one only
when readings are scripted."""

from __future__ import annotations

import logging

import torch

from serve_app import env
from serve_app.config.args import AppArgs
from serve_app.errors import StartupError
from serve_app.gpu import devices, nvml
from serve_app.gpu.budget import GpuMemoryError, format_bytes, plan_budget
from serve_app.gpu.partition import Partition

logger = logging.getLogger("serve_app")


def start_logical(args: AppArgs, num_gpus: float, device: torch.device) -> Partition | None:
    """The replica's logical partition, or None (a plain CPU replica) when the script has no
    device for it.

    Raises:
        StartupError: the budget cannot work (a bad ``num_gpus`` or ``memory_fraction``).
    """
    uuid = devices.uuid_for_torch_device(0)
    memory = nvml.device_memory(uuid) if uuid is not None else None
    if uuid is None or memory is None or isinstance(memory, nvml.NvmlError):
        why = memory.message if isinstance(memory, nvml.NvmlError) else "no scripted device"
        logger.warning(
            "serve_app replica on CPU with a logical GPU share (num_gpus=%s) under scripted "
            "NVML, but the script names no GPU for it (%s; CUDA_VISIBLE_DEVICES=%r): "
            "running as a plain CPU replica",
            num_gpus,
            why,
            env.get("CUDA_VISIBLE_DEVICES"),
        )
        return None
    try:
        budget = plan_budget(num_gpus, memory.total_bytes, 0, args.memory.memory_fraction)
    except GpuMemoryError as exc:
        raise StartupError(str(exc)) from None
    logger.warning(
        "serve_app replica on CPU with a LOGICAL GPU under scripted NVML (%s): GPU %s, "
        "budget %s (num_gpus=%s x scripted total %s), no torch cap; for tests only",
        env.FAKE_NVML_VAR,
        uuid,
        format_bytes(budget.budget_bytes),
        num_gpus,
        format_bytes(memory.total_bytes),
    )
    return Partition(
        device=device,
        num_gpus=num_gpus,
        gpu_mode="logical-scripted",
        gpu_uuid=uuid,
        budget=budget,
        overhead_source="scripted",
    )
