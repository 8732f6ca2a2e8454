"""nvml.py against a fake pynvml module and a scripted source: typed errors, never a crash."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest

from serve_app.gpu import devices, nvml
from serve_app.gpu.nvml import GpuMemory, NvmlError, NvmlErrorKind, NvmlSource
from serve_app.testing.nvml import ScriptedSource

UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_pynvml(*, v2: bool = True, lost: set[str] | None = None) -> Any:
    """A pynvml stand-in with two GPUs; records calls; ``lost`` GPUs raise GPU_IS_LOST (15)."""
    calls: list[str] = []
    lost = lost or set()
    handles = {UUID0: "h0", UUID1: "h1"}
    by_handle = {v: k for k, v in handles.items()}
    memory = {"h0": (80_000, 30_000, 49_000, 1_000), "h1": (80_000, 80_000, 0, 0)}

    def check(handle: str) -> None:
        if by_handle[handle] in lost:
            raise FakeNVMLError(15)

    def get_memory(handle: str, version: int | None = None) -> Any:
        calls.append(f"memory_v{2 if version else 1}")
        check(handle)
        total, free, used, reserved = memory[handle]
        if version:
            if not v2:
                raise FakeNVMLError(13)  # function not found: old driver
            return types.SimpleNamespace(total=total, free=free, used=used, reserved=reserved)
        return types.SimpleNamespace(total=total, free=free, used=used + reserved)

    def by_uuid(uuid: str) -> str:
        if uuid not in handles:
            raise FakeNVMLError(6)
        return handles[uuid]

    def procs(handle: str) -> list[Any]:
        check(handle)
        return [types.SimpleNamespace(pid=42, usedGpuMemory=7_000)] if handle == "h0" else []

    module = types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlMemory_v2=0x02000028,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: ["h0", "h1"][i],
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetUUID=lambda h: by_handle[h].encode(),
        nvmlDeviceGetMemoryInfo=get_memory,
        nvmlDeviceGetComputeRunningProcesses=procs,
        nvmlDeviceGetMPSComputeRunningProcesses=lambda h: [],
    )
    module.calls = calls
    return module


def source_for(module: Any) -> NvmlSource:
    return NvmlSource(importer=lambda: module)


def test_lazy_init_and_memory_v2() -> None:
    module = fake_pynvml()
    source = source_for(module)
    assert module.calls == []  # nothing at construction
    assert source.device_memory(UUID0) == GpuMemory(UUID0, 80_000, 30_000, 49_000, 1_000)
    assert module.calls == ["init", "memory_v2"]
    source.device_memory(UUID0)
    assert module.calls.count("init") == 1
    source.shutdown()
    assert module.calls[-1] == "shutdown"


def test_falls_back_to_memory_v1_on_old_drivers() -> None:
    module = fake_pynvml(v2=False)
    source = source_for(module)
    assert source.device_memory(UUID0) == GpuMemory(UUID0, 80_000, 30_000, 50_000, 0)
    source.device_memory(UUID1)
    assert module.calls == ["init", "memory_v2", "memory_v1", "memory_v1"]  # v2 tried once


def test_all_devices_keyed_by_uuid() -> None:
    devices = source_for(fake_pynvml()).all_devices()
    assert devices == [
        GpuMemory(UUID0, 80_000, 30_000, 49_000, 1_000),
        GpuMemory(UUID1, 80_000, 80_000, 0, 0),
    ]


def test_process_used_bytes() -> None:
    source = source_for(fake_pynvml())
    assert source.process_used_bytes(42, UUID0) == 7_000
    assert source.process_used_bytes(43, UUID0) is None  # not listed (e.g. another PID namespace)
    assert source.process_used_bytes(42, UUID1) is None


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (lambda s: s.device_memory(UUID0), NvmlErrorKind.GPU_LOST),
        (lambda s: s.all_devices(), NvmlErrorKind.GPU_LOST),
        (lambda s: s.process_used_bytes(42, UUID0), NvmlErrorKind.GPU_LOST),
        (lambda s: s.device_memory("GPU-missing"), NvmlErrorKind.NOT_FOUND),
    ],
)
def test_nvml_errors_become_values(call: Any, kind: NvmlErrorKind) -> None:
    result = call(source_for(fake_pynvml(lost={UUID0})))
    assert isinstance(result, NvmlError)
    assert result.kind is kind


def test_missing_library_is_a_value() -> None:
    def no_library() -> Any:
        raise ImportError("No module named 'pynvml'")

    result = NvmlSource(importer=no_library).all_devices()
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.LIBRARY_NOT_FOUND

    module = fake_pynvml()
    module.nvmlInit = lambda: (_ for _ in ()).throw(OSError("libnvidia-ml.so.1: not found"))
    result = source_for(module).device_memory(UUID0)
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.LIBRARY_NOT_FOUND


def test_unknown_codes_and_odd_exceptions_are_values() -> None:
    module = fake_pynvml()
    module.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(FakeNVMLError(999))
    result = source_for(module).all_devices()
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.UNKNOWN
    module.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("ctypes"))
    result = source_for(module).all_devices()
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.UNKNOWN
    del module.nvmlDeviceGetCount
    result = source_for(module).all_devices()
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.NOT_SUPPORTED


def test_init_failure_is_retried() -> None:
    module = fake_pynvml()
    module.nvmlInit = lambda: (_ for _ in ()).throw(FakeNVMLError(9))
    source = source_for(module)
    first = source.device_memory(UUID0)
    assert isinstance(first, NvmlError) and first.kind is NvmlErrorKind.DRIVER_NOT_LOADED
    module.nvmlInit = lambda: None
    assert isinstance(source.device_memory(UUID0), GpuMemory)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("11111111-2222-3333-4444-555555555555", UUID0),
        (UUID0, UUID0),
        ("MIG-abc", "MIG-abc"),
        (bytes.fromhex("1111111122223333444455555555555" + "5"), UUID0),
    ],
)
def test_format_uuid(raw: object, expected: str) -> None:
    assert devices.format_uuid(raw) == expected


def write_script(path: Path, script: dict[str, Any]) -> Path:
    path.write_text(json.dumps(script))
    return path


SCRIPT = {
    "t0_unix_s": 100.0,
    "devices": {UUID0: {"total_bytes": 1000}, UUID1: {"total_bytes": 2000}},
    "steps": [
        {
            "at_s": 0,
            "devices": {UUID0: {"free_bytes": 900}, UUID1: {"free_bytes": 2000}},
            "processes": {"42": {UUID0: 80}},
        },
        {"at_s": 10, "devices": {UUID0: {"free_bytes": 100, "used_bytes": 900}}},
        {"at_s": 20, "devices": {UUID1: {"error": "gpu_lost"}}},
        {"at_s": 30, "error": "library_not_found"},
    ],
}


def test_scripted_source_replays_steps(tmp_path: Path) -> None:
    now = [105.0]
    source = ScriptedSource(write_script(tmp_path / "nvml.json", SCRIPT), clock=lambda: now[0])
    assert source.device_memory(UUID0) == GpuMemory(UUID0, 1000, 900, 100, 0)
    assert source.process_used_bytes(42, UUID0) == 80
    now[0] = 111.0
    assert source.device_memory(UUID0) == GpuMemory(UUID0, 1000, 100, 900, 0)
    assert source.device_memory(UUID1) == GpuMemory(UUID1, 2000, 2000, 0, 0)  # kept from step 0
    assert source.process_used_bytes(42, UUID0) is None
    now[0] = 125.0
    lost = source.device_memory(UUID1)
    assert isinstance(lost, NvmlError) and lost.kind is NvmlErrorKind.GPU_LOST
    assert isinstance(source.all_devices(), NvmlError)
    now[0] = 130.0
    gone = source.device_memory(UUID0)
    assert isinstance(gone, NvmlError) and gone.kind is NvmlErrorKind.LIBRARY_NOT_FOUND


def test_scripted_source_rereads_a_changed_file(tmp_path: Path) -> None:
    path = write_script(tmp_path / "nvml.json", {"devices": {UUID0: {"total_bytes": 10}}})
    source = ScriptedSource(path, clock=lambda: 0.0)
    assert source.all_devices() == [GpuMemory(UUID0, 10, 10, 0, 0)]
    write_script(path, {"devices": {UUID0: {"total_bytes": 10, "free_bytes": 3}}, "x": 1})
    assert source.all_devices() == [GpuMemory(UUID0, 10, 3, 7, 0)]


def test_scripted_source_bad_script_is_a_value(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = ScriptedSource(bad).all_devices()
    assert isinstance(result, NvmlError) and result.kind is NvmlErrorKind.SCRIPT
    missing = ScriptedSource(tmp_path / "missing.json").device_memory(UUID0)
    assert isinstance(missing, NvmlError) and missing.kind is NvmlErrorKind.SCRIPT


def test_env_var_selects_the_scripted_source(tmp_path: Path, monkeypatch: Any) -> None:
    script = {"devices": {UUID0: {"total_bytes": 1000}, UUID1: {"total_bytes": 2000}}}
    path = write_script(tmp_path / "nvml.json", script)
    monkeypatch.setenv(nvml.FAKE_NVML_VAR, str(path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    nvml.set_source(None)
    try:
        assert isinstance(nvml.get_source(), ScriptedSource)
        assert devices.uuid_for_torch_device(0) == UUID1  # Ray's logical GPU 1 is the second device
        assert devices.uuid_for_torch_device(1) is None
    finally:
        nvml.set_source(None)


def test_module_functions_use_the_set_source(tmp_path: Path) -> None:
    nvml.set_source(ScriptedSource(write_script(tmp_path / "n.json", SCRIPT), clock=lambda: 100.0))
    try:
        assert [d.uuid for d in nvml.all_devices()] == [UUID0, UUID1]  # type: ignore[union-attr]
        assert nvml.device_memory(UUID0) == GpuMemory(UUID0, 1000, 900, 100, 0)
        assert nvml.process_used_bytes(42, UUID0) == 80
    finally:
        nvml.set_source(None)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, 2),  # unset: every GPU
        ("", 0),
        ("0", 1),
        ("1,0", 2),
        ("0,5,1", 1),  # CUDA stops at the first entry that names no GPU
        ("-1", 0),
        ("0,0", 1),  # a GPU counts once
        (UUID1, 1),
        ("GPU-aaaa", 1),  # a unique prefix
        ("GPU-", 0),  # a prefix both share names neither
        ("MIG-nothing,0", 0),
    ],
)
def test_count_visible_follows_cuda_visible_devices(visible: str | None, expected: int) -> None:
    assert devices.count_visible(visible, [UUID0, UUID1]) == expected


def test_visible_cuda_devices_reads_the_driver_not_a_script(tmp_path: Path) -> None:
    driver = source_for(fake_pynvml())
    assert devices.visible_cuda_devices(None, driver) == 2
    assert devices.visible_cuda_devices("1", driver) == 1
    missing = source_for(types.SimpleNamespace())  # no nvmlInit: as good as no driver
    assert isinstance(devices.visible_cuda_devices(None, missing), NvmlError)
    # A scripted source (logical GPUs on a CPU machine) is not the driver: without one (this
    # machine has no NVIDIA driver in CI) the count is an error, not the script's GPUs.
    nvml.set_source(ScriptedSource(write_script(tmp_path / "nvml.json", SCRIPT)))
    try:
        got = devices.visible_cuda_devices(None)
    finally:
        nvml.set_source(None)
    if isinstance(got, int):  # a machine with a driver: its own GPUs, whatever the script says
        assert got == devices.count_visible(None, [d.uuid for d in NvmlSource().all_devices()])  # type: ignore[union-attr]
    else:
        assert isinstance(got, NvmlError)


def test_utilization_and_name(tmp_path: Path) -> None:
    module = fake_pynvml(lost={UUID1})
    module.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37, memory=5)
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    source = source_for(module)
    assert source.utilization_and_name(UUID0) == (37, "NVIDIA H200")
    assert isinstance(source.utilization_and_name("GPU-missing"), NvmlError)
    # A scripted source scripts memory only: the module function says so, as a value.
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"steps": [{"gpus": []}]}))
    nvml.set_source(ScriptedSource(script))
    try:
        got = nvml.utilization_and_name(UUID0)
        assert isinstance(got, NvmlError) and got.kind is NvmlErrorKind.NOT_SUPPORTED
    finally:
        nvml.set_source(None)
