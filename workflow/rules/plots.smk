# A rule that cannot write fails with one line in its log (as aggregate.smk's); plots and
# aggregate hold the study's tables lock (scalestudy.record.io.tables_lock).
import os

localrules: plots, front_page

#: The front page's command: report.front with one line for a failed write (it has no own).
FRONT_PAGE = ("import sys; from scalestudy.record.io import exit_on_os_error; "
              "from scalestudy.report.front import main; "
              "sys.exit(exit_on_os_error(lambda: main(sys.argv[1:])))")


rule plots:
    """Efficiency, throughput and MFU figures, each with the CSV it was drawn from."""
    input:
        rules.aggregate.output.runs,
        rules.aggregate.output.efficiency,
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
        "{params.py:q} -m scalestudy.report.plots {params.study_dir:q} --style {params.style}"
        " > {log:q} 2>&1"


rule front_page:
    """The report's front page: the answer per series, the efficiency figures, the headline
    table and the points that did not run (workflow/report/workflow.rst shows it first)."""
    input:
        rules.aggregate.output.runs,
        rules.aggregate.output.efficiency,
        rules.plots.output.png,
    output:
        report(f"{OUT}/report/front.html", caption="../report/front.rst", category="1. Answer"),
    log:
        f"{OUT}/logs/front_page.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, input: os.path.dirname(input[0]),
        code=FRONT_PAGE,
    shell:
        "{params.py:q} -c {params.code:q} {params.study_dir:q} > {log:q} 2>&1"
