"""Shared by the docs tests: the repository root and benchmarks/render.py, loaded by path (it is
a script beside the results, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_render() -> ModuleType:
    path = ROOT / "benchmarks" / "render.py"
    spec = importlib.util.spec_from_file_location("benchmarks_render", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def render() -> ModuleType:
    return load_render()
