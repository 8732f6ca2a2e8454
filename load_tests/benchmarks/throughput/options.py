"""The command line, core lists, and the run's configuration (GPU defaults, or the CPU dry run)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from load_tests.benchmarks.throughput.payload import ENCODINGS, MODELS, TEXT_WORKLOADS
from load_tests.harness.meta import PROVENANCE_HELP, ROOT

PROG = "python -m load_tests.benchmarks.throughput"
# "serve": serve_app; "noop": plain Ray Serve's no-op; then the peers (MiniLM only).
PHASES: tuple[str, ...] = ("ceiling", "client", "serve", "noop", "ray_serve_batch", "litserve")
DEFAULT_WRK = str(ROOT / ".tools" / "wrk")  # make-tools.sh puts it there; carried to the host


def parse_cores(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> [0, 1, 2, 3, 8, 10, 11] (sorted, unique)."""
    cores: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"core list {text!r}: {part!r} is not N or N-M") from None
        if first < 0 or last < first:
            raise ValueError(f"core list {text!r}: {part!r} is not an ascending range")
        cores.update(range(first, last + 1))
    if not cores:
        raise ValueError(f"core list {text!r} is empty")
    return sorted(cores)


def format_cores(cores: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``"0-3,8"``."""
    out: list[str] = []
    ordered = sorted(set(cores))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def sibling_groups(
    available: Sequence[int], siblings_of: Callable[[int], set[int]]
) -> list[list[int]]:
    """The usable CPUs grouped by physical core (hyperthreads together), in CPU order."""
    groups: list[list[int]] = []
    seen: set[int] = set()
    for cpu in sorted(available):
        if cpu in seen:
            continue
        group = sorted((siblings_of(cpu) | {cpu}) & set(available))
        seen.update(group)
        groups.append(group)
    return groups


def default_cores(
    available: Sequence[int], siblings_of: Callable[[int], set[int]] | None = None
) -> tuple[list[int], list[int]]:
    """The first half of the physical cores for the server, the second half for the clients,
    each with its hyperthread siblings, so that no physical core is shared (on many hosts CPU
    n and n + N/2 are siblings: "first half of the CPU numbers" would split every core). One
    core each on a 2-core machine; both the same core on one."""
    groups = sibling_groups(available, siblings_of or thread_siblings)
    if len(groups) < 2:
        cores = sorted(available)
        return cores, cores
    half = len(groups) // 2
    return sorted(c for g in groups[:half] for c in g), sorted(c for g in groups[half:] for c in g)


def thread_siblings(cpu: int) -> set[int]:
    """CPUs sharing ``cpu``'s physical core, from sysfs ({cpu} when it cannot be read)."""
    path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
    try:
        return set(parse_cores(path.read_text().strip()))
    except (OSError, ValueError):
        return {cpu}


def shared_physical_cores(
    server: Sequence[int], client: Sequence[int], siblings_of: Callable[[int], set[int]]
) -> list[tuple[int, int]]:
    """(server CPU, client CPU) pairs on the same physical core (or the same CPU)."""
    client_set = set(client)
    return sorted((s, c) for s in server for c in sorted((siblings_of(s) | {s}) & client_set))


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} must be comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must list integers >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Maximum throughput (wrk) and open-loop latency of serve_app per replica "
        "count, beside the clients' own ceiling, plain Ray Serve's no-op and the in-process "
        "model. Writes DIR/throughput.json and DIR/meta.json.",
        epilog=PROVENANCE_HELP + " (in meta.json)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--models", default=None, help="comma-separated: minilm,resnet50")
    p.add_argument("--replicas", type=_ints, default=None, help="replica counts (4,8,12,16)")
    p.add_argument(
        "--inputs-per-request", type=_ints, default=None, help="inputs per request (1,16)"
    )
    p.add_argument("--encoding-format", choices=ENCODINGS, default="float", help="MiniLM output")
    p.add_argument(
        "--workload",
        choices=TEXT_WORKLOADS,
        default="short",
        help="MiniLM's texts: short (one body), or mixed (64 bodies of queries or passages, "
        "load_tests.workloads.texts); rows give tokens/s",
    )
    p.add_argument("--server-cores", default=None, help="e.g. 0-15 (default: first half)")
    p.add_argument("--client-cores", default=None, help="e.g. 16-31 (default: second half)")
    p.add_argument("--duration-s", type=float, default=None, help="seconds per wrk/open-loop run")
    p.add_argument("--connections", type=_ints, default=None, help="wrk tries (64,256)")
    p.add_argument("--openloop-fraction", type=float, default=0.8, help="of the best wrk rate")
    p.add_argument("--openloop-connections", type=int, default=None, help="in all (512)")
    p.add_argument("--openloop-procs", type=int, default=None, help="default: one per core")
    p.add_argument(
        "--max-send-lag-p99-ms",
        type=float,
        default=None,
        help="the open-loop client keeps its schedule when its sends are at most this late at "
        "p99 (5; 25 with --quick, which runs on loaded machines such as CI's 2 cores)",
    )
    p.add_argument("--constant-rate", action="store_true", help="evenly spaced, not Poisson")
    p.add_argument("--ceiling-duration-s", type=float, default=None, help="client ceiling points")
    p.add_argument("--mps", action="store_true", help="run the replicas under an MPS daemon")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu", default="0", help="CUDA_VISIBLE_DEVICES for every GPU process")
    p.add_argument(
        "--replica-share",
        type=float,
        default=None,
        help="num_gpus of every replica (default: what fits all replicas on one GPU); e.g. "
        "--gpu 0,1 --replica-share 0.25 --replicas 4,8 packs 4 on one GPU, then 4 on each",
    )
    p.add_argument("--quick", action="store_true", help="tiny durations (the CPU dry run)")
    p.add_argument("--wrk", default=DEFAULT_WRK, help="wrk binary (else wrk on PATH, else none)")
    p.add_argument("--max-time-s", type=float, default=None, help="wall-time budget (540)")
    p.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}"
    )
    p.add_argument(
        "--merge", action="store_true", help="keep rows of DIR/throughput.json not re-measured"
    )
    p.add_argument(
        "--peer-max-batch-size", type=int, default=64, help="the peers' max_batch_size (64)"
    )
    p.add_argument(
        "--peer-batch-wait-s",
        type=float,
        default=0.01,
        help="the peers' batch_wait_timeout_s / batch_timeout (0.01, Ray Serve's default)",
    )
    p.add_argument(
        "--serve-app-layers",
        type=int,
        default=None,
        help="serve_app's MiniLM with this many encoder layers (dummy weights); 0 (the "
        "embedding layer, then pooling) makes the forward nearly free, so its rows measure "
        "serve_app's own path against the no-op "
        "(with --phases client,serve,noop: the other setups keep the full model)",
    )
    p.add_argument("--_worker", choices=("ceiling", "serve"), help=argparse.SUPPRESS)
    p.add_argument("--_spec", help=argparse.SUPPRESS)
    return p


