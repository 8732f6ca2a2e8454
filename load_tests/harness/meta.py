"""What a result JSON records about its own run, so that a figure can be traced to the code and
the machine that produced it without anyone adding it by hand.

``run_meta`` gives: ``commit`` (``git rev-parse HEAD`` of this checkout; null when the checkout
has no .git, as on the GPU host, which gets a copy of the working tree), ``dirty`` (tracked files
differ from that commit; untracked files are not counted, since output folders often sit in the
tree) with ``dirty_files``, ``code_commit`` (what the caller says the code is, from the
``SERVE_APP_CODE_COMMIT`` environment variable: the only record of the commit where there is no
.git), ``host``, ``cpu_count``, ``gpu_name`` (NVML's name of the first GPU, null without one),
``utc`` (ISO 8601) and ``command`` (the command line, as it can be typed again).
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: load_tests' parent
RESULTS_DIR = ROOT / "benchmarks" / "results"  # where committed raw results live
CODE_COMMIT_ENV = "SERVE_APP_CODE_COMMIT"
# One line for every tool's --help (argparse epilog).
PROVENANCE_HELP = (
    "The result records the git commit of this checkout, whether tracked files differ from it, "
    "the host, CPUs, GPU, UTC time and command line. Where the checkout has no .git (a copied "
    f"working tree), set {CODE_COMMIT_ENV}=<commit> in the environment: it is recorded as "
    "code_commit."
)
MAX_DIRTY_FILES = 50


def _git(root: Path, *args: str) -> str | None:
    """``git ARGS`` in ``root`` (its output, trailing newlines cut: porcelain lines begin with a
    space), or None without git or a repository."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10.0
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.rstrip("\n") if out.returncode == 0 else None


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None, list[str]]:
    """(commit, dirty, dirty files) of the checkout at ``root``; (None, None, []) when ``root``
    is not the top of a git work tree (no .git, or a folder inside another repository)."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None, None, []
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if status is None:
        return commit, None, []
    files = [line[3:] for line in status.splitlines() if line.strip()]
    return commit, bool(files), files[:MAX_DIRTY_FILES]


def gpu_name() -> str | None:
    """NVML's name of the first GPU; None without a GPU, a driver or pynvml."""
    from load_tests.harness.nvml import nvml_devices

    devices = nvml_devices()
    return str(devices[0]["name"]) if devices else None


def run_meta(
    prog: str,
    argv: Sequence[str] | None = None,
    *,
    root: Path = ROOT,
    gpu: str | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The provenance fields of a result (see the module docstring). ``prog`` is how the tool
    is run (``python -m load_tests.reliability.faults``); ``argv`` its arguments (default
    ``sys.argv[1:]``); ``gpu`` the GPU's name when the caller knows it (else NVML is asked)."""
    commit, dirty, files = git_state(root)
    args = list(sys.argv[1:] if argv is None else argv)
    return {
        "commit": commit,
        "dirty": dirty,
        "dirty_files": files,
        "code_commit": os.environ.get(CODE_COMMIT_ENV) or None,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "gpu_name": gpu if gpu is not None else gpu_name(),
        "utc": (now or datetime.now(UTC)).isoformat(timespec="seconds"),
        "command": " ".join([prog, shlex.join(args)]).strip(),
    }


def machine_info() -> dict[str, Any]:
    """Python, platform, CPUs, the versions of the stack and every GPU (NVML), for a result's
    metadata beside ``run_meta``."""
    from load_tests.harness.nvml import nvml_devices

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
    }
    for mod in ("torch", "torchvision", "transformers", "ray", "httpx", "uvicorn", "starlette"):
        try:
            info[f"{mod}_version"] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing package is recorded, not fatal
            info[f"{mod}_version"] = None
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
    except Exception:  # noqa: BLE001
        info["torch_cuda"] = None
    gpus = nvml_devices()
    info["gpus"] = gpus
    info["gpu_name"] = gpus[0]["name"] if gpus else None
    info["gpu_total_bytes"] = gpus[0]["total_bytes"] if gpus else None
    info["driver_version"] = gpus[0]["driver_version"] if gpus else None
    try:
        import uvloop  # noqa: F401

        info["client_event_loop"] = "uvloop"
    except ImportError:
        info["client_event_loop"] = "asyncio"
    return info


def write_cpu_bench(path: Path, prog: str, rows: list[Any], **settings: Any) -> None:
    """A CPU micro-benchmark's result at ``path``: its provenance (``run_meta``), the host's
    CPUs, its settings and its rows."""
    import orjson

    host = {"cpus": os.cpu_count(), "machine": platform.machine()}
    doc = {"meta": run_meta(prog), "host": host, **settings, "rows": rows}
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
