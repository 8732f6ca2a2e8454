"""poison.py: which errors poison a CUDA context for good, and the replica's exit on them."""

from __future__ import annotations

import logging

import pytest
import torch

from serve_app.serving import poison
from serve_app.serving.poison import STICKY_CUDA_EXIT_CODE, exit_if_sticky, sticky_cuda_error

# What torch 2.x says for each (the first line of the message).
ASSERT = "CUDA error: device-side assert triggered"
ILLEGAL = "CUDA error: an illegal memory access was encountered"
LAUNCH = "CUDA error: unspecified launch failure"
MISALIGNED = "CUDA error: misaligned address"
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.80 GiB total capacity)"


class CodedAcceleratorError(torch.AcceleratorError):
    """An AcceleratorError carrying its cudaError_t, as torch's C++ side sets it."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.error_code = code


@pytest.mark.parametrize(
    "exc",
    [
        torch.AcceleratorError(ASSERT),
        torch.AcceleratorError(ILLEGAL),
        RuntimeError(ASSERT + "\nCUDA kernel errors might be asynchronously reported"),
        RuntimeError(ILLEGAL),
        RuntimeError(LAUNCH),
        RuntimeError(MISALIGNED),
        CodedAcceleratorError("CUDA error", 700),
        CodedAcceleratorError("CUDA error", 710),
        CodedAcceleratorError("something else", 719),
    ],
)
def test_sticky_errors_are_recognised(exc: BaseException) -> None:
    assert sticky_cuda_error(exc) is not None


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError(OOM),  # oom.py splits the batch
        RuntimeError(OOM),
        RuntimeError("device-side assert"),  # no "CUDA error": not from CUDA
        RuntimeError("shape mismatch: [4, 384] vs [8, 384]"),
        torch.AcceleratorError("CUDA error: invalid argument"),  # the context stays usable
        CodedAcceleratorError("CUDA error: invalid argument", 1),
        ValueError(ASSERT),  # not a RuntimeError
        KeyError("input"),
    ],
)
def test_other_errors_are_not_sticky(exc: BaseException) -> None:
    assert sticky_cuda_error(exc) is None


class Exited(Exception):
    pass


def test_exit_if_sticky_logs_once_and_exits_with_its_code(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        raise Exited

    monkeypatch.setattr(poison.os, "_exit", fake_exit)
    with caplog.at_level(logging.CRITICAL, logger="serve_app"), pytest.raises(Exited):
        exit_if_sticky(torch.AcceleratorError(ASSERT), "a batch", "r1")
    assert codes == [STICKY_CUDA_EXIT_CODE]
    [record] = caplog.records
    assert record.levelno == logging.CRITICAL
    assert "r1" in record.getMessage() and "device-side assert" in record.getMessage()


def test_exit_if_sticky_returns_on_other_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poison.os, "_exit", lambda code: pytest.fail(f"exited {code}"))
    exit_if_sticky(torch.OutOfMemoryError(OOM), "a batch", "r1")
    exit_if_sticky(ValueError("bad input"), "a batch", "r1")
