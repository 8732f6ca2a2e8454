"""The tokens that mark a Ray worker as warm: a replica leaves one in Ray's session directory for
each worker it asks the raylet for (warmpool.Keeper), and a new worker that takes one imports at
the lowest priority (serve_app/preloading.py). A module of its own, light and outside the
preload list: preloading imports it while its own import lock is held.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

# A replica that asks the raylet for warm workers leaves a token each in Ray's session
# directory first (warmpool.Keeper); a worker that takes one imports at the lowest priority.
# Workers Ray starts for an actor waiting now (Serve's controller and proxy, a replica with no
# warm worker left) find none and import as Ray does, at their own priority: at the lowest,
# one of them missed Serve's start-up deadline while the node's daemons kept the core busy.
TOKENS_DIR = "serve_app_warm_tokens"
TOKEN_TTL_S = 30.0


def leave_tokens(session: Path, count: int, now_s: float | None = None) -> None:
    """``count`` tokens for the workers about to be asked for, good for TOKEN_TTL_S; expired
    ones (their workers never came, or came for something else) are removed."""
    now_s = time.time() if now_s is None else now_s
    tokens = session / TOKENS_DIR
    tokens.mkdir(exist_ok=True)
    for old in tokens.iterdir():
        if _expiry_s(old.name) < now_s:
            old.unlink(missing_ok=True)
    expiry_ms = int((now_s + TOKEN_TTL_S) * 1000)
    for _ in range(count):
        (tokens / f"{expiry_ms}-{uuid.uuid4().hex}").touch()


def take_token(session: Path, now_s: float | None = None) -> bool:
    """Take one unexpired token (unlinking it: one worker each); False when there is none."""
    now_s = time.time() if now_s is None else now_s
    try:
        names = sorted(os.listdir(session / TOKENS_DIR))
    except OSError:
        return False
    for name in names:
        if _expiry_s(name) < now_s:
            continue
        try:
            os.unlink(session / TOKENS_DIR / name)
            return True
        except FileNotFoundError:  # another new worker took it first
            continue
    return False


def _expiry_s(name: str) -> float:
    try:
        return int(name.split("-", 1)[0]) / 1000
    except ValueError:
        return 0.0
