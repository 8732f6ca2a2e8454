"""Probe: when must CUDA_MPS_PINNED_DEVICE_MEM_LIMIT be set for an MPS client to honour it?

Run on a GPU host with an MPS control daemon up (``nvidia-cuda-mps-control -d``). A client
sees the devices of the daemon's own CUDA_VISIBLE_DEVICES, renumbered from 0: a daemon started
with CUDA_VISIBLE_DEVICES=1 serves its clients that GPU as device 0, and a client that sets
CUDA_VISIBLE_DEVICES=1 itself sees no GPU at all ("No CUDA GPUs are available", seen on the
H200 host). Each case
runs in a fresh process: it sets the limit at a different moment (before importing torch, after
``torch.cuda.is_available()``, after the CUDA context exists), then asks for more than the limit
with ``torch.empty`` and, past PyTorch's allocator, with a raw ``cudaMalloc`` through ctypes.
Prints one JSON line per case: whether each allocation was refused.
"""

from __future__ import annotations

import json
import subprocess
import sys

LIMIT = "0=2G"
ASK_BYTES = 3 * 1024**3

CASE = r"""
import ctypes, json, os, sys
when = sys.argv[1]
if when == "before_import":
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = LIMIT
import torch
if when == "after_is_available":
    torch.cuda.is_available()
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = LIMIT
if when == "after_context":
    torch.zeros(1, device="cuda")
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = LIMIT
out = {"when": when}
try:
    x = torch.empty(ASK_BYTES, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["torch_refused"] = False
    del x
    torch.cuda.empty_cache()
except Exception as exc:
    out["torch_refused"] = True
    out["torch_error"] = str(exc)[:160]
torch.zeros(1, device="cuda")
"""


def main() -> int:
    code = f"LIMIT = {LIMIT!r}\nASK_BYTES = {ASK_BYTES}\n" + CASE + RAW
    for when in ("before_import", "after_is_available", "after_context", "never"):
        proc = subprocess.run(
            [sys.executable, "-c", code, when], capture_output=True, text=True, timeout=120
        )
        line = proc.stdout.strip().splitlines()[-1:] or [""]
        try:
            print(json.dumps(json.loads(line[0])), flush=True)
        except ValueError:
            print(json.dumps({"when": when, "rc": proc.returncode, "stderr": proc.stderr[-3000:]}))
    return 0


RAW = r"""
lib = None
for name in ("libcuda.so.1", "libcuda.so"):
    try:
        lib = ctypes.CDLL(name)
        break
    except OSError:
        continue
ptr = ctypes.c_uint64()
rc = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(ASK_BYTES))
out["raw_refused"] = rc != 0
out["raw_rc"] = rc
if rc == 0:
    lib.cuMemFree_v2(ptr)
print(json.dumps(out))
"""

if __name__ == "__main__":
    raise SystemExit(main())
