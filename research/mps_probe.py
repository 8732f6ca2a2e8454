"""Probe: how an MPS client's pinned device memory limit behaves, case by case.

Run on a GPU host where ``nvidia-cuda-mps-control`` exists (as root or the GPU's owner):

    python3 -m research.mps_probe --out $OUT/mps_probe.json

It starts a private MPS control daemon (its own pipe and log directories under a scratch
folder, no CUDA_VISIBLE_DEVICES, so it serves every GPU), then runs each case in a fresh
process with its own environment: when the limit is set (before CUDA initialises, after
``torch.cuda.is_available()``), how it names the GPU (index 0, an index the client cannot see,
a UUID), a pipe directory that is not the daemon's, CUDA_VISIBLE_DEVICES as Ray sets it, an
active-thread percentage, a daemon started after the client. Each case reports what CUDA says
the device holds (``cudaMemGetInfo`` through torch), whether NVML lists it as an MPS client and
with how many bytes, and whether a 6 GiB ``torch.empty`` and a raw 6 GiB ``cuMemAlloc`` past a
4 GiB limit are refused. serve_app's MPS mode (serve_app/mps.py) is built on what this found;
docs/mps.md has the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GIB = 1024**3
LIMIT_BYTES = 4 * GIB
ASK_BYTES = 6 * GIB

CLIENT = r"""
import ctypes, json, os, sys, time
case = json.loads(sys.argv[1])
out = {"case": case["name"]}
if case.get("nvml_check"):
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
import torch
if case.get("set_after_is_available"):
    out["is_available"] = torch.cuda.is_available()
    os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = case["set_after_is_available"]
if case.get("wait_for"):
    torch.zeros(1, device="cuda")
    deadline = time.time() + 60
    while not os.path.exists(case["wait_for"]) and time.time() < deadline:
        time.sleep(0.1)
try:
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
except Exception as exc:
    out["context_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    print(json.dumps(out)); sys.exit(0)
free, total = torch.cuda.mem_get_info()
props = torch.cuda.get_device_properties(0)
out.update(mem_get_info_free=int(free), mem_get_info_total=int(total),
           props_total=int(props.total_memory), sms=int(props.multi_processor_count),
           uuid="GPU-" + str(props.uuid))
import pynvml
pynvml.nvmlInit()
def listed():
    found = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for kind, fn in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                         ("mps", pynvml.nvmlDeviceGetMPSComputeRunningProcesses)):
            try:
                for p in fn(h):
                    if int(p.pid) == os.getpid():
                        found[kind] = {"gpu": uuid, "used_bytes": p.usedGpuMemory}
            except pynvml.NVMLError as exc:
                found[kind + "_error"] = str(exc)
    return found
out["nvml_after_context"] = listed()
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
time.sleep(0.3)
out["nvml_after_2gib"] = listed()
del x
torch.cuda.empty_cache()
try:
    y = torch.empty(ASK, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["torch_6gib_refused"] = False
    del y
    torch.cuda.empty_cache()
except Exception as exc:
    out["torch_6gib_refused"] = True
    out["torch_error"] = str(exc)[:300]
lib = ctypes.CDLL("libcuda.so.1")
ptr = ctypes.c_uint64()
rc = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(ASK))
out["raw_6gib_refused"] = rc != 0
out["raw_rc"] = rc
if rc == 0:
    time.sleep(0.3)
    out["nvml_after_raw_6gib"] = listed()
    lib.cuMemFree_v2(ptr)
