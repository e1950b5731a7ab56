# A rule that cannot write (a full disk, an unwritable results folder) fails with one line in
# its log, `scalestudy: error: PATH: what; fix` (scalestudy.record.io.exit_on_os_error), and
# leaves the files it had written before whole; the sweep's other jobs go on (keep-going).
import os

localrules: aggregate, predict, predict_before_run


rule aggregate:
    """Tidy tables over every run (failed and infeasible ones included), where each point's
    step went (measured from its traces, beside the model) and the headline (summary.md, and
    summary.tex for a paper)."""
    input:
        rules.plan.output.plan,
        rules.plan.output.study,
        rules.calibration.output,
        # the model's terms beside the measured ones price on this host's building blocks
        MICROBENCH_OUTPUTS,
        expand(rules.train.output[0], pid=FEASIBLE),
    output:
        runs=report(f"{OUT}/runs.csv", caption="../report/runs.rst", category="3. Tables"),
        parquet=f"{OUT}/runs.parquet",
        efficiency=report(f"{OUT}/efficiency.csv", caption="../report/efficiency.rst",
                          category="3. Tables"),
        breakdown=report(f"{OUT}/breakdown.csv", caption="../report/breakdown_table.rst",
                         category="3. Tables"),
        loss=report(f"{OUT}/efficiency_loss.csv", caption="../report/efficiency_loss.rst",
                    category="3. Tables"),
        summary=report(f"{OUT}/summary.md", caption="../report/summary.rst", category="1. Answer"),
        summary_tex=report(f"{OUT}/summary.tex", caption="../report/summary_tex.rst",
                           category="1. Answer"),
    log:
        f"{OUT}/logs/aggregate.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, output: os.path.dirname(output.runs),
    shell:
        "{params.py:q} -m scalestudy aggregate {params.study_dir:q} > {log:q} 2>&1"


rule predict_before_run:
    """The larger points' step time predicted before they run: the performance model on this
    host's measured blocks, calibrated on the measured points with N <= calibrate_on_max_n."""
    input:
        study=STUDY_FILE,
        calibration=rules.calibration.output[0],
        microbench=MICROBENCH_OUTPUTS,
        plan=rules.plan.output.plan,
        study_json=rules.plan.output.study,
        small=expand(rules.train.output[0],
                     pid=[pid for pid in FEASIBLE
                          if BEFORE_RUN_MAX_N is not None and POINTS[pid].n <= BEFORE_RUN_MAX_N]),
    output:
        f"{OUT}/predict/predicted_before_run.csv",
    log:
        f"{OUT}/logs/predict_before_run.log",
    conda:
        ENV
    params:
        py=PY,
        results=lambda w, input: os.path.dirname(os.path.dirname(input.plan)),
        out=lambda w, output: os.path.dirname(output[0]),
    shell:
        "{params.py:q} -m scalestudy predict {input.study:q} --results {params.results:q}"
        " --out {params.out:q} --before-run > {log:q} 2>&1"


rule predict:
    """Predicted (performance model, on this host's measured building blocks) vs measured step
    time of every point, with the residuals, and each point's step split into the model's
    terms: the model's side of breakdown.csv and efficiency_loss.csv."""
    input:
        study=STUDY_FILE,
        runs=rules.aggregate.output.runs,
        calibration=rules.calibration.output[0],
        microbench=MICROBENCH_OUTPUTS,
        before_run=rules.predict_before_run.output if BEFORE_RUN_MAX_N is not None else [],
    output:
        predictions=f"{OUT}/predict/study_predictions.csv",
        residuals=f"{OUT}/predict/predict_vs_measured.csv",
        figure=report(f"{OUT}/predict/predict_vs_measured.png",
                      caption="../report/predict_vs_measured.rst",
                      category="4. Performance model"),
        breakdown=f"{OUT}/predict/study_breakdown.csv",
        breakdown_predicted=f"{OUT}/predict/breakdown_predicted.csv",
        loss_predicted=f"{OUT}/predict/efficiency_loss_predicted.csv",
        breakdown_figure=report(f"{OUT}/predict/study_breakdown.png",
                                caption="../report/study_breakdown.rst",
                                category="4. Performance model"),
    log:
        f"{OUT}/logs/predict.log",
    conda:
        ENV
    params:
        py=PY,
        results=lambda w, input: os.path.dirname(os.path.dirname(input.runs)),
        out=lambda w, output: os.path.dirname(output.predictions),
    shell:
        "{params.py:q} -m scalestudy predict {input.study:q} --results {params.results:q}"
        " --out {params.out:q} > {log:q} 2>&1"


# The model's side of breakdown.csv / efficiency_loss.csv, where the study runs the predict job
# (a CPU study: rule all): the breakdown figure and the front page draw it beside the measured.
MODEL_SIDE = ([rules.predict.output.breakdown_predicted, rules.predict.output.loss_predicted]
              if STUDY.platform.device == "cpu" else [])
