"""The report's front page: the answer first.

    python -m scalestudy front RESULTS/STUDY       (writes RESULTS/STUDY/report/front.html)

An HTML fragment (pure ASCII, self-contained: the figures are embedded as data URIs) with, in
this order: per series the answer in one line (efficiency with its 95% CI and throughput per
device at the largest N that ran, and what happened beyond it), where the efficiency went (a
sentence per profiled series: ``report.breakdown``), the efficiency figures, the
headline table of ``summary.md`` and the points that did not run with their reasons.

``snakemake --report`` shows it twice: as the workflow description (``workflow/report/
workflow.rst`` includes it with the ``raw`` directive), which is what the report opens on,
and as the first result (category "1. Answer"). Its own ``<style>`` widens the description
column of Snakemake's report page for it.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from scalestudy.record.io import write_text
from scalestudy.report import summary
from scalestudy.report.breakdown import loss_sentences, model_side

FRONT = Path("report") / "front.html"
#: Figures on the front page (the rest are one click away, under "2. Figures").
FRONT_FIGURES = (("efficiency_weak", "Weak scaling efficiency"),
                 ("efficiency_strong", "Strong scaling efficiency"))
MAX_LISTED = 50

STYLE = """
<style>
/* Snakemake's report centres its content (flex, items-center justify-center): a page wider
   than the window would be cut off on the left. Align this page left and top, give it the
   width, and put the rule graph below it. */
div.justify-center:has(#scalestudy-front) { justify-content: flex-start; align-items: flex-start; }
div.gap-3:has(#scalestudy-front) { flex-wrap: wrap; min-width: 0; width: 100%; }
div.py-2:has(#scalestudy-front) { flex: 1 1 100%; min-width: 0; }
.prose:has(#scalestudy-front) { max-width: 80rem; }
#scalestudy-front .scroll { overflow-x: auto; max-width: 100%; }
#scalestudy-front table { font-size: 0.78rem; width: auto; margin: 0; }
#scalestudy-front th, #scalestudy-front td { padding: 0.2rem 0.45rem; white-space: nowrap; }
#scalestudy-front td.reason { white-space: normal; min-width: 16rem; }
#scalestudy-front .figures { display: flex; flex-wrap: wrap; gap: 1rem; }
#scalestudy-front figure { flex: 1 1 24rem; margin: 0; }
#scalestudy-front figure img { max-width: 100%; height: auto; margin: 0; }
#scalestudy-front .answer li { margin: 0.2rem 0; }
#scalestudy-front .notes { font-size: 0.8rem; color: #555; }
</style>
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


def _table(head: list[str], rows: list[list[str]], classes: dict[int, str] | None = None) -> str:
    classes = classes or {}
    out = ['<div class="scroll"><table>', "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>",
           "<tbody>"]
    for r in rows:
        cells = "".join(f'<td class="{classes[i]}">{_e(c)}</td>' if i in classes else
                        f"<td>{_e(c)}</td>" for i, c in enumerate(r))
        out.append(f"<tr>{cells}</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def front_html(study_dir: Path) -> str:
    """The front page of the study in ``study_dir`` (after aggregation and plotting)."""
    from scalestudy.record.io import read_record

    study_dir = Path(study_dir)
    runs = pd.read_csv(study_dir / "runs.csv")
    eff = pd.read_csv(study_dir / "efficiency.csv")
    study = read_record(study_dir / "study.json") or {}
    name = study.get("name") or study_dir.name
    out = ['<div id="scalestudy-front">', STYLE, f"<h1>Scaling study: {_e(name)}</h1>"]
    if study.get("description"):
        out.append(f"<p>{_e(study['description'])}</p>")

    n_ok = int((runs["status"] == "ok").sum())
    states = runs.loc[runs["status"] != "ok", "status"].value_counts()
    others = ", ".join(f"{v} {k}" for k, v in states.items())
    out.append(f"<p><strong>{len(runs)} planned runs, {n_ok} ok</strong>"
               + (f" ({others})" if others else "") + ". Efficiency E(N) = X(N)/X(N&#8320;), "
               "X = tokens per step / (step time &#215; N); [95% CI] by bootstrap.</p>")
    out.append('<h2 id="answer">The answer</h2>')
    out.append('<ul class="answer">')
    for f in summary.findings(eff):
        out.append(f"<li><strong>{_e(f['series'])}</strong>: {_e(f['text'])}</li>")
    out.append("</ul>")
    loss_csv = study_dir / "efficiency_loss.csv"
    went = (loss_sentences(pd.read_csv(loss_csv), model_side(study_dir)[1])
            if loss_csv.is_file() else [])
    if went:
        out.append('<h2 id="where">Where the efficiency went</h2>')
        out.append('<ul class="answer">')
        out += [f"<li>{_e(w['text'])}</li>" for w in went]
        out.append("</ul>")
        out.append('<p class="notes">Measured from profiler traces of each point (figure '
                   '&#8220;breakdown&#8221;, breakdown.csv, efficiency_loss.csv), the model beside '
                   "it.</p>")

    figs = [(study_dir / "figures" / f"{fig}.png", title) for fig, title in FRONT_FIGURES]
    figs = [(p, t) for p, t in figs if p.is_file()]
    if figs:
        out.append('<h2 id="efficiency">Efficiency</h2>')
        out.append('<div class="figures">')
        for p, title in figs:
            out.append(f"<figure>{_img(p, title)}<figcaption>{_e(title)} vs N: ideal E = 1 "
                       "dashed, band = 95% CI, bottom strip = points that did not run."
                       "</figcaption></figure>")
        out.append("</div>")

    head, rows, _ = summary.headline_cells(eff)
    out.append('<h2 id="summary">Summary table</h2>')
    out.append(_table(head, rows))

    bad = runs[runs["status"] != "ok"]
    out.append(f'<h2 id="failed">Points that did not run ({len(bad)})</h2>')
    if len(bad):
        rows = [[str(r.series), str(r.n), str(r.status), str(r.reason), str(r.point_id)]
                for r in bad.head(MAX_LISTED).itertuples(index=False)]
        out.append(_table(["series", "N", "state", "reason", "point"], rows, {3: "reason"}))
        if len(bad) > MAX_LISTED:
            out.append(f"<p>... and {len(bad) - MAX_LISTED} more: see runs.csv.</p>")
    else:
        out.append("<p>None: every planned point ran.</p>")
    flagged = summary.straggler_runs(runs)
    if len(flagged):
        out.append(f'<h2 id="stragglers">Points shaped by a straggler ({len(flagged)})</h2>')
        rows = [[str(r.series), str(r.n), str(r.straggler_note), str(r.point_id)]
                for r in flagged.head(MAX_LISTED).itertuples(index=False)]
        out.append(_table(["series", "N", "flag (the run is ok)", "point"], rows, {2: "reason"}))

    notes = []
    if "device_type" in runs and (runs["device_type"] == "cpu").any():
        notes.append(summary.CPU_NOTE)
    notes.append(summary.energy_note(runs).replace("`", ""))
    notes.append("Tables (runs.csv, efficiency.csv, summary.md, summary.tex), the other figures "
                 "(throughput, MFU), the plan and the performance model are under Results in the "
                 "menu.")
    out.append('<div class="notes">' + "".join(f"<p>{_e(n)}</p>" for n in notes) + "</div>")
    out.append("</div>")
    text = "\n".join(out) + "\n"
    return text.encode("ascii", "xmlcharrefreplace").decode("ascii")


def run(study_dir: Path) -> Path:
    path = Path(study_dir) / FRONT
    write_text(path, front_html(Path(study_dir)))
    return path
