"""Group a py-spy ``--format raw`` profile of a replica into serve_app's steps.

    python -m research.pyspy_buckets PROFILE.txt [--rate-hz 100 --duration-s 10]

Prints each step's share of the wall time (samples / (rate x duration)); with ``--gil`` profiles
that is the share of time the step held the GIL.
"""

from __future__ import annotations

import argparse
import collections
import json

BUCKETS = (  # first match wins, tested against the whole stack
    ("model predict", "predict (serve_app"),
    ("JSON response render", "render (starlette/responses"),
    ("adapter.decode", "decode (serve_app"),
    ("adapter.encode", "encode (serve_app"),
    ("batcher", "serve_app/batcher"),
    ("serve_app other", "serve_app"),
    ("Ray Serve / ASGI", ("ray/serve", "starlette", "fastapi", "uvicorn")),
)


def bucket(stack: str) -> str:
    for name, needle in BUCKETS:
        needles = needle if isinstance(needle, tuple) else (needle,)
        if any(n in stack for n in needles):
            return name
    return "other"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("profile")
    p.add_argument("--rate-hz", type=float, default=100.0)
    p.add_argument("--duration-s", type=float, default=10.0)
    a = p.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    for line in open(a.profile):
        stack, _, n = line.rstrip().rpartition(" ")
        counts[bucket(stack)] += int(n)
    possible = a.rate_hz * a.duration_s
    shares = {k: round(v / possible, 4) for k, v in counts.most_common()}
    print(json.dumps({"samples": sum(counts.values()), "possible": possible, "share": shares}))


if __name__ == "__main__":
    main()
