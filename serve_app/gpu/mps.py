"""MPS mode: a driver-enforced memory limit per replica, and concurrent kernels.

``set_per_process_memory_fraction`` binds only PyTorch's caching allocator; the CUDA context,
nvJPEG, cuBLAS outside the allocator, cupy or a custom kernel's ``cudaMalloc`` escape it. Under
NVIDIA's Multi-Process Service every replica is a client of one MPS server per node, and the
driver refuses a client's allocations past ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, whichever
library asks. ``memory.enforcement`` picks: ``torch`` (the PyTorch cap alone, the default),
``mps`` (the driver's limit alone) or ``both``.

What the driver does (research/mps_probe.py on the H200:
benchmarks/results/mps/mps_probe.json, table in docs/mps.md), and what this module does about
each:

- The limit is read once, when CUDA initialises in the process (``cuInit``, which
  ``torch.cuda.is_available()`` already calls). Set later, it is silently ignored. A replica
  therefore sets it first thing in its constructor (``prepare_client``) and refuses to start if
  the driver was initialised before (``driver_initialized``).
- ``0=4G`` and ``GPU-<uuid>=4G`` work; ``0=4294967296`` (no unit) is silently ignored; a list
  that names a device the client cannot see (``0=4G,7=4G``) drops *every* limit in it. Replicas
  see their one GPU as device 0 (Ray sets ``CUDA_VISIBLE_DEVICES``), so serve_app writes
  ``0=<MiB>M``, and ``check_limit_value`` refuses the silent forms in anything a user sets.
- A client whose pipe directory is not the daemon's, or that initialised CUDA before the daemon
  started, runs as an ordinary process with no limit and no error. ``prepare_client`` refuses
  to start without a daemon answering at the pipe directory, and ``verify_client`` checks after
  the context exists that NVML lists the process as an MPS client and that CUDA reports no more
  free memory than the limit (``cudaMemGetInfo`` reports ``limit - used`` as free under a limit,
  the device's free bytes without one).
- A limit below the CUDA context (about 0.6 GiB on the H200) fails context creation with
  ``out of memory``; ``plan_client`` refuses it with the fix.
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25`` gave the client 32 of 132 SMs (``compute_share``).

The daemon's life cycle (``ensure_daemon`` / ``stop_daemon``) belongs to ``serve-app run``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from serve_app import env
from serve_app.config.args import Enforcement
from serve_app.config.deploy import check_limit_value
from serve_app.errors import StartupError
from serve_app.gpu import devices, nvml

logger = logging.getLogger("serve_app")

__all__ = ["Enforcement", "ensure_daemon", "plan_client", "stop_daemon", "verify_client"]
PIPE_VAR = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VAR = "CUDA_MPS_LOG_DIRECTORY"
LIMIT_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
THREADS_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # the driver's default when PIPE_VAR is unset
CONTROL_BINARY = "nvidia-cuda-mps-control"
MIB = 1 << 20
# CUDA's context alone is about 0.6 GiB on an H200; a limit below it fails context creation.
MIN_LIMIT_BYTES = 1 << 30
CUDA_ERROR_NOT_INITIALIZED = 3
TORCH_HINT = "or set memory.enforcement: torch (the PyTorch cap alone, no MPS)"


def _gib(n: int) -> str:
    from serve_app.gpu.budget import format_bytes  # imports torch: only on a replica's start

    return format_bytes(n)


def uses_mps(enforcement: str) -> bool:
    """Whether replicas in this mode are MPS clients with a driver limit."""
    return enforcement in ("mps", "both")


# ---- the limit's text ---------------------------------------------------------------------


def format_limit(limit_bytes: int) -> str:
    """The limit for a client's device 0, in whole MiB (the driver ignores a bare byte count)."""
    return f"0={limit_bytes // MIB}M"


# ---- the daemon -----------------------------------------------------------------------------


def pipe_directory() -> str:
    """The pipe directory clients of this process's environment use."""
    return env.get(PIPE_VAR) or DEFAULT_PIPE_DIR


