"""The report as a reader sees it: ``report.html`` of the shared tiny study run rendered by a
headless Chromium (``tests/chromium.py``: DevTools protocol on a pipe). The page must open on
the answer (the front page, before Snakemake's workflow description and rule graph), show the
headline numbers of efficiency.csv as visible text, load every image (no broken figure) and
log no error.

Chromium comes from Debian (``chromium-headless-shell``; ``.ci/run`` installs it). Without it
the test skips and says so; with ``SCALESTUDY_REQUIRE_CHROMIUM=1`` (set by ``.ci/run`` after a
successful install) a missing browser fails instead."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from chromium import Chromium, find_binary
from scalestudy.report import summary

pytestmark = pytest.mark.workflow

READY = "document.querySelector('#scalestudy-front') !== null"


@pytest.fixture(scope="module")
def browser():
    binary = find_binary()
    if binary is None:
        if os.environ.get("SCALESTUDY_REQUIRE_CHROMIUM") == "1":
            pytest.fail("SCALESTUDY_REQUIRE_CHROMIUM=1 but no Chromium binary found")
        pytest.skip("no headless Chromium on this machine (apt-get install "
                    "chromium-headless-shell; .ci/run installs it as root)")
    with Chromium.start(binary) as b:
        yield b


def test_report_opens_on_the_answer(tiny_report, browser, tmp_path):
    out = tiny_report.parent
    page = browser.open(tiny_report.as_uri(), ready=READY)
    shot = page.screenshot(tmp_path / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    text = page.text

    # the headline numbers, as the reader sees them (innerText: rendered, visible text)
    eff = pd.read_csv(out / "efficiency.csv")
    found = summary.findings(eff)
    assert {f["series"] for f in found} == {"weak", "strong"}
    for f in found:
        assert f["text"] in text, f["text"]
    weak2 = eff[(eff["series"] == "weak") & (eff["n"] == 2)].iloc[0]
    assert f"{weak2['efficiency']:.3f} [{weak2['efficiency_ci_lo']:.3f}, " \
           f"{weak2['efficiency_ci_hi']:.3f}]" in text
    # the headline table and the infeasible point with its reason
    for cells in summary.headline_cells(eff)[1]:
        assert "\t".join(cells) in text
    bad = pd.read_csv(out / "runs.csv").query("status != 'ok'")
    assert len(bad) == 1
    assert bad["reason"].iloc[0] in text and "Points that did not run (1)" in text

    # the page opens on the answer: before the workflow's own description
    assert text.index("The answer") < text.index("A scaling study of distributed LLM training")
    assert text.index("1. Answer") < text.index("2. Figures") < text.index("3. Tables")

    # every image loaded; the two efficiency figures are on screen at a readable size
    images = page.images
    assert images and all(i["complete"] and i["naturalWidth"] > 0 for i in images), images
    figs = [i for i in images if i["alt"] in ("Weak scaling efficiency", "Strong scaling efficiency")]
    assert len(figs) == 2 and all(i["width"] > 300 and i["height"] > 150 for i in figs), figs
    # the front page is not cut off on the left (Snakemake centres its content)
    left = page.evaluate("document.querySelector('#scalestudy-front').getBoundingClientRect().left")
    nav = page.evaluate("document.querySelector('#scalestudy-front').closest('.grow')"
                        ".getBoundingClientRect().left")
    assert left >= nav
    assert page.errors == []


def test_answer_category_shows_the_front_page(tiny_report, browser):
    """The menu's first result category holds the front page, summary.md and summary.tex."""
    page = browser.open(tiny_report.as_uri(), ready=READY)
    page.evaluate("app.showCategory('1. Answer')")
    page.evaluate("new Promise(r => setTimeout(r, 300))", await_promise=True)
    text = page.text
    for name in ("front.html", "summary.md", "summary.tex"):
        assert name in text
    assert page.errors == []
