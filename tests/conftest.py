"""Shared test set-up: Ray runs with token authentication, as serve-app runs it, with a random
token for this test session (in RAY_AUTH_TOKEN, which every Ray process and subprocess inherits,
so nothing is written under the real HOME)."""

import os
import secrets
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ["RAY_AUTH_MODE"] = "token"
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
