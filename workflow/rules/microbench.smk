# Building-block measurements (scalestudy.measure.microbench) on the study's own hardware: matmul
# throughput by shape and dtype, collective bandwidth/latency by size and group size, one
# tidy CSV and one figure each. They feed `scalestudy predict` (scalestudy.perf.rates.Measured).
# Study key (all optional):
#   microbench: {enabled: false, matmul_sizes: [256, 512, 1024], dtypes: [fp32, bf16],
#                sizes: [4096, 65536, 1048576, 8388608], group_sizes: [2]}
# The measuring jobs are timed: they hold the host's only `timed_slot`, like training; the
# collectives are measured in slices among the runs (collectives.COLLECTIVE_SLICES), pooled.
# Needs OUT, PY and STUDY from the Snakefile; include this file and add MICROBENCH_OUTPUTS
# to `rule all`.
import shlex

from scalestudy.measure import collectives
from scalestudy.run.launch import local_torchrun

localrules: microbench_collectives

MB = STUDY.microbench
MB_GROUPS = sorted(set(MB.group_sizes))
MICROBENCH_OUTPUTS = (
    expand(f"{OUT}/microbench/{{kind}}.{{ext}}", kind=["matmul", "collectives"], ext=["csv", "png"])
    if MB.enabled else []
)


rule microbench_matmul:
    output:
        f"{OUT}/microbench/matmul.csv",
    log:
        f"{OUT}/logs/microbench_matmul.log",
    conda:
        ENV
    resources:
        timed_slot=1,
    params:
        py=PY,
        device=str(STUDY.platform.device),
        sizes=" ".join(str(s) for s in MB.matmul_sizes),
        dtypes=" ".join(MB.dtypes),
    shell:
        "OMP_NUM_THREADS=1 timeout 300 {params.py:q} -m scalestudy microbench matmul"
        " --device {params.device} --sizes {params.sizes} --dtypes {params.dtypes}"
        " --out {output:q} > {log:q} 2>&1"


rule microbench_collectives_slice:
    """One slice of the collectives measurement: the slices are jobs of their own, run among
    the training runs, so that together they sample the host across the sweep."""
    output:
        f"{OUT}/microbench/collectives/slice_{{k}}.csv",
    log:
        f"{OUT}/logs/microbench_collectives_{{k}}.log",
    wildcard_constraints:
        k=r"\d+",
    conda:
        ENV
    resources:
        timed_slot=1,
    params:
        py=PY,
        nproc=max(MB_GROUPS),
        sizes=" ".join(str(s) for s in MB.sizes),
        groups=" ".join(str(g) for g in MB_GROUPS),
        samples=collectives.COLLECTIVE_SLICE_SAMPLES,
        # torchrun whose stores listen on loopback only (run/launch.py local_torchrun)
        launcher=shlex.join(local_torchrun(max(MB_GROUPS), PY)),
    shell:
        "OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo NCCL_SOCKET_IFNAME=lo timeout 300"
        " {params.launcher} -m scalestudy microbench collectives"
        " --sizes {params.sizes} --group-sizes {params.groups} --samples {params.samples}"
        " --out {output:q} > {log:q} 2>&1"


rule microbench_collectives:
    """The collectives' slices in one table (scalestudy.measure.collectives.pool_slices)."""
    input:
        expand(rules.microbench_collectives_slice.output[0], k=range(collectives.COLLECTIVE_SLICES)),
    output:
        f"{OUT}/microbench/collectives.csv",
    log:
        f"{OUT}/logs/microbench_collectives.log",
    resources:
        timed_slot=0,  # a thread of Snakemake's own process, as plan
    run:
        collectives.pool_slices(list(input), output[0], log[0])


rule microbench_plot:
    input:
        f"{OUT}/microbench/{{kind}}.csv",
    output:
        f"{OUT}/microbench/{{kind}}.png",
    log:
        f"{OUT}/logs/microbench_plot_{{kind}}.log",
    conda:
        ENV
    params:
        py=PY,
    wildcard_constraints:
        kind="matmul|collectives",
    shell:
        "{params.py:q} -m scalestudy microbench plot {wildcards.kind} {input:q}"
        " --out {output:q} > {log:q} 2>&1"
