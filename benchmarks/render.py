"""The docs' tables and figures, rendered from the raw results they cite.

    python -m benchmarks.render            # rewrite every marked block in the docs
    python -m benchmarks.render --check    # exit 1, with a diff, where a doc differs from its JSON

A marked block is ``<!-- render:NAME -->...<!-- /render:NAME -->`` in one of ``DOC_GLOBS``;
NAME is a key of ``RENDERERS`` (``benchmarks/tables/``). Block renderers write whole tables (the
markers on lines of their own), inline ones a figure inside a sentence. Everything here reads
``benchmarks/results/`` only: no Ray, no network, no GPU. ``tests/docs`` runs ``--check``'s logic
in CI, so a figure that no longer matches its JSON fails the build.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.tables import BLOCK, RENDERERS, RESULTS, ROOT, Ctx

DOC_GLOBS = ("README.md", "docs/*.md", "benchmarks/*.md", "benchmarks/journal/*.md")
MARKER = re.compile(
    r"<!-- render:(?P<name>[a-z0-9-]+) -->(?P<body>.*?)<!-- /render:(?P=name) -->", re.S
)


def render_text(text: str, doc: Path, results: Path = RESULTS) -> str:
    """``text`` with every marked block re-rendered; raises KeyError for an unknown NAME."""
    ctx = Ctx(doc.resolve(), results)

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise KeyError(f"{doc}: unknown block <!-- render:{name} -->")
        kind, fn = RENDERERS[name]
        body = f"\n{fn(ctx)}\n" if kind == BLOCK else fn(ctx)
        return f"<!-- render:{name} -->{body}<!-- /render:{name} -->"

    return MARKER.sub(one, text)


def docs(root: Path = ROOT) -> list[Path]:
    return sorted({p for g in DOC_GLOBS for p in root.glob(g)})


def used_names(root: Path = ROOT) -> set[str]:
    return {m.group("name") for p in docs(root) for m in MARKER.finditer(p.read_text())}


def diffs(root: Path = ROOT, results: Path = RESULTS) -> dict[Path, str]:
    """Per doc whose marked blocks differ from what the JSON gives: a unified diff."""
    out = {}
    for path in docs(root):
        old = path.read_text()
        new = render_text(old, path, results)
        if new != old:
            rel = str(path.relative_to(root))
            out[path] = "".join(
                difflib.unified_diff(
                    old.splitlines(keepends=True),
                    new.splitlines(keepends=True),
                    f"{rel} (as committed)",
                    f"{rel} (rendered from benchmarks/results)",
                )
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__)
    p.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    a = p.parse_args(argv)
    changed = diffs()
    for path, diff in changed.items():
        if a.check:
            sys.stdout.write(diff)
        else:
            path.write_text(render_text(path.read_text(), path))
            print(f"rewrote {path.relative_to(ROOT)}")
    unused = set(RENDERERS) - used_names()
    if unused:
        print(f"renderers no doc uses: {', '.join(sorted(unused))}", file=sys.stderr)
    if a.check and changed:
        print(f"{len(changed)} doc(s) differ from their JSON: python -m benchmarks.render")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
