"""pyproject.toml against the code: every module serve_app imports is a declared dependency
(found through the installed distributions that provide it), and plotting stays an extra."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Imported only where present, with a fallback when missing: PyPI's torchvision does not
# import beside the CPU torch (serve_app/adapters/image/resnet.py is the fallback model).
OPTIONAL = {"torchvision"}


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    """Normalised distribution names of requirement strings (extras and pins dropped)."""
    out = set()
    for req in requirements:
        match = re.match(r"[A-Za-z0-9._-]+", req)
        assert match, req
        out.add(re.sub(r"[-_.]+", "-", match.group(0)).lower())
    return out


def imported_modules(package: Path) -> set[str]:
    """Top-level names of every absolute import in the package, the standard library left out."""
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != package.name}


def test_every_module_serve_app_imports_is_a_declared_dependency() -> None:
    declared = names(project()["dependencies"])
    providers = importlib.metadata.packages_distributions()
    undeclared = {}
    for module in sorted(imported_modules(ROOT / "serve_app") - OPTIONAL):
        dists = names(providers.get(module, [module]))
        if not dists & declared:
            undeclared[module] = sorted(dists)
    assert undeclared == {}, f"imported by serve_app, not in [project] dependencies: {undeclared}"


def test_matplotlib_is_the_extra_plots_and_not_a_server_dependency() -> None:
    p = project()
    assert "matplotlib" not in names(p["dependencies"])
    assert "matplotlib" not in imported_modules(ROOT / "serve_app")
    assert names(p["optional-dependencies"]["plots"]) == {"matplotlib"}
    assert "serve-app[plots]" in p["optional-dependencies"]["test"]  # the tests draw plots