def _control(
    pipe_dir: str, command: str, timeout_s: float = 10.0
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which(CONTROL_BINARY)
    if binary is None:
        raise FileNotFoundError(CONTROL_BINARY)
    return subprocess.run(
        [binary],
        input=command + "\n",
        env=dict(os.environ, **{PIPE_VAR: pipe_dir}),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def trust_problem(pipe_dir: str, log_dir: str | None, allowed: frozenset[int]) -> str | None:
    """Why the daemon at ``pipe_dir`` must not be adopted, or None: its pipe directory, control
    socket or PID file belongs to a uid outside ``allowed`` (root and this user), the PID runs as
    one, or ``log_dir`` does. Any local user can create /tmp/nvidia-mps with a socket and a PID
    file; replicas would then adopt a daemon that is not the driver's."""
    pipe = Path(pipe_dir)
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    named = [(pipe, "pipe directory"), (pipe / "control", "control socket"), (pid_file, "PID file")]
    if log_dir:
        named.append((Path(log_dir), f"log directory ({LOG_VAR})"))
    for path, what in named:
        try:
            uid = path.lstat().st_uid
        except OSError:
            continue  # absent: daemon_answers decides
        if uid not in allowed:
            return f"its {what} {path} belongs to uid {uid}"
    import psutil

    try:
        pid = int(pid_file.read_text().strip())
        uid = psutil.Process(pid).uids().real
    except (OSError, ValueError, psutil.Error):
        return None  # no such PID here (another PID namespace): the files decide
    return f"its PID {pid} runs as uid {uid}" if uid not in allowed else None


def refuse_untrusted(
    pipe_dir: str, log_dir: str | None, allowed: frozenset[int] | None = None
) -> None:
    """Raise StartupError when trust_problem finds one (``allowed``: root and this user)."""
    allowed = allowed if allowed is not None else frozenset({0, os.getuid()})
    problem = trust_problem(pipe_dir, log_dir, allowed)
    if problem:
        raise StartupError(
            f"the MPS control daemon at {pipe_dir} is not adopted: {problem}, neither root "
            f"nor you (uid {os.getuid()}). Point {PIPE_VAR} (and {LOG_VAR}) at directories you "
            f"own, where serve-app run starts its own daemon, {TORCH_HINT}"
        )


def daemon_answers(pipe_dir: str) -> bool:
    """Whether an MPS control daemon answers at ``pipe_dir``: its control socket is there and
    the PID its PID file names is alive; where that PID cannot be seen (another PID namespace),
    its control program is asked, a few times, since the daemon serves one control client at a
    time (four replicas asking at once on the H200: one was turned away)."""
    pipe = Path(pipe_dir)
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    if not (pipe / "control").exists() or not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
        return True
    except PermissionError:
        return True  # alive, another user's (trust_problem refuses it unless root's)
    except (OSError, ValueError):
        pass
    for _ in range(5):
        try:
            if _control(pipe_dir, "get_server_list").returncode == 0:
                return True
        except (OSError, subprocess.TimeoutExpired):
            return False
        time.sleep(0.2)
    return False


@dataclass
class Daemon:
    """The MPS control daemon that ``serve-app run`` uses; ``started`` when it started it."""

    pipe_dir: str
    log_dir: str | None
    started: bool
    scratch: str | None = None

    def describe(self) -> str:
        who = (
            "started by serve-app, stopped with it"
            if self.started
            else "already running, left running"
        )
        return f"MPS control daemon at {self.pipe_dir} ({who})"


def node_refusal() -> str | None:
    """Why this node cannot run MPS (no GPU, MIG, a prohibited compute mode), or None."""
    reasons = nvml.mps_blockers()
    if isinstance(reasons, nvml.NvmlError):
        return f"NVML cannot describe the GPUs ({reasons.message})"
    return "; ".join(reasons) if reasons else None


def ensure_daemon() -> Daemon:
    """Find the MPS control daemon at this environment's pipe directory, or start one with its
    own pipe and log directories (exported, so that Ray's processes inherit them). Raises
    StartupError saying why MPS cannot run here, with the ``enforcement: torch`` way out."""
    why = node_refusal()
    if why:
        raise StartupError(
            f"memory.enforcement needs MPS, which cannot run here: {why}; {TORCH_HINT}"
        )
    if shutil.which(CONTROL_BINARY) is None:
        raise StartupError(
            f"memory.enforcement needs MPS, but {CONTROL_BINARY} is not on PATH (it ships with "
            f"the NVIDIA driver's compute utilities); install it, {TORCH_HINT}"
        )
    pipe = pipe_directory()
    if daemon_answers(pipe):
        refuse_untrusted(pipe, env.get(LOG_VAR))
        return Daemon(pipe_dir=pipe, log_dir=env.get(LOG_VAR), started=False)
    if env.get(PIPE_VAR):  # the operator named a directory: start ours there
        scratch = None
        log_dir = env.get(LOG_VAR) or str(Path(pipe).parent / "mps-log")
        refuse_untrusted(pipe, log_dir)  # directories someone else made first
    else:  # a private directory, so that no other CUDA program here becomes our client
        scratch = tempfile.mkdtemp(prefix="serve-app-mps-")
        pipe, log_dir = str(Path(scratch) / "pipe"), str(Path(scratch) / "log")
    for d in (pipe, log_dir):
        Path(d).mkdir(parents=True, exist_ok=True)
    # No CUDA_VISIBLE_DEVICES for the daemon: it serves every GPU, and each client picks its
    # own with Ray's CUDA_VISIBLE_DEVICES (a daemon that saw only GPU 1 would show it to its
    # clients as device 0, and a client asking for device 1 would see none).
    daemon_env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    daemon_env.update({PIPE_VAR: pipe, LOG_VAR: log_dir})
    try:
        proc = subprocess.run(
            [CONTROL_BINARY, "-d"], env=daemon_env, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StartupError(f"could not start the MPS control daemon: {exc}; {TORCH_HINT}") from None
    if proc.returncode != 0:
        raise StartupError(
            f"{CONTROL_BINARY} -d failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[:500]}; starting MPS needs the GPU's owner "
            f"or root, {TORCH_HINT}"
        )
    deadline = time.monotonic() + 10.0
    while not daemon_answers(pipe):
        if time.monotonic() > deadline:
            raise StartupError(
                f"the MPS control daemon started but does not answer at {pipe}; see its log in "
                f"{log_dir}, {TORCH_HINT}"
            )
        time.sleep(0.1)
    os.environ[PIPE_VAR] = pipe
    os.environ[LOG_VAR] = log_dir
    return Daemon(pipe_dir=pipe, log_dir=log_dir, started=True, scratch=scratch)


def stop_daemon(daemon: Daemon | None) -> None:
    """Quit the daemon if serve-app started it (never one it found running)."""
    if daemon is None or not daemon.started:
        return
    try:
        _control(daemon.pipe_dir, "quit", timeout_s=30.0)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("the MPS control daemon at %s did not quit: %s", daemon.pipe_dir, exc)
    if daemon.scratch:
        shutil.rmtree(daemon.scratch, ignore_errors=True)
    for var, value in ((PIPE_VAR, daemon.pipe_dir), (LOG_VAR, daemon.log_dir)):
        if value is not None and os.environ.get(var) == value:
            del os.environ[var]


# ---- a replica as a client ------------------------------------------------------------------


def driver_initialized() -> bool | None:
    """Whether the CUDA driver was initialised in this process (``cuDeviceGetCount`` answers
    CUDA_ERROR_NOT_INITIALIZED before ``cuInit``, and does not initialise it); None when
    libcuda cannot be loaded."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int()
    return int(lib.cuDeviceGetCount(ctypes.byref(count))) != CUDA_ERROR_NOT_INITIALIZED


@dataclass(frozen=True)
class ClientPlan:
    """What a replica set before CUDA initialised: its limit and thread percentage."""

    enforcement: str
    limit_bytes: int
    limit_value: str
    thread_percentage: int | None
    pipe_dir: str
    gpu_uuid: str


def _visible_gpu() -> str:
    """The one GPU Ray gave this process, as CUDA_VISIBLE_DEVICES names it."""
    visible = [v.strip() for v in (env.get("CUDA_VISIBLE_DEVICES") or "").split(",") if v.strip()]
    if len(visible) != 1:
        raise StartupError(
            f"memory.enforcement mps needs a replica to see exactly one GPU, but "
            f"CUDA_VISIBLE_DEVICES is {env.get('CUDA_VISIBLE_DEVICES')!r}; give the deployment "
            f"ray_actor_options.num_gpus in (0, 1], {TORCH_HINT}"
        )
    return visible[0]


def plan_client(
    enforcement: str, num_gpus: float, memory_fraction: float | None, compute_share: float | None
) -> ClientPlan | None:
    """Set this replica's MPS limit (and thread percentage) in its environment, before anything
    initialises CUDA; None in ``torch`` mode. Raises StartupError when the limit could not
    take effect: the driver is already initialised, no daemon answers, the share is too small."""
    inherited = env.get(LIMIT_VAR)
    if not uses_mps(enforcement):
        if inherited:
            problems = check_limit_value(inherited)
            if problems:
                raise StartupError(f"{LIMIT_VAR}={inherited!r}: " + "; ".join(problems))
        return None
    if num_gpus <= 0:
        raise StartupError(
            f"memory.enforcement {enforcement} needs a GPU share: set "
            f"ray_actor_options.num_gpus (e.g. 0.25), {TORCH_HINT}"
        )
    if driver_initialized():
        raise StartupError(
            "CUDA was initialised in this replica's process before serve_app could set its MPS "
            "memory limit, so the driver would ignore the limit (it reads it once, at cuInit). "
            "Something imported at module level touched CUDA: move it into the adapter's setup, "
            + TORCH_HINT
        )
    pipe = pipe_directory()
    refuse_untrusted(pipe, env.get(LOG_VAR))
    if not daemon_answers(pipe):
        raise StartupError(
            f"memory.enforcement {enforcement}: no MPS control daemon answers at {pipe} "
            f"({PIPE_VAR}). A client that cannot reach it runs without any limit, so this replica "
            "will not start. `serve-app run` starts one before Ray; on a cluster, start it (as "
            "the node's admin) before Ray, with the same pipe directory in Ray's environment, "
            + TORCH_HINT
        )
    visible = _visible_gpu()
    memory = devices.device_memory_for_visible(visible)
    if isinstance(memory, nvml.NvmlError):
        raise StartupError(
            f"cannot read GPU {visible!r}'s memory through NVML to size the MPS limit: "
            f"{memory.message}"
        )
    # CUDA's own total is NVML's less the driver's reserved bytes; the limit must not exceed the
    # budget that plan_budget later computes from CUDA's total.
    usable = memory.total_bytes - memory.reserved_bytes
    share = memory_fraction if memory_fraction is not None else num_gpus
    limit_bytes = (int(share * usable) // MIB) * MIB
    if limit_bytes < MIN_LIMIT_BYTES:
        raise StartupError(
            f"this replica's MPS limit would be {_gib(limit_bytes)} ({share} of "
            f"{_gib(usable)}), below the {_gib(MIN_LIMIT_BYTES)} a CUDA context "
            "and a model need: raise ray_actor_options.num_gpus or memory.memory_fraction"
        )
    value = format_limit(limit_bytes)
    if inherited and inherited != value:
        logger.warning("%s=%r from the environment replaced by %r", LIMIT_VAR, inherited, value)
    os.environ[LIMIT_VAR] = value
    threads = None
    if compute_share is not None:
        threads = max(1, min(100, round(compute_share * 100)))
        os.environ[THREADS_VAR] = str(threads)
    return ClientPlan(enforcement, limit_bytes, value, threads, pipe, memory.uuid)


def verify_client(plan: ClientPlan, pid: int, uuid: str, free_bytes: int) -> None:
    """After the CUDA context exists: NVML lists ``pid`` as an MPS client of ``uuid``, and
    CUDA's free bytes are within the limit (they are the device's without one). Raises
    StartupError naming the silent failure that happened otherwise."""
    clients = nvml.mps_client_pids(uuid)
    if isinstance(clients, nvml.NvmlError):
        raise StartupError(
            f"cannot check through NVML that this replica is an MPS client: {clients.message}"
        )
    if pid not in clients:
        raise StartupError(
            f"this replica (pid {pid}) is not an MPS client of GPU {uuid}, so its limit does not "
            f"apply: the daemon at {plan.pipe_dir} did not take it (was it started after CUDA "
            "initialised here, or does the daemon use another pipe directory?); " + TORCH_HINT
        )
    if free_bytes > plan.limit_bytes:
        raise StartupError(
            f"the MPS limit {plan.limit_value} is not in force: CUDA reports "
            f"{_gib(free_bytes)} free, more than the limit of "
            f"{_gib(plan.limit_bytes)} (a limit naming a device the client cannot see "
            f"drops every limit); {TORCH_HINT}"
        )
    if uuid != plan.gpu_uuid:
        logger.warning(
            "MPS limit sized from NVML's %s, but CUDA runs this replica on %s", plan.gpu_uuid, uuid
        )
