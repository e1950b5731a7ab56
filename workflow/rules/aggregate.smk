localrules: aggregate


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
        "{PY:q} -m scalestudy.aggregate {OUT:q}"
