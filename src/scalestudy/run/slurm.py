"""Slurm specifics of a point: the ``site`` settings, the Snakemake resources of its job under
the ``slurm`` executor plugin (sbatch flags), and what the ranks see of Slurm.

Site settings (partition, account, GPUs per node, NCCL/RCCL environment, ...) come from a
``site`` mapping, never from code: the study's ``platform.site`` merged with the profile's
``config: site:`` (:func:`resolve_site`) and stored in each point's ``platform.site`` (not part
of the config hash, so a point keeps its id on every machine). :data:`SITE_KEYS` lists the keys.
"""

from __future__ import annotations

import math
from typing import Mapping

from scalestudy.config.point import Platform, Point
from scalestudy.config.vocab import Device, GPURequest, allowed

#: Keys of the ``site`` mapping (study ``platform.site`` / profile ``config: site:``).
SITE_KEYS: dict[str, str] = {
    "partition": "Slurm partition (sbatch -p); null: the cluster default",
    "account": "Slurm account (sbatch -A); null: the user's default",
    "qos": "Slurm QoS (sbatch --qos); null: none",
    "constraint": "node feature constraint (sbatch -C); null: none",
    "gpus_per_node": "accelerators per node; null: the point's platform.devices_per_node",
    "cpus_per_node": "usable cores per node; sets cores per process on GPU sites",
    "cpus_per_proc": "cores per training process; null: cpus_per_node // gpus_per_node "
    "(GPU) or 1 (CPU)",
    "mem_per_node_mb": "memory per node (MB); a point using P of G devices asks for P/G of it",
    "mem_per_proc_mb": "memory per training process (MB); wins over mem_per_node_mb",
    "gpu_request": "'gres' (--gres=gpu:P per node, default), 'gpus-per-node' "
    "(--gpus-per-node=P, e.g. Frontier) or 'none' (the nodes' GPUs come with the node)",
    "exclusive": "true: whole nodes per point (sbatch --exclusive), for timing isolation",
    "extra": "further sbatch options from an allow-list (e.g. '--gpu-bind=closest'; "
    "config/sitepolicy.py SBATCH_OPTIONS; others with --trust-site)",
    "srun_extra": "further options of the multi-node srun from an allow-list "
    "(sitepolicy.SRUN_OPTIONS; others with --trust-site)",
    "torchrun_extra": "further torchrun options from an allow-list (e.g. "
    "'--numa-binding=node'; never the program, shape or rendezvous)",
    "env": "environment of the ranks (mapping), e.g. NCCL/RCCL settings; names from an "
    "allow-list (sitepolicy: NCCL_*, FI_*, OMP_*, ...; others with --trust-site); "
    "values of secret-looking names are redacted in every record",
    "runtime_margin_min": "minutes added to platform.timeout_s for the Slurm time limit "
    "(default 5), so the runner's own watchdog fires first",
    "rdzv_port": "c10d rendezvous port on the first node of a multi-node point; "
    "null: a free port the first node binds at job start",
}

_INT_KEYS = ("gpus_per_node", "cpus_per_node", "cpus_per_proc", "mem_per_node_mb",
             "mem_per_proc_mb", "runtime_margin_min", "rdzv_port")


DEFAULT_CPU_MEM_PER_PROC_MB = 1024

DEFAULT_RUNTIME_MARGIN_MIN = 5


def resolve_site(*layers: Mapping | None) -> dict:
    """Merge site mappings (later layers win, except with null; ``env`` merges key by key) and
    coerce types.

    Snakemake passes profile ``config:`` values as strings (YAML BaseLoader), so numbers and
    booleans are converted here. Unknown keys raise: a typo must not silently do nothing."""
    site: dict = {}
    env: dict = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if key not in SITE_KEYS:
                raise ValueError(f"site: unknown key {key!r}; known keys: {', '.join(SITE_KEYS)}")
            if value is None:  # null: not set in this layer (an earlier layer's value stays)
                site.setdefault(key, None)
            elif key == "env":
                env.update({str(k): str(v) for k, v in (value or {}).items()})
            else:
                site[key] = value
    for key in _INT_KEYS:
        if site.get(key) in ("", "null", "None"):
            site[key] = None
        if site.get(key) is not None:
            try:
                site[key] = int(site[key])
            except (TypeError, ValueError):
                raise ValueError(f"site.{key}: expected an integer, got {site[key]!r}") from None
    for key in ("partition", "account", "qos", "constraint", "extra", "srun_extra",
                "torchrun_extra"):
        if site.get(key) in ("", "null", "None"):
            site[key] = None
    if isinstance(site.get("exclusive"), str):
        site["exclusive"] = site["exclusive"].strip().lower() in ("1", "true", "yes", "on")
    try:
        site["gpu_request"] = GPURequest(site.get("gpu_request") or GPURequest.GRES)
    except ValueError:
        raise ValueError(f"site.gpu_request: {site['gpu_request']!r}; use one of "
                         f"{allowed(GPURequest)}") from None
    site["env"] = env
    return site


