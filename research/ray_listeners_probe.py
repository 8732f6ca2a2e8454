"""What a one-node Ray 2.60 with token auth listens on, and which listeners answer HTTP without
the token: Ray's default (``ray.init`` swaps 127.0.0.1 for the routable IP, as every
``ray start`` node does) against serve-app's loopback node (ray_compat.keep_node_on_loopback).
The evidence behind docs/security.md's "Ray's control plane" table.

Usage (one mode per process: Ray reads the switch when it is imported):
    python -m research.ray_listeners_probe --mode routable --out routable.json
    python -m research.ray_listeners_probe --mode loopback --out loopback.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import time
from pathlib import Path


def probe(mode: str) -> dict[str, object]:
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    import httpx
    import ray

    from serve_app.ops import listeners
    from serve_app.startup import ray_compat

    if mode == "loopback":
        ray_compat.keep_node_on_loopback()
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")

    @ray.remote
    class Actor:
        def ping(self) -> int:
            return os.getpid()

    actor = Actor.remote()  # type: ignore[attr-defined]
    ray.get(actor.ping.remote())
    time.sleep(3.0)  # the agents' late listeners
    rows = []
    for item in listeners.listening_sockets(os.getpid()):
        wild = item.ip in ("0.0.0.0", "::") or item.ip.startswith("::ffff:")
        host = "127.0.0.1" if wild else item.ip
        try:  # GET only: nothing is submitted
            status: int | str = httpx.get(f"http://{host}:{item.port}/", timeout=3.0).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__  # a gRPC port answers HTTP/1.1 with a protocol error
        rows.append(
            {
                "listener": item.describe(),
                "beyond_loopback": not listeners.is_loopback_ip(item.ip),
                "http_get_without_token": status,
            }
        )
    ray.shutdown()
    return {"ray_version": ray.__version__, "mode": mode, "listeners": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["routable", "loopback"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    a = parser.parse_args()
    doc = probe(a.mode)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
