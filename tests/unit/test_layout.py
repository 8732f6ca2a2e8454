"""The house rules of serve_app's layout, checked on the source: no import circles (lazy imports
count), modules of about 400 lines at most, no model family named in the replica or the OpenAPI
builder, and nothing done at import."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "serve_app"
MAX_LINES = 410  # "about 400"; control/monitor.py's docstring says why it is just over


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """serve_app modules ``path`` imports, at the top or inside functions alike."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_lazy_imports_included() -> None:
    graph = {m: _imports(p) - {m} for m, p in MODULES.items()}
    # A package's __init__ importing its own modules is how a package exports; the circle that
    # counts is between modules.
    for m in graph:
        graph[m] = {d for d in graph[m] if not m.startswith(d + ".")}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_modules_stay_about_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in MODULES.values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_replica_and_the_openapi_builder_name_no_model_family() -> None:
    families = ("embedding", "classif", "minilm", "resnet", "image", "token", "nvjpeg")
    for name in ("serving/replica.py", "serving/openapi.py", "serving/http.py"):
        text = (PACKAGE / name).read_text().lower()
        assert [f for f in families if f in text] == [], name


_IMPORT_EVERYTHING = """
import importlib, json, os, pathlib
import ray, torch  # their own imports set variables (RAY_CLIENT_MODE): not ours to judge
before = dict(os.environ)
root = pathlib.Path("serve_app")
for p in sorted(root.rglob("*.py")):
    if p.name != "__main__.py":
        importlib.import_module(".".join(p.with_suffix("").parts).removesuffix(".__init__"))
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps(changed))
"""


def test_nothing_happens_at_import() -> None:
    """Importing every module (test doubles included) leaves the environment as it was (the one
    thing an import could change without a trace in the code's behaviour)."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_EVERYTHING],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
