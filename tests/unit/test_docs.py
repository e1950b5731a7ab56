"""The front door: README.md stays short (<= 250 lines), shows the setup and run commands first
and CI's test command, its study example plans, and every relative link of README.md and of
the documentation site's pages (docs/) leads to a file that exists, at a heading that exists.
(CI also builds the site with ``mkdocs build --strict``.)"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from scalestudy.config.study import load_study
from scalestudy.plan.planner import plan_points

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _code_blocks(text: str) -> list[str]:
    """The indented (4 spaces) and fenced code blocks of a Markdown text, in order."""
    blocks, current, fenced = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            if fenced:
                blocks.append("\n".join(current))
                current = []
            fenced = not fenced
        elif fenced:
            current.append(line)
        elif line.startswith("    ") and line.strip():
            current.append(line[4:])
        elif current and not line.strip():
            blocks.append("\n".join(current))
            current = []
    return blocks + (["\n".join(current)] if current else [])


def _slug(heading: str) -> str:
    """Python-Markdown's ``toc`` anchor of a heading (what MkDocs links to)."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_is_short_and_starts_with_the_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    first = _code_blocks(README.read_text())[0].splitlines()
    assert [c.split("#")[0].strip() for c in first] == ["make setup", "make run"]
    assert "    make test" in lines  # CI runs the README's test command (.ci/run: make test)


def test_readme_study_is_ten_lines_and_plans(tmp_path):
    text = README.read_text().split("## A study in ten lines", 1)[1]
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert len(block.strip().splitlines()) <= 10
    path = tmp_path / "mini.yaml"
    path.write_text(block)
    points = plan_points(load_study(path))
    assert {p.series for p in points} == {"weak-dp", "strong-dp", "weak-tp"}
    assert all(p.feasible for p in points)


def test_readme_figure_is_small():
    images = [t for t in LINK.findall(README.read_text()) if t.endswith(".png")]
    assert images, "README.md shows no figure"
    for target in images:
        assert (ROOT / target).stat().st_size < 150_000, target


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    for target in targets:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link {target!r} leads nowhere"
        if page != README:  # the site is built from docs/ alone
            assert dest.is_relative_to(ROOT / "docs"), f"{page.name}: {target!r} leaves docs/"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: {target!r}: no such heading"
