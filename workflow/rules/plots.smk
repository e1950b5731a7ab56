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
    shell:
        "{PY:q} -m scalestudy.report.plots {OUT:q}"
