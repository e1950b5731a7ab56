"""Slurm specifics of a point: the Snakemake resources of its job under the ``slurm`` executor
plugin (sbatch flags), from its platform and its typed ``site`` settings
(:class:`scalestudy.config.site.Site`: the study's ``platform.site`` with a profile's
``config: site:`` over it, stored in each point's ``platform.site``; not part of the config
hash, so a point keeps its id on every machine).
"""

from __future__ import annotations

import math

from scalestudy.config.point import Point
from scalestudy.config.parts import Platform
from scalestudy.config.vocab import Device, GPURequest

DEFAULT_CPU_MEM_PER_PROC_MB = 1024

DEFAULT_RUNTIME_MARGIN_MIN = 5


def is_gpu(platform: Platform) -> bool:
    """GPU point: device cuda, or ``auto`` on a site that declares GPUs per node."""
    if platform.device == Device.AUTO:
        return bool(platform.site.gpus_per_node)
    return platform.device != Device.CPU


def cpus_per_task(procs: int, platform: Platform) -> int:
    """Cores for the one task per node that runs torchrun with ``procs`` processes."""
    site = platform.site
    per_proc = site.cpus_per_proc
    if per_proc is None:
        gpn = site.gpus_per_node or platform.devices_per_node
        if is_gpu(platform) and site.cpus_per_node and gpn:
            per_proc = max(1, site.cpus_per_node // gpn)
        else:
            per_proc = 1
    return procs * per_proc


def job_resources(nodes: int, procs: int, platform: Platform, label: str = "job") -> dict:
    """Snakemake resources of a job of ``nodes`` nodes with ``procs`` processes each for the
    ``slurm`` executor plugin, on ``platform`` (and its site).

    Units: ``mem_mb`` MB per node, ``runtime`` minutes. Multi-node jobs carry ``mpi="srun"``
    so the plugin's jobstep does not wrap the rule in ``srun`` (``run.launch.launch_argv``
    calls srun itself); GPUs are requested per node (``gres``) with ``tasks_per_gpu=0``."""
    site = platform.site
    k, p = nodes, procs
    if k < 1 or p < 1:
        raise ValueError(f"{label}: nodes={k} and procs_per_node={p} must be >= 1")
    gpu = is_gpu(platform)
    gpn = site.gpus_per_node or platform.devices_per_node
    if gpu and gpn and p > gpn:
        raise ValueError(f"{label}: procs_per_node={p} exceeds site.gpus_per_node={gpn}; raise "
                         "it or spread the point over more nodes")
    res: dict = {
        "nodes": k,
        "tasks": k,
        "cpus_per_task": cpus_per_task(p, platform),
    }
    if site.mem_per_proc_mb:
        res["mem_mb"] = p * site.mem_per_proc_mb
    elif site.mem_per_node_mb:
        frac = p / gpn if gpu and gpn else 1.0
        res["mem_mb"] = max(1, int(site.mem_per_node_mb * min(frac, 1.0)))
    elif gpu:
        res["mem_mb"] = 0  # no --mem: the cluster default (often the whole node)
    else:
        res["mem_mb"] = p * DEFAULT_CPU_MEM_PER_PROC_MB + 512  # + the torchrun launcher
    margin = site.runtime_margin_min
    res["runtime"] = math.ceil(float(platform.timeout_s) / 60) + (
        DEFAULT_RUNTIME_MARGIN_MIN if margin is None else margin)
    extra = []
    if gpu:
        res["tasks_per_gpu"] = 0
        if site.gpu_request == GPURequest.GRES:
            res["gres"] = f"gpu:{p}"
        elif site.gpu_request == GPURequest.GPUS_PER_NODE:
            extra.append(f"--gpus-per-node={p}")
    if k > 1:
        res["mpi"] = "srun"
    for key, name in (("partition", "slurm_partition"), ("account", "slurm_account"),
                      ("constraint", "constraint"), ("qos", "qos")):
        if getattr(site, key):
            res[name] = getattr(site, key)
    if site.exclusive:
        extra.append("--exclusive")
    if site.extra:
        extra.append(site.extra)
    if extra:
        res["slurm_extra"] = " ".join(extra)
    return res


def point_resources(point: Point) -> dict:
    """:func:`job_resources` of a training point."""
    return job_resources(point.nodes, point.procs_per_node, point.platform,
                         label=f"point {point.point_id}")


#: Every resource name :func:`job_resources` may set (the train rule declares them all; a
#: callable returning None drops the resource for that job, which matters for ``mpi``: the
#: jobstep wrapper tests its presence, not its value).
RESOURCE_KEYS = ("nodes", "tasks", "cpus_per_task", "mem_mb", "runtime", "tasks_per_gpu", "gres",
                 "mpi", "slurm_partition", "slurm_account", "constraint", "qos", "slurm_extra")


def rule_resources(resources_of) -> dict:
    """``{name: callable(wildcards)}`` for a Snakemake rule's ``resources:``, from
    ``resources_of(wildcards) -> dict`` (:func:`point_resources` or :func:`job_resources`):
    ``resources: **slurm.rule_resources(lambda w: slurm.point_resources(P[w.pid]))``."""
    def one(key):
        return lambda wildcards: resources_of(wildcards).get(key)
    return {key: one(key) for key in RESOURCE_KEYS}
