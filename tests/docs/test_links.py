"""Every relative link in README.md, docs/*.md and the benchmarks' journals points to a file
(or folder) of this repository that exists, and every #anchor to a heading of its target; every
path they name in backticks under benchmarks/, docs/, configs/ or deploy/ exists; and no doc
sends a reader outside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


DOCS = sorted(
    {
        *ROOT.glob("README.md"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("benchmarks/*.md"),
        *ROOT.glob("benchmarks/journal/*.md"),
    }
)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INDENTED = re.compile(r"(?:^(?: {4}|\t).*\n?)+", re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"`([^`\n]+)`")
PATHLIKE = re.compile(r"^(benchmarks|docs|configs|deploy)/[\w./*-]*$")


def prose(text: str) -> str:
    """The text without fenced or indented code blocks (shell commands, logs, JSON)."""
    return INDENTED.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<!--.*?-->", "", heading).strip().lower()
    text = re.sub(r"[`*]", "", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), re.M)}


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    bad = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {rel(dest)}")
    assert not bad, f"{rel(doc)}:\n" + "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_paths_named_in_backticks_exist(doc: Path) -> None:
    missing = []
    for token in CODE.findall(prose(doc.read_text())):
        token = token.rstrip(".,;:")
        if not PATHLIKE.match(token):
            continue
        if "*" in token:
            if not list(ROOT.glob(token.rstrip("/"))):
                missing.append(token)
        elif not (ROOT / token).exists():
            missing.append(token)
    assert not missing, f"{rel(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_no_doc_points_outside_the_repository(doc: Path) -> None:
    assert "../shared" not in doc.read_text(), f"{rel(doc)} points at ../shared"


def test_the_checks_see_the_docs() -> None:
    names = {rel(d) for d in DOCS}
    assert {"README.md", "docs/architecture.md", "docs/benchmarks.md"} <= names
    assert any(n.startswith("benchmarks/journal/") for n in names)


def test_slug_follows_github() -> None:
    assert slug("Against an earlier commit (run 9)") == "against-an-earlier-commit-run-9"
    assert slug("The app's `args`") == "the-apps-args"
    assert slug("Fast start: warm workers") == "fast-start-warm-workers"
