"""Which GPU is which: CUDA's device indices and CUDA_VISIBLE_DEVICES entries mapped to NVML's
UUIDs, and how many GPUs a process may use, read through serve_app.gpu.nvml without initialising
CUDA where that matters (``serve-app run`` decides CPU or GPU before Ray starts)."""

from __future__ import annotations

from serve_app.gpu import nvml
from serve_app.gpu.nvml import GpuMemory, NvmlError, NvmlErrorKind


def device_memory_for_visible(visible: str) -> GpuMemory | NvmlError:
    """The memory of the GPU that one CUDA_VISIBLE_DEVICES entry names (an index, or a UUID or
    its prefix), read without initialising CUDA. Indices follow NVML's (PCI bus) order, which
    is CUDA's on a node of identical GPUs, the case Ray's GPU ids assume."""
    devices = nvml.all_devices()
    if isinstance(devices, NvmlError):
        return devices
    if visible.isdigit():
        index = int(visible)
        if index < len(devices):
            return devices[index]
    else:
        matches = [d for d in devices if d.uuid.startswith(visible)]
        if len(matches) == 1:
            return matches[0]
    return NvmlError(NvmlErrorKind.NOT_FOUND, f"no single GPU matches {visible!r}")


def count_visible(visible: str | None, uuids: list[str]) -> int:
    """How many of the GPUs with these NVML UUIDs (in NVML's index order) CUDA gives a
    process whose CUDA_VISIBLE_DEVICES is ``visible`` (None: unset, all of them). Each entry
    is an index or a UUID (or its unique prefix); CUDA stops at the first entry that names no
    GPU, and names each GPU once."""
    if visible is None:
        return len(uuids)
    seen: set[int] = set()
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            index = int(entry)
        else:
            matches = [i for i, u in enumerate(uuids) if entry and u.startswith(entry)]
            index = matches[0] if len(matches) == 1 else len(uuids)
        if index >= len(uuids) or index in seen:
            break
        seen.add(index)
    return len(seen)


def visible_cuda_devices(
    visible: str | None, driver: nvml.NvmlSource | None = None
) -> int | NvmlError:
    """How many GPUs CUDA would give a process with CUDA_VISIBLE_DEVICES ``visible``, read from
    the driver through NVML without importing torch or initialising CUDA (``count_visible``).
    Always the driver's GPUs (``driver``, default the process's NvmlSource), never a scripted
    source's: this decides whether there is a GPU at all."""
    if driver is None:
        source = nvml.get_source()
        driver = source if isinstance(source, nvml.NvmlSource) else nvml.NvmlSource()
    devices = driver.all_devices()
    if isinstance(devices, NvmlError):
        return devices
    return count_visible(visible, [d.uuid for d in devices])


def format_uuid(raw: object) -> str:
    """NVML's UUID string (``"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"``) for a torch UUID.

    Accepts ``torch.cuda.get_device_properties(i).uuid`` (a ``_CUuuid`` whose ``str`` is the
    bare UUID), a bare UUID string, or 16 raw bytes. Strings that already carry NVML's ``GPU-``
    or ``MIG-`` prefix come back unchanged.
    """
    if isinstance(raw, bytes | bytearray) and len(raw) == 16:
        hexed = bytes(raw).hex()
        text = f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}"
    else:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
    text = text.strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    return f"GPU-{text.lower()}"


def uuid_for_torch_device(index: int) -> str | None:
    """The NVML UUID of torch's CUDA device ``index`` (as seen through CUDA_VISIBLE_DEVICES),
    or ``None`` when there is no such device in this process.

    Under scripted NVML (tests: serve_app.testing.nvml) the script names the device.
    """
    if nvml.is_scripted():
        from serve_app.testing.nvml import scripted_uuid

        return scripted_uuid(nvml.get_source(), index)
    import torch

    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    return format_uuid(torch.cuda.get_device_properties(index).uuid)
