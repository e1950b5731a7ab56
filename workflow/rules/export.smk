# The study copied into the experiment trackers its export: section names (MLflow, W&B,
# TensorBoard; docs/exporting.md), after the tables and figures. Nothing waits on it: a tracker
# that cannot be reached fails this job alone, with one line in its log, and the tables stay
# as they are; the next run tries it again (its output, the manifest, is written only when
# every tool succeeded).
import os

localrules: export

EXPORTS = STUDY.export.tools


rule export:
    """The study's points, curves, figures and summary in MLflow, W&B and TensorBoard, keyed
    by point id (an unchanged run is left as it is)."""
    input:
        rules.plan.output.study,
        rules.aggregate.output.runs,
        rules.aggregate.output.efficiency,
        rules.aggregate.output.breakdown,
        rules.aggregate.output.loss,
        rules.aggregate.output.summary,
        rules.plots.output.png,
    output:
        f"{OUT}/export/exported.json",
    log:
        f"{OUT}/logs/export.log",
    conda:
        ENV
    params:
        py=PY,
        study_dir=lambda w, input: os.path.dirname(input[0]),
        tools=",".join(EXPORTS),  # a tool added or removed exports again
    shell:
        "{params.py:q} -m scalestudy export {params.study_dir:q} > {log:q} 2>&1"
