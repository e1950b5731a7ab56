# Building-block measurements (scalestudy.microbench): matmul throughput and collective
# bandwidth on the study's hardware, as tidy CSVs and one figure each. Enabled by the study key
#   microbench: {enabled: true, sizes: [bytes...], matmul_sizes: [n...], group_sizes: [p...]}
# Timed jobs take every device of the host (resource `devices`) so nothing shares them.

_MB = config.get("microbench", {}) or {}
_MB_DEVICES = int(_MB.get("devices", config.get("platform", {}).get("devices_per_node", 2)))


def microbench_outputs(study):
    if not _MB.get("enabled", False):
        return []
    return expand(
        "results/{study}/microbench/{kind}.{ext}",
        study=study, kind=["matmul", "collectives"], ext=["csv", "png"],
    )


rule microbench_matmul:
    output:
        "results/{study}/microbench/matmul.csv",
    params:
        sizes=" ".join(str(s) for s in _MB.get("matmul_sizes", [256, 512, 1024])),
        dtypes=" ".join(_MB.get("dtypes", ["fp32", "bf16"])),
    resources:
        devices=_MB_DEVICES,
    log:
        "results/{study}/microbench/matmul.log",
    shell:
        "OMP_NUM_THREADS=1 timeout 300 python -m scalestudy.microbench matmul --out {output} "
        "--sizes {params.sizes} --dtypes {params.dtypes} > {log} 2>&1"


rule microbench_collectives:
    output:
        "results/{study}/microbench/collectives.csv",
    params:
        sizes=" ".join(str(s) for s in _MB.get("sizes", [4096, 65536, 1048576, 8388608])),
        groups=" ".join(str(g) for g in _MB.get("group_sizes", [2])),
        nproc=max(_MB.get("group_sizes", [2])),
    resources:
        devices=lambda wc: max(_MB.get("group_sizes", [2])),
    log:
        "results/{study}/microbench/collectives.log",
    shell:
        "OMP_NUM_THREADS=1 timeout 300 torchrun --standalone --nproc-per-node {params.nproc} "
        "-m scalestudy.microbench collectives --out {output} --sizes {params.sizes} "
        "--group-sizes {params.groups} > {log} 2>&1"


rule microbench_plot:
    input:
        "results/{study}/microbench/{kind}.csv",
    output:
        "results/{study}/microbench/{kind}.png",
    wildcard_constraints:
        kind="matmul|collectives",
    shell:
        "python -m scalestudy.microbench plot {wildcards.kind} {input} --out {output}"
