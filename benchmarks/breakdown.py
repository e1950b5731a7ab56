"""The measured breakdown's figures of a profiled study's run (``profile: {enabled: true}``,
the default study's): what the profiler costs, and the model term by term against the traces.

- **Profiler overhead** (``overhead``): per point, the median over its runs and ranks of the
  profiled steps' time over the same rank's timed steady steps (``summary.json``'s ``profile``
  record: the same process, the same ``StepTimer``, the steps right after each other), per
  series and over all points; and the trace's size per rank and step. Information, no target:
  the profiler's cost is per recorded operator, so the tiny CPU models pay most.
  And the profiler's cost taken out of the traces (``breakdown.json``: the measured cost per
  recorded event times the events, over the raw traced step).
- **Per term** (``terms``): the model's predicted / measured of each step term, median over
  the study's points (``predict/terms_vs_measured.csv`` of its ``predict`` job), with the
  share of the measured steps each term is, each beside the host's run-to-run noise of the
  same study (``benchmarks.predict.repeat_noise``: one point's repeats, slowest / fastest):
  a ratio inside the noise says nothing. Information, no target.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import figure


def overhead(study_dir: Path) -> dict:
    """The profiler's cost on a run study's points (module doc)."""
    import pandas as pd

    path = study_dir / "runs.csv"
    if not path.exists():
        return {"points": {}, "figures": [figure(
            "overhead", "profiled / timed step", None, "x", note=f"{path} missing: not run")]}
    runs = pd.read_csv(path)
    ok = runs[runs["status"] == "ok"]
    per_point: dict = {}
    sizes = []
    for series, n, pid in zip(ok["series"], ok["n"], ok["point_id"]):
        try:
            rec = json.loads((study_dir / "runs" / pid / "summary.json").read_text())["profile"]
        except (OSError, ValueError, KeyError):
            continue
        for r in rec["ranks"]:
            if r.get("traced") and r.get("profiled_step_s") and r.get("timed_step_s"):
                per_point.setdefault((series, int(n)), []).append(r["profiled_step_s"]
                                                                  / r["timed_step_s"])
            if r.get("bytes"):
                sizes.append(r["bytes"] / rec["steps"] / 1e6)
    points = {k: statistics.median(v) for k, v in per_point.items()}
    removed = []
    for pid in ok["point_id"]:
        try:
            brk = json.loads((study_dir / "runs" / pid / "breakdown.json").read_text())
            if brk.get("state") == "ok" and brk.get("raw_step_s"):
                removed.append(brk["profiler_s"] / brk["raw_step_s"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    figs = [figure("overhead", f"profiled / timed step: {s} N={n}", v, "x",
                   note="information, no target: the profiler's cost per recorded operator")
            for (s, n), v in sorted(points.items())]
    if points:
        figs.append(figure("overhead", "profiled / timed step, median over points",
                           statistics.median(points.values()), "x",
                           note=f"{len(points)} points; the traces' terms are set against the "
                                "timed step (docs/breakdown.md)"))
    if removed:
        figs.append(figure("overhead", "profiler's cost taken out of the traced steps, median",
                           statistics.median(removed), "fraction",
                           note=f"{len(removed)} runs; measured per recorded event on each rank "
                                f"(max {max(removed):.0%})"))
    if sizes:
        figs.append(figure("overhead", "trace size per rank and traced step, median",
                           statistics.median(sizes), "MB", note="gzip'd Kineto JSON"))
    return {"points": {f"{s} N={n}": v for (s, n), v in points.items()}, "figures": figs}


def terms(study_dir: Path) -> dict:
    """The model term by term against the traces of a run study, beside the host's noise
    (module doc)."""
    import pandas as pd

    from benchmarks.predict import repeat_noise
    from scalestudy.analysis.loss_by_term import term_ratio_summary

    runs = study_dir / "runs.csv"
    noise = repeat_noise(pd.read_csv(runs) if runs.exists() else None)
    beside = (f"host noise: repeats' slowest/fastest {noise['spread_median']:.2f}x median, "
              f"{noise['spread_max']:.2f}x max" if noise["spread_median"] else
              "host noise: unknown (no point with two ok repeats)")
    path = study_dir / "predict" / "terms_vs_measured.csv"
    if not path.exists():
        return {"rows": [], "noise": noise, "figures": [figure(
            "terms", "predicted/measured per term", None, "x",
            note=f"{path} missing: the study was not profiled or its predict job did not run")]}
    summary = term_ratio_summary(pd.read_csv(path))
    figs = [figure("terms", f"predicted/measured: {r.label}", r.median_ratio, "x",
                   note=f"median of {r.points} points [{r.min_ratio:.2f}, {r.max_ratio:.2f}]; "
                        f"{r.measured_share:.0%} of the measured time; {beside}; "
                        "information, no target")
            for r in summary.itertuples() if r.points]
    figs.append(figure("terms", "host noise beside the terms: repeats' slowest/fastest, median",
                       noise["spread_median"], "x", note=beside))
    return {"rows": summary.to_dict("records"), "noise": noise, "figures": figs}
