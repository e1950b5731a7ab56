import json
import os
import shlex

from scalestudy.measure import host_slices
from scalestudy.measure.blocks import block_specs
from scalestudy.perf.terms_compute import gemm_shapes
from scalestudy.run import slurm

localrules: calibration

#: whether the calibrate jobs measure this host's building blocks for the performance model
HOST_MODEL = STUDY.microbench.enabled
#: the study's process counts on a host (its feasible points' N)
PROCS = sorted({p.n for p in POINTS.values() if p.feasible})
#: the host calibration's slices (a CPU study's blocks and core sharing, across the sweep)
HOST_SLICES = (list(range(host_slices.SLICES))
               if HOST_MODEL and STUDY.platform.device != "cuda" else [])


rule calibrate:
    """Measured matmul ceiling of this study's device (the denominator of 'utilisation vs
    measured ceiling') and the rate of the study's own matrix products (for the performance
    model). Timed, so it never shares the host with a training job."""
    output:
        f"{OUT}/calibration/device.json",
    log:
        f"{OUT}/logs/calibrate.log",
    conda:
        ENV
    resources:
        timed_slot=1,
        # Slurm: one process on one device of a node, like a 1-device point
        **slurm.rule_resources(lambda w: slurm.job_resources(1, 1, PLATFORM,
                                                             label="calibrate")),
    params:
        py=PY,
        device=str(STUDY.platform.device),
        dtype=str(STUDY.train.precision),
        shapes=" ".join("x".join(map(str, s)) for s in gemm_shapes(POINTS.values())),
        # the framework overhead of this host (a CPU study's performance model): plain, and
        # under DTensor when the study has tensor-parallel points
        overhead="plain tp" if any(p.tp > 1 for p in POINTS.values() if p.feasible) else "plain",
        # one process's share of this host's threads, as every point's process gets it
        # (run.launch.threads_per_process)
        dpn=PLATFORM.devices_per_node,
    shell:
        "{params.py:q} -m scalestudy calibrate --device {params.device} --dtype {params.dtype}"
        " --devices-per-node {params.dpn} --out {output:q} --shapes {params.shapes}"
        " --overhead {params.overhead} > {log:q} 2>&1"


rule calibrate_slice:
    """One slice of a CPU study's host calibration: its own model piece by piece, what
    sharing the cores costs at its process counts and the wait at a synchronisation among
    them, a few rounds. The slices are jobs of their
    own, run between the training runs, so together they sample the host across the sweep as
    the runs do. Timed, like training."""
    output:
        f"{OUT}/calibration/slice_{{k}}.json",
    log:
        f"{OUT}/logs/calibrate_slice_{{k}}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        ENV
    resources:
        timed_slot=1,
        **slurm.rule_resources(lambda w: slurm.job_resources(1, 1, PLATFORM,
                                                             label="calibrate_slice")),
    params:
        py=PY,
        device=str(STUDY.platform.device),
        blocks=shlex.quote(json.dumps(block_specs(POINTS.values()))),
        procs=" ".join(str(k) for k in PROCS),
        dpn=PLATFORM.devices_per_node,
    shell:
        "{params.py:q} -m scalestudy host-slices --device {params.device}"
        " --devices-per-node {params.dpn} --blocks-json {params.blocks}"
        " --core-sharing {params.procs} --out {output:q} > {log:q} 2>&1"


rule calibration:
    """calibration.json: the device's calibration with its host slices pooled
    (scalestudy.measure.host_slices)."""
    input:
        device=rules.calibrate.output[0],
        slices=expand(rules.calibrate_slice.output[0], k=HOST_SLICES),
    output:
        f"{OUT}/calibration.json",
    log:
        f"{OUT}/logs/calibration.log",
    resources:
        timed_slot=0,  # a thread of Snakemake's own process, as plan
    run:
        host_slices.write_calibration(input.device, list(input.slices), output[0], log[0])


rule train:
    """One sweep point under torchrun. Always ends with status.json (ok, oom, timeout,
    crashed): a failed point is data, not a failed job."""
    input:
        point=rules.point_spec.output[0],
        # predict.before_run: a point above calibrate_on_max_n waits for the prediction
        before_run=lambda w: (rules.predict_before_run.output
                              if BEFORE_RUN_MAX_N is not None and POINTS[w.pid].n > BEFORE_RUN_MAX_N
                              else []),
    output:
        f"{OUT}/runs/{{pid}}/status.json",
    log:
        f"{OUT}/logs/train/{{pid}}.log",
    conda:
        ENV
    params:
        py=PY,
        point=lambda w, input: input.point,
        run_dir=lambda w, input: os.path.dirname(input.point),
    resources:
        timed_slot=1,
        # Slurm: nodes, tasks, cpus_per_task, mem_mb, runtime, gres, mpi (multi-node), ...
        **slurm.rule_resources(lambda w: slurm.point_resources(POINTS[w.pid])),
    shell:
        # exec: the runner is the job's process itself, so it ends with Snakemake
        # (scalestudy.run.lifetime)
        "exec {params.py:q} -m scalestudy run-point --job {params.point:q} {params.run_dir:q} > {log:q} 2>&1"
