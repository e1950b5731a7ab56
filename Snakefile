# scalestudy: a study file -> one training job per sweep point -> efficiency curves.
#   snakemake --profile workflow/profiles/local --config study=workflow/config/default.yaml
# Logic lives in src/scalestudy (tested there); this file and the rules only wire it up.
import sys

from scalestudy import launch
from scalestudy.perfmodel import gemm_shapes
from scalestudy.planner import plan_points
from scalestudy.study import load_study

STUDY_FILE = config.get("study", "workflow/config/default.yaml")
RESULTS = config.get("results", "results")
STUDY = load_study(STUDY_FILE)  # validates against the schema; one-line StudyError otherwise
# Cluster specifics: the study's platform.site, overridden by a Slurm profile's site.yaml.
# Unhashed, so a point keeps its id on a laptop and on a cluster.
STUDY["platform"]["site"] = launch.resolve_site(STUDY["platform"].get("site"), config.get("site"))
POINTS = {p["point_id"]: p for p in plan_points(STUDY)}
FEASIBLE = [pid for pid, p in POINTS.items() if p["feasible"]]
OUT = f"{RESULTS}/{STUDY['name']}"
PY = sys.executable
FIGURES = ["efficiency_weak", "efficiency_strong", "throughput", "mfu"]

wildcard_constraints:
    pid="[A-Za-z0-9_.-]+",

report: "workflow/report/workflow.rst"

include: "workflow/rules/plan.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/microbench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/plots.smk"


rule all:
    input:
        f"{OUT}/plan.tsv",
        f"{OUT}/runs.csv",
        f"{OUT}/efficiency.csv",
        f"{OUT}/summary.md",
        expand(f"{OUT}/figures/{{fig}}.{{ext}}", fig=FIGURES, ext=["png", "pdf", "csv"]),
        MICROBENCH_OUTPUTS,
        # the performance model's residuals; on a GPU study: scalestudy predict --hardware H
        [f"{OUT}/predict/predict_vs_measured.png"] if STUDY["platform"]["device"] == "cpu" else [],
