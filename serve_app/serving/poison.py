"""Sticky CUDA errors: a replica whose CUDA context is poisoned ends its own process.

After a device-side assert, an illegal memory access, a launch failure or a misaligned address,
every later CUDA call in the process fails: the context cannot be recovered, only recreated in
a new process. A replica that kept running would answer every request with a 500 until Serve's
health check (three failures in a row) replaced it. Instead it logs one CRITICAL line and calls
``os._exit(STICKY_CUDA_EXIT_CODE)`` from the thread that saw the error, before the batch's
requests are answered: their connections close with nothing sent, HAProxy replays them on
another replica (``retry-on empty-response``: ops.cluster_env.HAPROXY_RETRY_DEFAULTS), and
Serve starts a replacement. An out-of-memory error is not sticky (oom.py splits the batch and
goes on).
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("serve_app")

# Distinct from Python's 1 and 2, from 128 + a signal, and from Ray's own worker exit codes,
# so that a replica that ended itself for this reason is recognisable in Ray's logs.
STICKY_CUDA_EXIT_CODE = 87

# cudaError_t values after which the context is unusable (CUDA runtime API, "this leaves the
# process in an inconsistent state and any further CUDA work will return the same error").
STICKY_CUDA_CODES = {
    700: "illegal memory access",  # cudaErrorIllegalAddress
    710: "device-side assert",  # cudaErrorAssert
    714: "hardware stack error",  # cudaErrorHardwareStackError
    715: "illegal instruction",  # cudaErrorIllegalInstruction
    716: "misaligned address",  # cudaErrorMisalignedAddress
    717: "invalid address space",  # cudaErrorInvalidAddressSpace
    718: "invalid program counter",  # cudaErrorInvalidPc
    719: "unspecified launch failure",  # cudaErrorLaunchFailure
}
# The same errors as torch words them (lower-cased): "CUDA error: device-side assert triggered".
STICKY_PHRASES = (
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "hardware stack error",
)


def sticky_cuda_error(exc: BaseException) -> str | None:
    """Why ``exc`` leaves the CUDA context poisoned for good (a short reason), or None when it
    does not: a ``torch.AcceleratorError`` whose ``error_code`` or text is one of the sticky
    errors, or a ``RuntimeError`` whose text says "CUDA error" and names one. Out-of-memory
    errors, other CUDA errors (an invalid argument leaves the context usable) and every other
    exception are not sticky."""
    if type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower():
        return None
    if not isinstance(exc, RuntimeError):
        return None
    code = getattr(exc, "error_code", None)
    if isinstance(code, int) and code in STICKY_CUDA_CODES:
        return f"CUDA error {code}: {STICKY_CUDA_CODES[code]}"
    text = str(exc).lower()
    accelerator = type(exc).__name__ == "AcceleratorError"
    if not (accelerator or "cuda error" in text):
        return None
    for phrase in STICKY_PHRASES:
        if phrase in text:
            return f"CUDA error: {phrase}"
    return None


def exit_if_sticky(exc: BaseException, where: str, replica_id: str) -> None:
    """End this process at once when ``exc`` is a sticky CUDA error (sticky_cuda_error); return
    otherwise. Nothing is answered or cleaned up: the error says the GPU state is gone."""
    reason = sticky_cuda_error(exc)
    if reason is None:
        return
    logger.critical(
        "replica %s: %s in %s poisoned this process's CUDA context for good; exiting now "
        "(code %d) without answering its requests, so that HAProxy retries them on another "
        "replica and Serve starts a new one. Error: %s",
        replica_id,
        reason,
        where,
        STICKY_CUDA_EXIT_CODE,
        str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
    )
    for stream in (sys.stderr, sys.stdout):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(STICKY_CUDA_EXIT_CODE)
