# What every rule reads: the study loaded, validated, its site resolved and checked, secrets
# split off the records, the points planned (scalestudy.run.workflow.workflow_setup). Every
# launcher (scalestudy run, snakemake from the repository root, an installed package) parses
# this: its main process takes the study's lock (run/guard.py); jobs that re-parse it take
# nothing.
import sys

from snakemake_interface_executor_plugins.settings import DeploymentMethod

from scalestudy.run import lifetime
from scalestudy.run.workflow import workflow_setup

if workflow.remote_exec:  # a cluster job's Snakemake ends with its job's process
    lifetime.as_cluster_job()

SETUP = workflow_setup(config, claim=workflow.is_main_process)
STUDY_FILE = SETUP.study_file
STUDY = SETUP.study
PLATFORM = SETUP.platform
POINTS = SETUP.points
FEASIBLE = SETUP.feasible
OUT = SETUP.out
# predict.before_run: the points with N <= calibrate_on_max_n run first; once they are measured
# the model, calibrated on them, predicts the others (rule predict_before_run), which wait for it.
BEFORE_RUN_MAX_N = SETUP.before_run_max_n
# The Python of the jobs: this environment's (the project's venv), or the rule's conda
# environment (workflow/envs/) under --software-deployment-method conda.
CONDA = DeploymentMethod.CONDA in (workflow.deployment_settings.deployment_method or ())
PY = "python" if CONDA else sys.executable
ENV = "../envs/scalestudy.yaml"  # relative to the rule files (rules/)
FIGURES = ["efficiency_weak", "efficiency_strong", "throughput", "mfu", "breakdown"]
