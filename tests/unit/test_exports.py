"""Paper exports: summary.tex (booktabs, CIs as ±, units in the headers) and the figure styles
(single- / double-column widths, TrueType fonts embedded in every PDF, a colour-blind-safe
palette, series told apart by marker and line style as well as colour)."""

from __future__ import annotations

import re

import matplotlib
import pandas as pd
import pytest
import yaml

from scalestudy.report.aggregate import aggregate_study
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.vocab import FigureStyle
from scalestudy.report import plots, style, summary
from synthetic_study import make_study

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = make_study(tmp_path_factory.mktemp("exports"))
    aggregate_study(d)
    return d


# --- summary.tex -----------------------------------------------------------------------------


def test_summary_tex_is_a_booktabs_table_with_units_and_cis(study):
    tex = (study / "summary.tex").read_text()
    eff = pd.read_csv(study / "efficiency.csv")
    assert "\\usepackage{booktabs}" in tex.splitlines()[0]
    for rule in ("\\toprule", "\\midrule", "\\bottomrule"):
        assert tex.count(rule) == 1
    assert "\\hline" not in tex and "\\begin{tabular}{llrrrrrrrrr}" in tex
    header = tex.split("\\toprule\n")[1].split("\n")[0]
    for unit in ("Step time (ms)", "Throughput (tokens/s/device)", "Global batch (seq.)",
                 "util.\\ vs matmul ceiling (\\%)"):
        assert unit in header
    body = tex.split("\\midrule\n")[1].split("\\bottomrule")[0]
    rows = [r for r in body.splitlines() if r.endswith("\\\\")]
    assert len(rows) == len(eff)
    # weak-dp N=4: step time 125 ms, efficiency 0.8, each with its bootstrap CI
    row = next(r for r in rows if r.startswith("weak-dp & weak & 4 &"))
    cells = [c.strip() for c in row[:-2].split("&")]
    r = eff[(eff["series"] == "weak-dp") & (eff["n"] == 4)].iloc[0]
    assert cells[6].startswith("$125.00") and ("\\pm" in cells[6] or "^{+" in cells[6])
    lo, hi = r["efficiency_ci_lo"], r["efficiency_ci_hi"]
    assert cells[8] == summary.tex_ci(0.8, lo, hi, ".3f") and cells[8].startswith("$0.800")
    # a point that did not run says so, no number
    assert any("(oom)" in r and "--" in r for r in rows)
    assert any("(infeasible)" in r for r in rows)
    assert "\\label{tab:scaling-synth}" in tex and "\\caption{" in tex


def test_tex_helpers():
    assert summary.tex_escape("weak_dp & 50% #1 {x}") == "weak\\_dp \\& 50\\% \\#1 \\{x\\}"
    assert summary.tex_ci(1.0, 0.9, 1.1) == "$1.000 \\pm 0.100$"
    assert summary.tex_ci(1.0, 0.8, 1.1) == "$1.000^{+0.100}_{-0.200}$"
    assert summary.tex_ci(float("nan"), 0, 1) == "--"
    assert summary.tex_ci(2.0, None, None) == "$2.000$"


# --- figure styles ---------------------------------------------------------------------------


def pdf_fonts(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """(font dictionaries, font descriptors) of a PDF whose objects are not compressed
    (matplotlib writes dictionaries in the clear, only streams are deflated)."""
    objs = [m.group(1) for m in re.finditer(rb"\d+ 0 obj\s*<<(.*?)>>\s*(?:endobj|stream)",
                                             data, re.S)]
    fonts = [o for o in objs if re.search(rb"/Type\s*/Font\b", o)]
    descriptors = [o for o in objs if re.search(rb"/Type\s*/FontDescriptor\b", o)]
    return fonts, descriptors


@pytest.mark.parametrize("name,width_in", [("single-column", 3.5), ("double-column", 7.0)])
def test_column_styles_have_the_width_and_embedded_truetype_fonts(study, tmp_path, name, width_in):
    d = tmp_path / "s"
    import shutil

    shutil.copytree(study, d)
    paths = plots.run(d, style=name)
    pdfs = [p for p in paths if p.suffix == ".pdf"]
    assert len(pdfs) == len(plots.FIGURES)
    for pdf in pdfs:
        data = pdf.read_bytes()
        box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+) ([\d.]+)\s*\]", data)
        assert float(box.group(1)) == pytest.approx(72 * width_in, abs=0.5), pdf.name
        fonts, descriptors = pdf_fonts(data)
        assert fonts and descriptors, pdf.name
        assert not any(re.search(rb"/Subtype\s*/Type3\b", f) for f in fonts), pdf.name
        subtypes = {re.search(rb"/Subtype\s*/(\w+)", f).group(1) for f in fonts}
        assert subtypes <= {b"Type0", b"CIDFontType2", b"TrueType"}, subtypes
        # every font program is in the file, as TrueType (FontFile2)
        assert all(b"/FontFile2" in fd for fd in descriptors), pdf.name


