localrules: plan, point_spec


rule plan:
    """Every sweep point, feasible or skipped with the reason; the resolved study."""
    input:
        STUDY_FILE,
    output:
        plan=report(f"{OUT}/plan.tsv", caption="../report/plan.rst", category="5. Plan"),
        study=f"{OUT}/study.json",
    log:
        f"{OUT}/logs/plan.log",
    resources:
        timed_slot=0,  # a thread of Snakemake's own process (the profiles' force-use-threads)
    run:
        from scalestudy.plan.planner import write_plan
        from scalestudy.record.io import write_text

        write_text(log[0], write_plan(list(POINTS.values()), OUT, STUDY, SETUP.source) + "\n")


rule point_spec:
    """The resolved point (point.json). Its id hashes the resolved config, so an existing file
    is never stale; it is looked up here, not passed as params, so timeouts can change
    without reruns."""
    output:
        f"{OUT}/runs/{{pid}}/point.json",
    log:
        f"{OUT}/logs/point_spec/{{pid}}.log",
    resources:
        timed_slot=0,  # a thread of Snakemake's own process, as plan
    run:
        from scalestudy.record.io import write_text

        write_text(output[0], POINTS[wildcards.pid].json_text())
        write_text(log[0], f"{output[0]}\n")
