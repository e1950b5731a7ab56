localrules: plots


rule plots:
    """Efficiency, throughput and MFU figures, each with the CSV it was drawn from."""
    input:
        f"{OUT}/runs.csv",
        f"{OUT}/efficiency.csv",
    output:
        png=[report(f"{OUT}/figures/{fig}.png", caption=f"../report/{fig}.rst",
                    category="Figures") for fig in FIGURES],
        other=expand(f"{OUT}/figures/{{fig}}.{{ext}}", fig=FIGURES, ext=["pdf", "csv"]),
    log:
        f"{OUT}/logs/plots.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, input: os.path.dirname(input[0]),
        style=STUDY["report"]["figure_style"],  # a changed style redraws the figures
    shell:
        "{params.py:q} -m scalestudy.report.plots {params.study_dir:q} --style {params.style}"
        " > {log:q} 2>&1"
