rule calibrate:
    """Measured matmul ceiling of this study's device (the denominator of 'utilisation vs
    measured ceiling') and the rate of the study's own matrix products (for the performance
    model). Timed, so it never shares the host with a training job."""
    output:
        f"{OUT}/calibration.json",
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
        device=STUDY["platform"]["device"],
        dtype=STUDY["train"]["precision"],
        shapes=" ".join("x".join(map(str, s)) for s in gemm_shapes(POINTS.values())),
        # the framework overhead of this host (a CPU study's performance model): plain, and
        # under DTensor when the study has tensor-parallel points
        overhead="plain tp" if any(p.tp > 1 for p in POINTS.values() if p.feasible) else "plain",
    shell:
        "{params.py:q} -m scalestudy.measure.calibrate --device {params.device} --dtype {params.dtype}"
        " --out {output:q} --shapes {params.shapes} --overhead {params.overhead} > {log:q} 2>&1"


rule train:
    """One sweep point under torchrun. Always ends with status.json (ok, oom, timeout,
    crashed): a failed point is data, not a failed job."""
    input:
        f"{OUT}/runs/{{pid}}/point.json",
    output:
        f"{OUT}/runs/{{pid}}/status.json",
    log:
        f"{OUT}/logs/train/{{pid}}.log",
    conda:
        ENV
    params:
        py=PY,
        run_dir=lambda w, input: os.path.dirname(input[0]),
    resources:
        timed_slot=1,
        # Slurm: nodes, tasks, cpus_per_task, mem_mb, runtime, gres, mpi (multi-node), ...
        **slurm.rule_resources(lambda w: slurm.point_resources(POINTS[w.pid])),
    shell:
        "{params.py:q} -m scalestudy.run.runner {input:q} {params.run_dir:q} > {log:q} 2>&1"
