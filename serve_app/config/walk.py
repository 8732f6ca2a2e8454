"""One walk over a deploy config's applications and deployments, for the checks that read each
one.

A config may not have been validated yet when these run (``serve-app check`` reports every
problem at once), so entries that are not mappings are skipped here and reported by
``config/deploy.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

SERVE_DEFAULT_APP_NAME = "default"  # ray/serve/_private/constants.py


@dataclass(frozen=True)
class Deployment:
    app_index: int
    dep_index: int
    app: dict[str, Any]
    dep: dict[str, Any]

    @property
    def name(self) -> str:
        """``application/deployment``, as Serve's status names it."""
        return f"{self.app.get('name', SERVE_DEFAULT_APP_NAME)}/{self.dep.get('name', '?')}"

    @property
    def path(self) -> str:
        """Where it sits in the file, e.g. ``applications[1].deployments[0]``."""
        return f"applications[{self.app_index}].deployments[{self.dep_index}]"

    @property
    def actor_options(self) -> dict[str, Any]:
        """``ray_actor_options`` ({} when absent or not a mapping); edits reach the config."""
        opts = self.dep.get("ray_actor_options")
        return opts if isinstance(opts, dict) else {}


def applications(doc: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index in the file, application) of every application that is a mapping."""
    for i, app in enumerate(doc.get("applications") or []):
        if isinstance(app, dict):
            yield i, app


def deployments(doc: dict[str, Any]) -> Iterator[Deployment]:
    """Every deployment of every application, in file order."""
    for i, app in applications(doc):
        for j, dep in enumerate(app.get("deployments") or []):
            if isinstance(dep, dict):
                yield Deployment(i, j, app, dep)