if case.get("matmul"):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    out["matmul_s"] = round(time.perf_counter() - t, 4)
print(json.dumps(out))
"""


def run_case(case: dict[str, Any], env: dict[str, str], timeout_s: float = 120.0) -> dict[str, Any]:
    code = f"ASK = {ASK_BYTES}\n" + CLIENT
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(case)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"case": case["name"], "error": f"timed out after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"case": case["name"], "rc": proc.returncode, "stderr": proc.stderr[-3000:]}
    result["env"] = {k: v for k, v in env.items() if k.startswith(("CUDA_", "PYTORCH_NVML"))}
    result["wall_s"] = round(time.perf_counter() - started, 2)
    return result


def control(pipe: Path, command: str) -> dict[str, Any]:
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    try:
        p = subprocess.run(
            ["nvidia-cuda-mps-control"],
            input=command + "\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
        )
        return {
            "command": command,
            "rc": p.returncode,
            "out": p.stdout[-500:],
            "err": p.stderr[-500:],
        }
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"command": command, "error": repr(exc)}


def start_daemon(pipe: Path, logdir: Path) -> dict[str, Any]:
    pipe.mkdir(parents=True, exist_ok=True)
    logdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_LOG_DIRECTORY=str(logdir))
    p = subprocess.run(
        ["nvidia-cuda-mps-control", "-d"], env=env, capture_output=True, text=True, timeout=30
    )
    return {
        "rc": p.returncode,
        "err": p.stderr[-500:],
        "pid_file": sorted(x.name for x in pipe.iterdir()),
    }


def gpu_uuids() -> list[str]:
    import pynvml

    pynvml.nvmlInit()
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        u = pynvml.nvmlDeviceGetUUID(h)
        out.append(u.decode() if isinstance(u, bytes) else u)
        try:
            cur, _pend = pynvml.nvmlDeviceGetMigMode(h)
            out[-1] += f" (mig {cur})"
        except pynvml.NVMLError as exc:
            out[-1] += f" (mig: {exc})"
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ns = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mps-probe-"))
    pipe, logdir = scratch / "pipe", scratch / "log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    client = dict(base, CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    gpus = gpu_uuids()
    uuid0 = gpus[0].split(" ")[0]
    doc: dict[str, Any] = {"gpus": gpus, "limit_bytes": LIMIT_BYTES, "ask_bytes": ASK_BYTES}
    doc["control_before_daemon"] = control(pipe, "get_server_list")
    doc["daemon"] = start_daemon(pipe, logdir)
    doc["control_with_daemon"] = control(pipe, "get_server_list")
    lim = "0=4G"
    cases: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({"name": "no_mps_no_limit"}, dict(base)),
        ({"name": "mps_no_limit"}, dict(client)),
        ({"name": "limit_in_env_at_start"}, dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim)),
        (
            {"name": "limit_bytes_form"},
            dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"0={LIMIT_BYTES}"),
        ),
        ({"name": "limit_after_is_available", "set_after_is_available": lim}, dict(client)),
        (
            {
                "name": "limit_after_nvml_is_available",
                "set_after_is_available": lim,
                "nvml_check": True,
            },
            dict(client),
        ),
        ({"name": "limit_unseen_index"}, dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="1=4G")),
        (
            {"name": "limit_unseen_index_and_0"},
            dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4G,7=4G"),
        ),
        ({"name": "limit_uuid_form"}, dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=f"{uuid0}=4G")),
        (
            {"name": "pipe_mismatch"},
            dict(
                base,
                CUDA_MPS_PIPE_DIRECTORY=str(scratch / "other"),
                CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim,
            ),
        ),
        (
            {"name": "cvd_0"},
            dict(client, CUDA_VISIBLE_DEVICES="0", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim),
        ),
        (
            {"name": "cvd_uuid"},
            dict(client, CUDA_VISIBLE_DEVICES=uuid0, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim),
        ),
        (
            {"name": "limit_smaller_than_context"},
            dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=64M"),
        ),
        (
            {"name": "thread_pct_25", "matmul": True},
            dict(
                client, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim
            ),
        ),
        (
            {"name": "thread_pct_100", "matmul": True},
            dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim),
        ),
    ]
    if len(gpus) > 1:
        cases.append(
            (
                {"name": "cvd_1"},
                dict(client, CUDA_VISIBLE_DEVICES="1", CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim),
            )
        )
    doc["cases"] = []
    for case, env in cases:
        r = run_case(case, env)
        print(json.dumps(r), flush=True)
        doc["cases"].append(r)
    doc["control_clients"] = control(pipe, "get_server_list")
    doc["quit"] = control(pipe, "quit")
    time.sleep(1.0)
    # A client that made its context before the daemon existed, then the daemon starts.
    flag = scratch / "go"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"ASK = {ASK_BYTES}\n" + CLIENT,
            json.dumps({"name": "daemon_after_client", "wait_for": str(flag)}),
        ],
        env=dict(client, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=lim),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(8.0)
    doc["daemon_late"] = start_daemon(pipe, logdir)
    flag.touch()
    stdout, stderr = proc.communicate(timeout=120)
    try:
        late = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        late = {"case": "daemon_after_client", "stderr": stderr[-2000:]}
    print(json.dumps(late), flush=True)
    doc["cases"].append(late)
    doc["quit_late"] = control(pipe, "quit")
    Path(ns.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