def make_config(a: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Every setting of the run, with the GPU defaults or, on the CPU, the dry run's."""
    cpu = a.device == "cpu"
    small = cpu or a.quick
    models = [m.strip() for m in (a.models or ("minilm" if cpu else "minilm,resnet50")).split(",")]
    phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    bad = [m for m in models if m not in MODELS] + [x for x in phases if x not in PHASES]
    if bad or not models:
        parser.error(f"unknown model or phase {bad}: models {sorted(MODELS)}, phases {PHASES}")
    available = sorted(os.sched_getaffinity(0))
    server, client = default_cores(available)
    try:
        server = parse_cores(a.server_cores) if a.server_cores else server
        client = parse_cores(a.client_cores) if a.client_cores else client
    except ValueError as exc:
        parser.error(str(exc))
    missing = sorted(set(server + client) - set(available))
    if missing:
        parser.error(f"cores {format_cores(missing)} are not usable here ({available})")
    shared = shared_physical_cores(server, client, thread_siblings)
    if not 0 < a.openloop_fraction <= 1:
        parser.error("--openloop-fraction must be in (0, 1]")
    if a.serve_app_layers is not None:
        if a.serve_app_layers < 0:
            parser.error(f"--serve-app-layers {a.serve_app_layers} must be >= 0")
        full = [x for x in phases if x in ("ceiling", "ray_serve_batch", "litserve")]
        if full or "resnet50" in models:
            parser.error(
                f"--serve-app-layers changes serve_app's MiniLM only: drop {full or ['resnet50']} "
                "(e.g. --models minilm --phases client,serve,noop)"
            )
    if a.max_send_lag_p99_ms is not None and not a.max_send_lag_p99_ms > 0:
        parser.error(f"--max-send-lag-p99-ms {a.max_send_lag_p99_ms} must be > 0")
    if a.peer_max_batch_size < 1 or a.peer_batch_wait_s < 0:
        parser.error("--peer-max-batch-size must be >= 1 and --peer-batch-wait-s >= 0")
    if a.replica_share is not None and not 0 < a.replica_share <= 1:
        parser.error(f"--replica-share {a.replica_share} must be in (0, 1]")
    return {
        "device": a.device,
        "gpu": a.gpu,
        "replica_share": a.replica_share,
        "quick": a.quick,
        "serve_app_layers": a.serve_app_layers,
        "models": models,
        "replicas": a.replicas or ([1] if cpu else [4, 8, 12, 16]),
        "inputs_per_request": a.inputs_per_request or ([1] if cpu else [1, 16]),
        "encoding_format": a.encoding_format,
        "workload": a.workload,
        "server_cores": server,
        "client_cores": client,
        "duration_s": a.duration_s or (1.0 if small else 8.0),
        "warmup_s": 0.5 if small else 1.0,
        # Between runs, so that one run's queues drain before the next starts.
        "pause_s": 0.3 if small else 1.0,
        # --quick checks the tool end to end: one wrk connection count, one open-loop rate.
        "connections": a.connections or ([8] if a.quick else [8, 32] if cpu else [64, 256]),
        "openloop_fraction": a.openloop_fraction,
        "openloop_connections": a.openloop_connections or (16 if small else 512),
        "openloop_procs": a.openloop_procs,
        # A loaded machine's scheduler alone delays a send by several ms: --quick only checks
        # the tool end to end, on whatever machine runs it.
        "max_send_lag_p99_ms": a.max_send_lag_p99_ms or (25.0 if a.quick else 5.0),
        "poisson": not a.constant_rate,
        "fixed_rate_without_wrk": 5.0 if cpu else 100.0,
        "ceiling_duration_s": a.ceiling_duration_s or (1.0 if small else 1.5),
        "ceiling_warmup_s": 0.5,
        "ceiling_start_rate": 200.0 if cpu else 50000.0,
        "ceiling_max_rate": 800.0 if cpu else 200000.0,
        # --quick: up to two lower points (a quarter, a sixteenth) when a loaded machine failed.
        "ceiling_max_points": 3 if cpu else 4,
        "ceiling_max_bytes_per_s": 2 << 30,  # the first rate tried moves at most this
        "model_batches": {
            "minilm": [1, 8] if cpu else [64, 128, 256, 512, 1024],
            "resnet50": [1, 2] if cpu else [32, 64, 128, 256],
        },
        "model_min_s": 0.3 if cpu else 1.0,
        # The mixed workload's ceiling on the CPU: the first 8 texts (a pass of 64 takes ~1.5 s
        # there); on a GPU every text of the bodies.
        "ceiling_max_texts": 8 if cpu else None,
        "mps": a.mps and not cpu,
        "wrk": a.wrk,
        "max_time_s": a.max_time_s or (160.0 if cpu else 540.0),
        "teardown_reserve_s": 15.0 if cpu else 40.0,
        "deploy_timeout_s": 240.0 if cpu else 180.0,
        "phases": phases,
        "merge": a.merge,
        "peer_max_batch_size": a.peer_max_batch_size,
        "peer_batch_wait_s": a.peer_batch_wait_s,
        "seed": 0,
        "shared_physical_cores": [list(p) for p in shared],
    }