def test_default_style_embeds_truetype_too_and_matplotlibs_default_would_not(study, tmp_path):
    import shutil

    d = tmp_path / "s"
    shutil.copytree(study, d)
    plots.run(d)  # study.json has no report.figure_style: default
    fonts, descriptors = pdf_fonts((d / "figures" / "throughput.pdf").read_bytes())
    assert fonts and all(b"/FontFile2" in fd for fd in descriptors)
    assert not any(b"Type3" in f for f in fonts)
    # the check can fail: matplotlib's own default writes Type 3 fonts
    import matplotlib.pyplot as plt

    with plt.rc_context({"pdf.fonttype": 3}):
        fig, ax = plt.subplots()
        ax.set_title("x")
        fig.savefig(tmp_path / "t3.pdf")
        plt.close(fig)
    fonts, _ = pdf_fonts((tmp_path / "t3.pdf").read_bytes())
    assert any(re.search(rb"/Subtype\s*/Type3\b", f) for f in fonts)


def test_series_differ_in_marker_and_line_style_not_only_colour(study):
    import matplotlib.pyplot as plt

    eff, runs = pd.read_csv(study / "efficiency.csv"), pd.read_csv(study / "runs.csv")
    made = []
    orig = plt.close
    try:  # keep the figure open to inspect its lines
        plt.close = lambda fig=None: made.append(fig)
        plots.throughput_figure(eff, runs, study / "figures", style="single-column")
    finally:
        plt.close = orig
    ax = made[0].axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_label() in ("weak-dp", "strong-dp")]
    assert len(lines) == 2
    looks = {(ln.get_marker(), str(ln.get_linestyle())) for ln in lines}
    assert len(looks) == 2  # distinguishable in greyscale
    assert {matplotlib.colors.to_hex(ln.get_color()).upper() for ln in lines} == \
        set(style.PALETTE[:2])
    plt.close(made[0])
    # the palette is Okabe-Ito, and marker/line-style cycles have no repeats
    assert style.PALETTE[:3] == ["#0072B2", "#E69F00", "#009E73"]
    assert len(set(style.MARKERS)) == len(style.MARKERS)
    assert len({str(x) for x in style.LINESTYLES}) == len(style.LINESTYLES)


def test_style_from_the_study_and_the_cli(study, tmp_path, capsys):
    import shutil

    from scalestudy.cli import main
    from scalestudy.record.io import read_json, write_json

    assert set(style.STYLES) == {str(s) for s in FigureStyle}
    d = tmp_path / "s"
    shutil.copytree(study, d)
    doc = read_json(d / "study.json")
    write_json(d / "study.json", {**doc, "report": {"figure_style": "double-column"}})
    plots.run(d)
    box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+)", (d / "figures" / "mfu.pdf").read_bytes())
    assert float(box.group(1)) == pytest.approx(504, abs=0.5)
    assert main(["plot", str(d), "--style", "single-column"]) == 0  # the CLI wins
    box = re.search(rb"/MediaBox \[\s*0 0 ([\d.]+)", (d / "figures" / "mfu.pdf").read_bytes())
    assert float(box.group(1)) == pytest.approx(252, abs=0.5)
    capsys.readouterr()


def test_schema_takes_the_figure_style(repo):
    raw = yaml.safe_load((repo / "workflow/config/default.yaml").read_text())
    assert validate(raw).to_json()["report"] == {"figure_style": "default"}  # additive, defaulted
    assert validate({**raw, "report": {"figure_style": "single-column"}}).report.figure_style \
        == "single-column"
    with pytest.raises(StudyError, match="report.figure_style: 'a4' is not allowed; expected one "
                                         "of default, single-column, double-column"):
        validate({**raw, "report": {"figure_style": "a4"}})


def test_markdown_text_escapes_markup_and_keeps_plain_signs_as_they_are():
    """A straggler note's ``>`` stays ``>`` (Markdown, not HTML entities); what could open a
    tag, a link, emphasis, code or a table cell is backslash-escaped."""
    from scalestudy.report.summary import md_text

    note = "slowest/fastest 2.00 > platform.straggler_ratio 1.2 on tp_node\nnext"
    assert md_text(note) == "slowest/fastest 2.00 > platform.straggler_ratio 1.2 on tp_node next"
    assert md_text("a|b<script>[x](y) *e* `c` &amp; R&D") == \
        "a\\|b\\<script>\\[x\\](y) \\*e\\* \\`c\\` \\&amp; R\\&D"
