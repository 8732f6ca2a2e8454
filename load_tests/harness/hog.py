"""Another process on the replicas' GPU: plain torch (not a replica, not a Ray worker) takes the
GPU's free memory in steps, leaving ``--keep-free-gib``, holds it, frees it, and prints one JSON
line of what it took. The GPU fault suite's ``hog`` and the two-GPU benchmark's grab run it:

    CUDA_VISIBLE_DEVICES=<GPU> python -m load_tests.harness.hog --hold-s 10 --keep-free-gib 1
"""

from __future__ import annotations

import argparse
import json
import sys
import time

GIB = 1 << 30


def hog_command(hold_s: float, keep_free_gib: float) -> list[str]:
    """This module's command line, for a subprocess (set its CUDA_VISIBLE_DEVICES)."""
    cmd = [sys.executable, "-m", "load_tests.harness.hog", "--hold-s", str(hold_s)]
    return [*cmd, "--keep-free-gib", str(keep_free_gib)]


def hog_child(hold_s: float, keep_free_bytes: int, step_bytes: int) -> None:
    """In the hog subprocess: take the GPU's free memory (less ``keep_free_bytes``) in steps,
    hold it, free it; print one JSON line of what it took."""
    import torch

    t0 = time.monotonic()
    free0, total = torch.cuda.mem_get_info()
    held = []
    refused = None
    while time.monotonic() - t0 < hold_s / 2:
        free, _ = torch.cuda.mem_get_info()
        step = min(step_bytes, free - keep_free_bytes)
        if step < (64 << 20):
            break
        try:
            held.append(torch.empty(step, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as exc:
            refused = str(exc).splitlines()[0][:200]
            break
    taken = sum(t.numel() for t in held)
    free_held, _ = torch.cuda.mem_get_info()
    took_s = time.monotonic() - t0
    time.sleep(max(0.0, hold_s - took_s))
    del held
    torch.cuda.empty_cache()
    print(
        json.dumps(
            {
                "free_before_bytes": free0,
                "total_bytes": total,
                "taken_bytes": taken,
                "free_while_held_bytes": free_held,
                "fill_s": round(took_s, 2),
                "held_s": round(time.monotonic() - t0, 2),
                "refused": refused,
            }
        ),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m load_tests.harness.hog", description=__doc__)
    p.add_argument("--hold-s", type=float, required=True, help="seconds from start to release")
    p.add_argument("--keep-free-gib", type=float, default=1.0, help="what it leaves free")
    a = p.parse_args(argv)
    hog_child(a.hold_s, int(a.keep_free_gib * GIB), step_bytes=GIB)
    return 0


if __name__ == "__main__":
    sys.exit(main())