def point_site(platform: Platform, site: Mapping | None = None) -> dict:
    """The given site, else the platform's ``site``, resolved."""
    return resolve_site(platform.site if site is None else site)


def is_gpu(platform: Platform, site: Mapping | None = None) -> bool:
    """GPU point: device cuda, or ``auto`` on a site that declares GPUs per node."""
    if platform.device == Device.AUTO:
        return bool((site or {}).get("gpus_per_node"))
    return platform.device != Device.CPU


def cpus_per_task(procs: int, platform: Platform, site: Mapping | None = None) -> int:
    """Cores for the one task per node that runs torchrun with ``procs`` processes."""
    site = point_site(platform, site)
    per_proc = site.get("cpus_per_proc")
    if per_proc is None:
        gpn = site.get("gpus_per_node") or platform.devices_per_node
        if is_gpu(platform, site) and site.get("cpus_per_node") and gpn:
            per_proc = max(1, int(site["cpus_per_node"]) // int(gpn))
        else:
            per_proc = 1
    return procs * per_proc


def job_resources(nodes: int, procs: int, platform: Platform, site: Mapping | None = None,
                  label: str = "job") -> dict:
    """Snakemake resources of a job of ``nodes`` nodes with ``procs`` processes each for the
    ``slurm`` executor plugin.

    Units: ``mem_mb`` MB per node, ``runtime`` minutes. Multi-node jobs carry ``mpi="srun"``
    so the plugin's jobstep does not wrap the rule in ``srun`` (``run.launch.launch_argv``
    calls srun itself); GPUs are requested per node (``gres``) with ``tasks_per_gpu=0``."""
    site = point_site(platform, site)
    k, p = nodes, procs
    if k < 1 or p < 1:
        raise ValueError(f"{label}: nodes={k} and procs_per_node={p} must be >= 1")
    gpu = is_gpu(platform, site)
    gpn = site.get("gpus_per_node") or platform.devices_per_node
    if gpu and gpn and p > int(gpn):
        raise ValueError(f"{label}: procs_per_node={p} exceeds site.gpus_per_node={gpn}; raise "
                         "it or spread the point over more nodes")
    res: dict = {
        "nodes": k,
        "tasks": k,
        "cpus_per_task": cpus_per_task(p, platform, site),
    }
    if site.get("mem_per_proc_mb"):
        res["mem_mb"] = p * site["mem_per_proc_mb"]
    elif site.get("mem_per_node_mb"):
        frac = p / int(gpn) if gpu and gpn else 1.0
        res["mem_mb"] = max(1, int(site["mem_per_node_mb"] * min(frac, 1.0)))
    elif gpu:
        res["mem_mb"] = 0  # no --mem: the cluster default (often the whole node)
    else:
        res["mem_mb"] = p * DEFAULT_CPU_MEM_PER_PROC_MB + 512  # + the torchrun launcher
    margin = site.get("runtime_margin_min")
    res["runtime"] = math.ceil(float(platform.timeout_s) / 60) + (
        DEFAULT_RUNTIME_MARGIN_MIN if margin is None else margin)
    extra = []
    if gpu:
        res["tasks_per_gpu"] = 0
        if site["gpu_request"] == "gres":
            res["gres"] = f"gpu:{p}"
        elif site["gpu_request"] == "gpus-per-node":
            extra.append(f"--gpus-per-node={p}")
    if k > 1:
        res["mpi"] = "srun"
    for key, name in (("partition", "slurm_partition"), ("account", "slurm_account"),
                      ("constraint", "constraint"), ("qos", "qos")):
        if site.get(key):
            res[name] = str(site[key])
    if site.get("exclusive"):
        extra.append("--exclusive")
    if site.get("extra"):
        extra.append(str(site["extra"]))
    if extra:
        res["slurm_extra"] = " ".join(extra)
    return res


def point_resources(point: Point, site: Mapping | None = None) -> dict:
    """:func:`job_resources` of a training point."""
    return job_resources(point.nodes, point.procs_per_node, point.platform, site,
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
