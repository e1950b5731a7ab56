# A rule that cannot write fails with one line in its log (as aggregate.smk's); plots and
# aggregate hold the study's tables lock (scalestudy.record.io.tables_lock).
import os

localrules: plots, front_page

rule plots:
    """Efficiency, throughput, MFU and breakdown figures, each with the CSV it was drawn
    from."""
    input:
        rules.aggregate.output.runs,
        rules.aggregate.output.efficiency,
        rules.aggregate.output.breakdown,
        rules.aggregate.output.loss,
        MODEL_SIDE,
    output:
        png=[report(f"{OUT}/figures/{fig}.png", caption=f"../report/{fig}.rst",
                    category="2. Figures") for fig in FIGURES],
        other=expand(f"{OUT}/figures/{{fig}}.{{ext}}", fig=FIGURES, ext=["pdf", "csv"]),
    log:
        f"{OUT}/logs/plots.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, input: os.path.dirname(input[0]),
        style=str(STUDY.report.figure_style),  # a changed style redraws the figures
    shell:
        "{params.py:q} -m scalestudy plot {params.study_dir:q} --style {params.style}"
        " > {log:q} 2>&1"


rule front_page:
    """The report's front page: the answer per series, where its efficiency went, the
    efficiency figures, the headline table and the points that did not run
    (workflow/report/workflow.rst shows it first)."""
    input:
        rules.aggregate.output.runs,
        rules.aggregate.output.efficiency,
        rules.aggregate.output.loss,
        rules.plots.output.png,
        MODEL_SIDE,
    output:
        report(f"{OUT}/report/front.html", caption="../report/front.rst", category="1. Answer"),
    log:
        f"{OUT}/logs/front_page.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, input: os.path.dirname(input[0]),
    shell:
        "{params.py:q} -m scalestudy front {params.study_dir:q} > {log:q} 2>&1"
