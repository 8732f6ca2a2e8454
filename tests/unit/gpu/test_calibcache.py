"""The calibration cache (calibcache.py): keys, round trips, and entries not to be trusted."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from serve_app.config.args import parse_args
from serve_app.gpu import calibcache
from serve_app.gpu.calibcache import CacheEntry
from serve_app.gpu.calibrate import CalibrationResult
from serve_app.startup import calibration

GIB = 1 << 30
CAP = 4 * GIB
OVERHEAD = GIB // 2
RESULT = CalibrationResult(
    batch_size=64,
    peak_bytes=3 * GIB,
    budget_bytes=CAP,
    first_failure_size=128,
    first_failure="oom",
    probes=((1, GIB), (2, GIB), (4, GIB), (8, GIB), (16, GIB), (32, 2 * GIB), (64, 3 * GIB)),
)


def _entry(tmp_path: Path, **fields: Any) -> CacheEntry:
    key = calibcache.build_key(model_name="m", cap_bytes=CAP, **fields)
    return CacheEntry.at(tmp_path, key)


def _load(entry: CacheEntry, overhead: int = OVERHEAD, limit: int = 256) -> Any:
    return calibcache.load(entry, cap_bytes=CAP, overhead_bytes=overhead, limit=limit)


def test_resolve_dir(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert calibcache.resolve_dir("auto") == tmp_path / "serve_app" / "calibration"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")  # invalid under XDG: ignored
    assert calibcache.resolve_dir("auto") == Path.home() / ".cache/serve_app/calibration"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert calibcache.resolve_dir("auto") == Path.home() / ".cache/serve_app/calibration"
    assert calibcache.resolve_dir(None) is None and calibcache.resolve_dir("  ") is None
    assert calibcache.resolve_dir("~/x") == Path.home() / "x"
    assert parse_args({}).memory.calibration_cache_dir == "auto"
    assert (
        parse_args({"memory": {"calibration_cache_dir": None}}).memory.calibration_cache_dir is None
    )


def test_key_is_order_free_and_every_field_changes_the_file() -> None:
    a = calibcache.build_key(model_name="m", dtype="float16", cap_bytes=CAP)
    b = calibcache.build_key(cap_bytes=CAP, dtype="float16", model_name="m")
    assert a == b and calibcache.key_file_name(a) == calibcache.key_file_name(b)
    for change in ({"dtype": "float32"}, {"cap_bytes": CAP + 1}, {"model_name": "n"}):
        other = calibcache.build_key(**{**a, **change})
        assert calibcache.key_file_name(other) != calibcache.key_file_name(a)
    with pytest.raises(TypeError, match="not a JSON scalar"):
        calibcache.build_key(model_name=["m"])


def test_replica_key_holds_what_decides_calibration(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    budget = SimpleNamespace(device_total_bytes=140 * GIB, cap_bytes=CAP, budget_bytes=CAP)
    part = SimpleNamespace(budget=budget, device="cuda:0", enforcement="torch")
    args = parse_args({"dtype": "float16", "max_input_tokens": 128})
    key = calibcache.replica_key(args, {"max_input_tokens": 128}, part, 256)
    assert key["gpu_name"] == "NVIDIA H200" and key["gpu_total_bytes"] == 140 * GIB
    assert key["torch_version"] == str(torch.__version__)
    assert key["dtype"] == "float16" and key["max_tokens"] == 128 and key["max_batch_size"] == 256
    assert key["cap_bytes"] == CAP and key["cuda_graphs"] is True
    assert key["cuda_graph_max_batch_size"] == 256 and key["arch"] is None
    image = calibcache.replica_key(args, {"arch": "resnet50"}, part, 256)
    assert image["arch"] == "resnet50" and image["max_tokens"] is None
    for field in ("serve_app_version", "model_name", "model_path", "adapter", "image_size"):
        assert field in key
    graphs_off = calibcache.replica_key(
        parse_args({"dtype": "float16", "max_input_tokens": 128, "cuda_graphs": False}),
        {"max_input_tokens": 128},
        part,
        256,
    )
    assert graphs_off["cuda_graphs"] is False and graphs_off != key


def test_round_trip(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    assert _load(entry) is None  # nothing yet
    assert calibcache.store(entry, RESULT, OVERHEAD)
    assert _load(entry) == RESULT
    assert os.stat(tmp_path).st_mode & 0o777 in (0o700, 0o755, 0o775)  # tmp_path existed
    assert [p.name for p in tmp_path.iterdir()] == [entry.path.name]  # no temporary left


def test_store_creates_a_private_directory(tmp_path: Path) -> None:
    entry = _entry(tmp_path / "a" / "b")
    assert calibcache.store(entry, RESULT, OVERHEAD)
    assert os.stat(tmp_path / "a" / "b").st_mode & 0o077 == 0


@pytest.mark.parametrize("text", ["", "{", "[1, 2]", "null", '{"format": 1}', "\xff\xfe"])
def test_corrupt_entries_are_ignored_and_rebuilt(tmp_path: Path, caplog, text: str) -> None:
    entry = _entry(tmp_path)
    entry.path.write_bytes(text.encode("latin-1"))
    assert _load(entry) is None
    assert "ignoring" in caplog.text
    assert calibcache.store(entry, RESULT, OVERHEAD) and _load(entry) == RESULT


def _doc(entry: CacheEntry) -> dict[str, Any]:
    calibcache.store(entry, RESULT, OVERHEAD)
    return dict(json.loads(entry.path.read_text()))


def test_an_entry_of_another_key_is_ignored(tmp_path: Path, caplog) -> None:
    entry = _entry(tmp_path)
    doc = _doc(entry)
    doc["key"]["cap_bytes"] = CAP * 2  # a file under this name holding another key
    entry.path.write_text(json.dumps(doc))
    assert _load(entry) is None
    assert "key does not match" in caplog.text


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"batch_size": True}, "must be integers"),
        ({"batch_size": "64"}, "must be integers"),
        ({"batch_size": 512}, "outside"),
        ({"batch_size": 0}, "outside"),
        ({"budget_bytes": CAP - 1}, "the cap is"),
        ({"peak_bytes": CAP + 1}, "out of range"),
        ({"overhead_bytes": -1}, "out of range"),
        ({"first_failure_size": 32}, "next step"),
        ({"first_failure": GIB}, "neither 'oom'"),
        ({"first_failure_size": None, "first_failure": None}, "below its limit"),
        ({"probes": [[1]]}, "probes malformed"),
    ],
)
def test_out_of_range_figures_are_not_trusted(
    tmp_path: Path, caplog, change: dict[str, Any], why: str
) -> None:
    entry = _entry(tmp_path)
    doc = _doc(entry)
    doc["result"].update(change)
    entry.path.write_text(json.dumps(doc))
    assert _load(entry) is None
    assert why in caplog.text


def test_a_larger_overhead_today_can_push_the_peak_over_the_cap(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    calibcache.store(entry, RESULT, OVERHEAD)
    room = CAP - RESULT.peak_bytes  # 1 GiB: the overhead may grow by that much, not more
    assert _load(entry, overhead=OVERHEAD + room) == RESULT
    assert _load(entry, overhead=OVERHEAD + room + 1) is None


def test_invalidate(tmp_path: Path, caplog) -> None:
    entry = _entry(tmp_path)
    calibcache.store(entry, RESULT, OVERHEAD)
    assert calibcache.invalidate(entry, "a batch of 64 ran out of memory")
    assert not entry.path.exists() and "ran out of memory" in caplog.text
    assert not calibcache.invalidate(entry, "again")  # already gone: fine


def test_write_is_atomic_and_a_failed_write_leaves_the_old_entry(
    tmp_path: Path, monkeypatch
) -> None:
    entry = _entry(tmp_path)
    calibcache.store(entry, RESULT, OVERHEAD)

    def fail(*a: Any, **k: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(calibcache.os, "replace", fail)
    assert not calibcache.store(entry, RESULT, OVERHEAD)
    monkeypatch.undo()
    assert _load(entry) == RESULT  # the old entry is whole
    assert [p.name for p in tmp_path.iterdir()] == [entry.path.name]  # temporary removed


def test_concurrent_writers_leave_a_whole_entry(tmp_path: Path) -> None:
    entry = _entry(tmp_path)
    errors: list[BaseException] = []
    seen: list[Any] = []

    def write() -> None:
        try:
            for _ in range(20):
                assert calibcache.store(entry, RESULT, OVERHEAD)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def read() -> None:
        for _ in range(60):
            seen.append(_load(entry))

    threads = [threading.Thread(target=write) for _ in range(4)] + [threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(s is None or s == RESULT for s in seen)  # absent at first, then always whole
    assert _load(entry) == RESULT
    assert [p.name for p in tmp_path.iterdir()] == [entry.path.name]


def test_an_unwritable_directory_is_logged_not_raised(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not calibcache.store(_entry(blocker / "sub"), RESULT, OVERHEAD)
    assert "cannot write" in caplog.text


# ---- startup.calibration.initial_batch_cap with the cache --------------------------------


class _Part:
    on_gpu = True
    device = "cuda:0"
    enforcement = "torch"
    budget = SimpleNamespace(
        cap_bytes=CAP, budget_bytes=CAP, overhead_bytes=OVERHEAD, device_total_bytes=16 * GIB
    )


def test_second_start_uses_the_cache_and_an_oom_invalidation_measures_again(
    tmp_path: Path, monkeypatch
) -> None:
    measured: list[int] = []

    def calibrate(backend: Any, partition: Any, limit: int) -> CalibrationResult:
        measured.append(limit)
        return CalibrationResult(64, 3 * GIB, CAP, 128, "oom", ((64, 3 * GIB), (128, None)))

    monkeypatch.setattr(calibration, "calibrate_batch_size", calibrate)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU")
    args = parse_args({"memory": {"calibration_cache_dir": str(tmp_path)}})
    backend = SimpleNamespace(describe=lambda: {"max_input_tokens": 256})

    def start(args: Any) -> calibration.BatchCap:
        return calibration.initial_batch_cap(args, backend, _Part())  # type: ignore[arg-type]

    first = start(args)
    assert (first.batch_cap, first.source, measured) == (64, "measured", [256])
    second = start(args)
    assert (second.batch_cap, second.source, measured) == (64, "cache", [256])
    assert second.calibration is not None and second.calibration.first_failure == "oom"
    assert second.entry == first.entry and first.entry is not None
    calibcache.invalidate(first.entry, "test")
    third = start(args)
    assert (third.batch_cap, third.source, measured) == (64, "measured", [256, 256])
    off = start(parse_args({"memory": {"calibration_cache_dir": None}}))
    assert (off.source, off.entry, len(measured)) == ("measured", None, 3)


def test_the_replicas_first_oom_deletes_its_entry(tmp_path: Path) -> None:
    from serve_app.serving.replica import ModelServer

    entry = _entry(tmp_path)
    calibcache.store(entry, RESULT, OVERHEAD)
    lower = ModelServer.func_or_class._lower_batch_cap  # type: ignore[attr-defined]
    server = SimpleNamespace(batch_cap=64, _batcher=SimpleNamespace(max_batch_size=64))
    server._calibration_entry = entry
    lower(server, 64)
    assert not entry.path.exists() and server._calibration_entry is None
    assert server.batch_cap < 64 and server._batcher.max_batch_size == server.batch_cap
    calibcache.store(entry, RESULT, OVERHEAD)  # rewritten by another replica: left alone
    lower(server, server.batch_cap)
    assert entry.path.exists()
