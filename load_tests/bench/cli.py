"""The command line: parse, check, wait for the server, sweep the rates, write the results."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from load_tests import payloads
from load_tests.bench.client import PreparedRequest, build_requests, make_client
from load_tests.bench.output import ProgressPrinter, bench_document, format_table, plot_results
from load_tests.bench.run import RateResult, run_rate
from load_tests.bench.stats import DEFAULT_MODELS, is_loopback_url, origin_url
from load_tests.harness.meta import PROVENANCE_HELP, run_meta
from load_tests.harness.nvml import MemorySampler
from load_tests.harness.plots import PlotsUnavailable


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rates {text!r} must be comma-separated numbers, e.g. 50,100,200"
        ) from None
    if not rates or any(r <= 0 or not math.isfinite(r) for r in rates):
        raise argparse.ArgumentTypeError(f"rates {text!r} must all be positive, e.g. 50,100,200")
    return rates


PROG = "python -m load_tests.bench"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Open-loop Poisson load generator; latency measured from scheduled send time.",
        epilog="--out also draws bench.png and memory.png when the extra 'plots' (matplotlib) is "
        "installed. " + PROVENANCE_HELP,
    )
    p.add_argument(
        "--url", required=True, help="full endpoint URL, e.g. http://127.0.0.1:8000/v1/embeddings"
    )
    p.add_argument("--kind", choices=("embeddings", "image"), default="embeddings")
    p.add_argument(
        "--model",
        default=None,
        help="model name (default: all-MiniLM-L6-v2 / resnet50, what serve-app run serves)",
    )
    rates = p.add_mutually_exclusive_group(required=True)
    rates.add_argument("--rate", type=float, help="one offered rate in requests/s")
    rates.add_argument("--rates", type=_parse_rates, help="sweep, e.g. 50,100,200")
    p.add_argument("--duration-s", type=float, default=30.0, help="measured seconds per rate")
    p.add_argument("--warmup-s", type=float, default=5.0, help="unmeasured seconds before each")
    p.add_argument("--pause-s", type=float, default=1.0, help="idle seconds between rates")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--texts", choices=payloads.TEXT_KINDS, default="short")
    p.add_argument("--batch", type=int, default=1, help="inputs per request")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--image-format", choices=payloads.IMAGE_FORMATS, default="jpeg")
    p.add_argument("--binary", action="store_true", help="raw image body instead of base64 JSON")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--max-connections", type=int, default=256)
    p.add_argument("--max-in-flight", type=int, default=2048)
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-request httpx timeout")
    p.add_argument(
        "--max-requests",
        type=int,
        default=200_000,
        help="hard cap on scheduled requests over the whole sweep",
    )
    p.add_argument(
        "--max-time-s", type=float, default=3600.0, help="hard cap on the sweep's wall time"
    )
    p.add_argument(
        "--memory-url",
        default=None,
        help="GET URL for per-replica memory (default: <origin>/v1/memory; 'none' disables)",
    )
    p.add_argument("--memory-interval-s", type=float, default=1.0)
    p.add_argument("--no-nvml", action="store_true", help="do not sample NVML in this process")
    p.add_argument(
        "--wait-ready-s",
        type=float,
        default=0.0,
        help="first wait up to this long for GET <origin>/readyz to return 200",
    )
    p.add_argument("--out", type=Path, default=None, help="directory for bench.json and PNGs")
    p.add_argument("--raw", action="store_true", help="include per-request records in bench.json")
    p.add_argument(
        "--max-error-rate",
        type=float,
        default=None,
        help="exit 1 when any rate's error fraction exceeds this (e.g. 0 or 0.01)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow non-loopback targets (only for hosts you are allowed to load)",
    )
    return p


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> list[float]:
    rates: list[float] = a.rates if a.rates is not None else [a.rate]
    if a.rate is not None and (a.rate <= 0 or not math.isfinite(a.rate)):
        p.error(f"--rate {a.rate} must be positive")
    if a.duration_s <= 0 or a.warmup_s < 0 or a.pause_s < 0:
        p.error("--duration-s must be > 0 and --warmup-s/--pause-s >= 0")
    if min(a.max_connections, a.max_in_flight, a.batch, a.max_requests) < 1:
        p.error("--max-connections, --max-in-flight, --batch and --max-requests must be >= 1")
    urls = [a.url] + ([a.memory_url] if a.memory_url else [])
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https"):
            p.error(f"URL {url!r} must start with http:// or https://")
        if not a.allow_remote and not is_loopback_url(url):
            p.error(
                f"URL {url!r} is not loopback (127.0.0.0/8, localhost, [::1]); "
                "pass --allow-remote if you are allowed to load that host"
            )
    expected = sum(r * (a.warmup_s + a.duration_s) for r in rates)
    if expected > a.max_requests:
        p.error(
            f"the sweep schedules about {expected:.0f} requests, over --max-requests "
            f"{a.max_requests}; lower --rates/--duration-s or raise --max-requests"
        )
    planned_s = sum(a.warmup_s + a.duration_s for _ in rates) + a.pause_s * (len(rates) - 1)
    if planned_s > a.max_time_s:
        p.error(
            f"the sweep needs about {planned_s:.0f} s, over --max-time-s {a.max_time_s:g}; "
            "shorten --duration-s or raise --max-time-s"
        )
    if a.binary and a.batch != 1:
        p.error(f"--binary sends one raw image per request; drop --binary or --batch {a.batch}")
    return rates


def _wait_ready(url: str, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            try:
                if http.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    return False


async def _sweep(
    a: argparse.Namespace, rates: list[float], requests: Sequence[PreparedRequest]
) -> list[RateResult]:
    results: list[RateResult] = []
    start = time.monotonic()
    left_requests = a.max_requests
    progress = None if a.no_progress else ProgressPrinter()
    async with make_client(a.max_connections, a.timeout_s) as http:
        for i, rate in enumerate(rates):
            left_s = a.max_time_s - (time.monotonic() - start)
            if left_s <= 0 or left_requests <= 0:
                print(
                    f"stopping before {rate:g}/s: --max-time-s or --max-requests reached",
                    file=sys.stderr,
                )
                break
            res = await run_rate(
                requests,
                rate,
                a.duration_s,
                warmup_s=a.warmup_s,
                seed=a.seed + i,
                max_in_flight=a.max_in_flight,
                timeout_s=a.timeout_s,
                max_requests=left_requests,
                time_limit_s=left_s,
                client=http,
                on_progress=progress,
            )
            results.append(res)
            left_requests -= res.scheduled
            if i + 1 < len(rates) and a.pause_s > 0:
                await asyncio.sleep(a.pause_s)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep. Exit codes: 0 done, 1 --max-error-rate exceeded, 2 bad arguments,
    3 server not ready within --wait-ready-s.

    bench.json layout: {harness.meta.run_meta's fields (commit, dirty, dirty_files,
    code_commit, host, cpu_count, gpu_name, utc, command), schema_version, created_unix_s,
    config{...flags}, rates[{RateSummary fields, seed, started_unix_s, ended_unix_s,
    scheduled, truncated, raw?[Record]}],
    memory{samples[{t_unix_s, source: "nvml"|"server", ...}], notes[str]},
    verdict{max_error_rate, worst_error_rate, passed}}.
    """
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.memory_url is None:
        a.memory_url = origin_url(a.url, "/v1/memory")
    elif a.memory_url.lower() in ("", "none"):
        a.memory_url = None
    rates = _check_args(parser, a)
    if a.wait_ready_s > 0 and not _wait_ready(origin_url(a.url, "/readyz"), a.wait_ready_s):
        print(
            f"server not ready: GET {origin_url(a.url, '/readyz')} gave no 200 within "
            f"{a.wait_ready_s:g} s; start it or raise --wait-ready-s",
            file=sys.stderr,
        )
        return 3
    try:
        requests = build_requests(
            a.url,
            a.kind,
            model=a.model,
            texts=a.texts,
            batch=a.batch,
            image_size=a.image_size,
            image_format=a.image_format,
            binary=a.binary,
            top_k=a.top_k,
            seed=a.seed,
        )
    except ValueError as exc:
        parser.error(str(exc))
    run = run_meta(PROG, argv)
    sampler = None
    if a.memory_url or not a.no_nvml:
        sampler = MemorySampler(a.memory_url, not a.no_nvml, a.memory_interval_s).start()
    try:
        results = asyncio.run(_sweep(a, rates, requests))
    finally:
        memory = sampler.stop() if sampler is not None else None
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    config.update(
        rates=rates,
        model=a.model or DEFAULT_MODELS[a.kind],
        httpx_version=httpx.__version__,
        python_version=sys.version.split()[0],
    )
    doc = bench_document(
        config, results, memory, raw=a.raw, max_error_rate=a.max_error_rate, run=run
    )
    print(format_table([r.summary for r in results]))
    for note in memory.notes if memory is not None else []:
        print(f"note: {note}", file=sys.stderr)
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "bench.json").write_text(json.dumps(doc, indent=1, allow_nan=False))
        title = f"{a.kind} {a.url} batch={a.batch}"
        try:
            written = [str(p) for p in plot_results(results, memory, a.out, title)]
        except PlotsUnavailable as exc:
            written = []
            print(f"no plots: {exc}", file=sys.stderr)
        print(f"wrote {', '.join([str(a.out / 'bench.json'), *written])}")
    verdict = doc["verdict"]
    if not verdict["passed"]:
        print(
            f"FAIL: worst error rate {verdict['worst_error_rate']:.4f} exceeds "
            f"--max-error-rate {a.max_error_rate:g}",
            file=sys.stderr,
        )
        return 1
    return 0
