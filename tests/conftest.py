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


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before -m's selection reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``ray_session`` every test that uses the session's Ray cluster
    (tests/integration/conftest.py): scripts/test.sh runs those in one pytest, in file order,
    and the rest (unit tests, and the commands that start a Ray of their own, as a user's
    would) in a second one beside it; ``alone`` the tests it runs after both, by themselves."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray_session)
        # Kills and hangs under load, judged to the request: run after the side-by-side runs,
        # alone on the cores (a SIGKILL beside the other run gave two 500s once).
        if item.path.name.startswith("test_reliability"):
            item.add_marker(pytest.mark.alone)
