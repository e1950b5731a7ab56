"""``scalestudy predict``: the command line of :mod:`scalestudy.report.predict`."""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "predict"
SUMMARY = "predict step times and efficiency (performance model)"
DESCRIPTION = ("Predicts step time, MFU and weak/strong scaling efficiency, each with its range "
               "and the step's breakdown into named terms: for a study's own points (next to its "
               "measurements once it ran), or at real scale next to published results "
               "(scalestudy predict --out results/predict), or over every published table "
               "(--validate).")
EXAMPLE = "scalestudy predict workflow/config/default.yaml"


def add_arguments(ap) -> None:
    ap.add_argument("study", nargs="?", help="study YAML: predict its points (and compare with runs.csv)")
    ap.add_argument("--hardware", default=None,
                    help="preset name or YAML path (default: cpu-local for a CPU study, frontier "
                         "for the published comparison)")
    ap.add_argument("--framework", default=None,
                    help="framework of hardware.yaml driving the hardware (default: the preset's)")
    ap.add_argument("--results", default="results", help="results root (default results/)")
    ap.add_argument("--out", default=None, help="output folder (default <results>/<study>/predict)")
    ap.add_argument("--runs", default=None, help="runs.csv to compare with (default <results>/<study>/runs.csv)")
    ap.add_argument("--matmul-csv", help="microbench matmul CSV measured on that hardware")
    ap.add_argument("--collectives-csv", help="microbench collectives CSV measured on that hardware")
    ap.add_argument("--dp-overlap", type=float, default=None,
                    help="fraction of the data-parallel traffic hidden behind the backward "
                         "(default: the framework's)")
    ap.add_argument("--validate", action="store_true",
                    help="run the model over every shipped published table: per-table MAPE and "
                         "bias, per-row errors, a figure (validation.csv/.md/.png in --out)")
    ap.add_argument("--before-run", action="store_true",
                    help="with a study asking for predict.before_run: calibrate the model on "
                         "its measured points with N <= calibrate_on_max_n and write the other "
                         "points' prediction, before they run, to predict/predicted_before_run.csv")


def run(a) -> int:
    from scalestudy.config.study import load_study
    from scalestudy.config.vocab import Reference
    from scalestudy.report import validation_report

    if a.validate:
        out = Path(a.out or f"{a.results}/validation")
        md = validation_report.write(out)
        print("\n## ".join(md.split("\n## ")[:2]))
        print(f"-> {out}/")
        return 0
    compare_published, out = True, Path(a.out or f"{a.results}/frontier/predict")
    if a.study:
        # nothing is launched from here: the site settings' policy does not apply
        study = load_study(a.study, trust_site=True)
        out = Path(a.out or f"{a.results}/{study.name}/predict")
        compare_published = Reference.FRONTIER_DASH2024 in study.references
        rc = _predict_study(a, study, out)
        if rc is not None:
            return rc
    if compare_published:
        mi = _inputs(a, hardware=a.hardware or "frontier")
        if mi is None:
            return 2
        _predict_published(a, mi, out)
    print(f"-> {out}/")
    return 0


def _inputs(a, study=None, hardware: str | None = None):
    """The model's hardware and measured blocks (``perf.inputs.model_inputs``) under the
    command's flags ``a``; None (the reason printed) when there are none."""
    from scalestudy.perf.inputs import model_inputs

    try:
        return model_inputs(study, Path(a.results) / study.name if study else None,
                            hardware=hardware, framework=a.framework,
                            matmul_csv=a.matmul_csv, collectives_csv=a.collectives_csv)
    except (OSError, ValueError) as e:
        print(f"scalestudy predict: {e}", file=sys.stderr)
        return None


def _predict_study(a, study, out: Path) -> int | None:
    """A study's points predicted into ``out`` (beside its runs once they exist), or only its
    before-run prediction with ``--before-run``; an exit status to end with, or None to go
    on."""
    import pandas as pd

    from scalestudy.analysis.loss_by_term import (PREDICTED_BREAKDOWN_CSV, PREDICTED_LOSS_CSV,
                                                  predicted_tables)
    from scalestudy.plan.planner import plan_points
    from scalestudy.record.io import write_csv
    from scalestudy.report import before_run
    from scalestudy.report.predict import (model_breakdown_figure, residual_figure,
                                           study_predictions, terms_check, versus_measured)

    name = study.name
    mi = _inputs(a, study, a.hardware)
    if mi is None:
        return 2
    hw, measured = mi.hw, mi.measured
    print(f"model inputs: {mi.source}")
    brk: list = []
    points = plan_points(study)
    pred = study_predictions(points, hw, measured, a.dp_overlap, breakdown=brk)
    before_csv = out / "predicted_before_run.csv"
    if a.before_run:
        return before_run.write_before_run(study, pred, Path(a.results) / name, before_csv,
                                           points=points, measured=measured,
                                           hw=hw if a.dp_overlap is None
                                           else hw.with_assumption("dp_overlap", a.dp_overlap))
    write_csv(pred, out / "study_predictions.csv")
    for table, rel in zip(predicted_tables(pred), (PREDICTED_BREAKDOWN_CSV, PREDICTED_LOSS_CSV)):
        write_csv(table, out / rel.name)
    if brk:
        brk_df = pd.DataFrame(brk)
        write_csv(brk_df, out / "study_breakdown.csv")
        model_breakdown_figure(brk_df, out / "study_breakdown.png",
                         f"Where the step goes: {name} on {hw.name}")
    runs_path = Path(a.runs or f"{a.results}/{name}/runs.csv")
    if runs_path.exists() and not pred.empty:
        before = pd.read_csv(before_csv) if before_csv.exists() else None
        runs_df = pd.read_csv(runs_path)
        vm = versus_measured(pred, runs_df, before)
        if before is not None:
            vm = before_run.started_before(vm, runs_df, Path(a.results) / name)
        write_csv(vm, out / "predict_vs_measured.csv")
        residual_figure(vm, out / "predict_vs_measured.png")
        before_run.before_run_figure(vm, out / "predict_efficiency_before_run.png")
        have = vm["residual"].notna()
        print(f"predicted vs measured on {hw.name}: {int(have.sum())} points, residual median "
              f"{vm.loc[have, 'residual'].median():+.1%}, max |residual| "
              f"{vm.loc[have, 'residual'].abs().max():.1%}" if have.any() else
              "no measured point to compare with yet")
        terms_check(pd.DataFrame(brk), runs_path.parent / "breakdown.csv", out)
    print(f"{len(pred)} study points predicted on {hw.name} -> {out}/study_predictions.csv")
    return None


def _predict_published(a, mi, out: Path) -> None:
    """The Frontier study at scale on ``mi``'s hardware, beside its published results."""
    from scalestudy.validation import frontier
    from scalestudy.record.io import write_csv, write_text
    from scalestudy.report.predict import figures, markdown, model_breakdown_figure

    hw = mi.hw
    df, comp, brk_df = frontier.run(hw, mi.measured, a.dp_overlap)
    write_csv(df, out / "predict_points.csv")
    write_csv(comp, out / "predict_vs_published.csv")
    write_csv(brk_df, out / "predict_breakdown.csv")
    md = markdown(comp, hw, brk_df)
    write_text(out / "predict_vs_published.md", md)
    figures(df, comp, out)
    model_breakdown_figure(brk_df, out / "predict_breakdown.png",
                     f"Where the logged iteration goes: Frontier study on {hw.name}")
    print(md)

