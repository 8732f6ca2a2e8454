"""Several request bodies in one file, read alike by wrk's Lua script and the open-loop client:
a ``.bodies`` file holds one body a line (JSON bodies, which never hold a raw newline); any
other file is one body, whole. Both clients send the bodies in turn, so each is sent about
equally often."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

BODIES_SUFFIX = ".bodies"


def encode_bodies(bodies: Sequence[bytes]) -> bytes:
    """``bodies`` one a line; ValueError when there is none, or one is empty or holds a line
    break (it would read back as two)."""
    if not bodies:
        raise ValueError("no request bodies")
    for i, body in enumerate(bodies):
        if not body or b"\n" in body or b"\r" in body:
            raise ValueError(f"body {i} is empty or holds a line break: {body[:80]!r}")
    return b"\n".join(bodies) + b"\n"


def read_bodies(path: Path) -> list[bytes]:
    """The bodies of ``path``: its lines for a ``.bodies`` file, else the whole file as one."""
    data = Path(path).read_bytes()
    if Path(path).suffix != BODIES_SUFFIX:
        return [data]
    bodies = [line for line in data.split(b"\n") if line]
    if not bodies:
        raise ValueError(f"{path} holds no request bodies")
    return bodies
