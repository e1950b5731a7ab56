"""``scalestudy tune``: pick a layout of a model on N devices.

By measuring it (``scalestudy tune STUDY --measure``): a search over the study's ``tune:``
space, every trial a point of the pipeline (``scalestudy.tune.search``), its record in
``results/<study>/tune/``. By the model alone (``--model``): the feasible shapes ranked by
predicted throughput (``scalestudy.plan.tune``), printed, the best k written as a study.

    scalestudy tune STUDY.yaml --measure [--results results] [--profile P] [-- SNAKEMAKE ARGS]
    scalestudy tune --model gpt-175b --n 1024 --hardware frontier [--global-batch 1280]
        [--top 5] [--out study.yaml]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

NAME = "tune"
SUMMARY = "search a layout by measuring it (or rank shapes by the model)"
DESCRIPTION = ("With --measure, searches the layout of the study's tune: section by measuring "
               "it (Bayesian search with Optuna, warm-started by the performance model, every "
               "trial a point of the pipeline; run it again to go on after an interruption). "
               "Without, ranks the feasible parallel shapes of --model on --n devices by "
               "predicted throughput and writes the best k as a study you can run.")
EXAMPLE = "scalestudy tune --model gpt-175b --n 1024 --hardware frontier --top 5 --out top5.yaml"
REST = "Snakemake's arguments (with --measure)"


def add_arguments(ap) -> None:
    ap.add_argument("study", nargs="?", help="with --measure: study file (YAML) with a tune: section")
    ap.add_argument("--measure", action="store_true",
                    help="search by measuring the trials (else rank shapes by the model)")
    ap.add_argument("--results", default="results", help="--measure: results root (default: results)")
    ap.add_argument("--profile", default=None,
                    help="--measure: Snakemake profile the trials run with (default: the local one)")
    ap.add_argument("--trust-site", action="store_true",
                    help="--measure: allow any platform.site setting (as scalestudy run --trust-site)")
    ap.add_argument("--model", help="tiny | gpt-22b | gpt-175b | gpt-1t | llama3-8b | llama3-70b | "
                                    "llama3-405b | model YAML")
    ap.add_argument("--n", type=int, help="number of devices")
    ap.add_argument("--hardware", default="frontier", help="preset name or YAML path")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per optimizer step (default: the model's published batch, "
                         "else 8 × N)")
    ap.add_argument("--precision", default=None, help="bf16 (default on accelerators) or fp32")
    ap.add_argument("--top", type=int, default=5, help="how many shapes to keep (default 5)")
    ap.add_argument("--matmul-csv", default=None,
                    help="microbench matmul CSV measured on that hardware")
    ap.add_argument("--collectives-csv", default=None,
                    help="microbench collectives CSV measured on that hardware")
    ap.add_argument("--out", default=None, help="write the top k as a study YAML here")


def run(a) -> int:
    if a.measure:
        return measure(a)
    if a.study or a.rest or a.model is None or a.n is None:
        print("scalestudy tune: give --model and --n (rank by the model), or a study with "
              "--measure (search by measuring)", file=sys.stderr)
        return 2
    return rank_shapes(a)


def rank_shapes(a) -> int:
    """The feasible shapes of ``--model`` on ``--n`` devices, ranked by predicted throughput."""
    import yaml

    from scalestudy.config.parts import Model
    from scalestudy.perf import memory
    from scalestudy.plan.tune import known_models, rank, study_yaml
    from scalestudy.record.io import write_text

    models = known_models()
    if a.model in models:
        model, model_gb = models[a.model]
    elif not os.path.exists(a.model):
        print(f"--model {a.model!r}: not a known model ({', '.join(models)}) nor a YAML file",
              file=sys.stderr)
        return 2
    else:
        with open(a.model) as f:
            shape = yaml.safe_load(f)
        model_gb = shape.pop("global_batch", None)
        model = Model(**{"name": os.path.splitext(os.path.basename(a.model))[0], **shape})
    from scalestudy.perf.inputs import model_inputs

    try:
        mi = model_inputs(hardware=a.hardware, matmul_csv=a.matmul_csv,
                          collectives_csv=a.collectives_csv)
    except (OSError, ValueError) as e:
        print(f"scalestudy tune: {e}", file=sys.stderr)
        return 2
    hw, measured = mi.hw, mi.measured
    precision = a.precision or ("fp32" if "bf16" not in hw.peak_flops or hw.device == "cpu" else "bf16")
    gb = a.global_batch or model_gb or 8 * a.n
    best = rank(model, a.n, gb, hw, a.top, precision, measured)
    if not best:
        print(f"no feasible shape for {model.name} on {a.n} devices of {hw.name} "
              f"(global batch {gb}); try more devices or a smaller micro-batch", file=sys.stderr)
        return 1
    print(f"{'rank':>4} {'tp':>3} {'pp':>4} {'dp':>4} {'mb':>3} {'sched':>11} {'v':>2} {'dp_mode':>12} "
          f"{'ckpt':>5} {'step_s':>10} {'tok/s':>10} {'MFU':>6} {'mem':>10}")
    for i, r in enumerate(best, 1):
        p, q, par = r["point"], r["prediction"], r["point"].parallel
        print(f"{i:>4} {p.tp:>3} {p.pp:>4} {p.dp:>4} {p.micro_batch:>3} "
              f"{par.pp_schedule:>11} {par.virtual_stages:>2} {par.dp_mode:>12} "
              f"{par.activation_checkpointing:>5} {q.step_time_s:>10.4g} {q.tokens_per_s:>10.4g} "
              f"{q.mfu:>6.1%} {memory.fmt_bytes(r['memory_bytes']):>10}")
    if a.out:
        write_text(a.out, study_yaml(model, best, hw))
        print(f"-> {a.out}")
    return 0


def measure(a) -> int:
    """``scalestudy tune STUDY --measure``: the search, its trials.csv, convergence figure,
    summary and best layout under ``RESULTS/<study>/tune/``."""
    if not a.study:
        print("scalestudy tune --measure: give the study file (YAML) with a tune: section",
              file=sys.stderr)
        return 2
    extra = a.rest
    from scalestudy.config.study import load_study
    from scalestudy.config.study_yaml import StudyError
    from scalestudy.record.bounded_read import RecordError, printable
    from scalestudy.run.guard import StudyLocked
    from scalestudy.tune.search import start

    try:
        study = load_study(a.study, trust_site=a.trust_site)
        rows, written = start(study, a.study, Path(a.results), a.profile, extra, a.trust_site)
    except (StudyError, RecordError, StudyLocked, ValueError) as e:
        print(f"scalestudy tune: {printable(str(e))}", file=sys.stderr)
        return 2
    for path in written:
        print(f"-> {path}")
    return 0 if any(r["state"] == "complete" for r in rows) else 1
