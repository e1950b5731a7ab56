localrules: aggregate, predict


rule aggregate:
    """Tidy tables over every run (failed and infeasible ones included) and the headline."""
    input:
        f"{OUT}/plan.tsv",
        f"{OUT}/study.json",
        f"{OUT}/calibration.json",
        expand(f"{OUT}/runs/{{pid}}/status.json", pid=FEASIBLE),
    output:
        runs=report(f"{OUT}/runs.csv", caption="../report/runs.rst", category="Tables"),
        parquet=f"{OUT}/runs.parquet",
        efficiency=report(f"{OUT}/efficiency.csv", caption="../report/efficiency.rst",
                          category="Tables"),
        summary=report(f"{OUT}/summary.md", caption="../report/summary.rst", category="Tables"),
    shell:
        "{PY:q} -m scalestudy.analysis.aggregate {OUT:q}"


rule predict:
    """Predicted (performance model, on this host's measured building blocks) vs measured step
    time of every point, with the residuals."""
    input:
        f"{OUT}/runs.csv",
        f"{OUT}/calibration.json",
        MICROBENCH_OUTPUTS,
    output:
        predictions=f"{OUT}/predict/study_predictions.csv",
        residuals=f"{OUT}/predict/predict_vs_measured.csv",
        figure=report(f"{OUT}/predict/predict_vs_measured.png",
                      caption="../report/predict_vs_measured.rst", category="Figures"),
    params:
        out=f"{OUT}/predict",
    shell:
        "{PY:q} -m scalestudy.perf.predict {STUDY_FILE:q} --results {RESULTS:q} --out {params.out:q}"
