"""The typed site settings: what a study's ``platform.site`` and a Slurm profile's ``site`` tell
Slurm, srun, torchrun and the ranks' environment (:class:`Site`).

A :class:`Site` is built once from one or more layers (:meth:`Site.resolve`: the study's
``platform.site``, then a profile's ``site``; later layers win, except with null; ``env``
merges name by name). Every value is converted to its type there, once: Snakemake passes a
profile's ``config:`` values as text (YAML BaseLoader), so ``"8"`` becomes 8, ``"true"``
True, ``""`` / ``"null"`` None; an unknown key or a value that is not a number is a
one-line ``ValueError``. What the settings may do (allowed environment variables and options,
secrets) is :mod:`scalestudy.config.sitepolicy`'s (:meth:`Site.check`, :meth:`Site.redacted`).
Each point carries its site as ``platform.site`` (``point.json`` holds :meth:`Site.to_json`);
only :data:`scalestudy.config.parts.HASHED_SITE` of it enters the point's config hash.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Mapping

from scalestudy.config import settings, sitepolicy
from scalestudy.config.settings import Hash, setting
from scalestudy.config.vocab import GPURequest, allowed, did_you_mean


#: What Slurm's names and the extra options may hold (a study's site text is passed to sbatch).
_NAME = "^[A-Za-z0-9_.-]*$"
_OPTIONS = "^[A-Za-z0-9_.,=:/@ -]*$"


@dataclass(frozen=True)
class Site:
    """Cluster specifics of a point (module docstring); every field is optional. Those that
    change what is measured are hashed when set (``when_set``): the ranks' environment (a
    secret-looking name's value is never hashed, only its name), cores per process and per
    node, devices per node, whole-node exclusivity, and the sbatch/srun/torchrun options (CPU
    and GPU binding); the others only choose or size the allocation (``never``)."""

    partition: str | None = setting(None, hash=Hash.NEVER, pattern="^[A-Za-z0-9_.,-]*$",
                                    doc="Slurm partition (sbatch -p); null: the cluster default")
    account: str | None = setting(None, hash=Hash.NEVER, pattern=_NAME,
                                  doc="Slurm account (sbatch -A); null: the user's default")
    qos: str | None = setting(None, hash=Hash.NEVER, pattern=_NAME,
                              doc="Slurm QoS (sbatch --qos); null: none")
    constraint: str | None = setting(None, hash=Hash.NEVER, pattern="^[A-Za-z0-9_.,&|()-]*$",
                                     doc="node feature constraint (sbatch -C); null: none")
    gpus_per_node: int | None = setting(
        None, hash=Hash.WHEN_SET, unit="count", minimum=0,
        doc="accelerators per node; null: the point's platform.devices_per_node")
    cpus_per_node: int | None = setting(
        None, hash=Hash.WHEN_SET, unit="count", minimum=1,
        doc="usable cores per node; sets cores per process on GPU sites")
    cpus_per_proc: int | None = setting(
        None, hash=Hash.WHEN_SET, unit="count", minimum=1,
        doc="cores per training process; null: cpus_per_node // gpus_per_node (GPU) or 1 (CPU)")
    mem_per_node_mb: int | None = setting(
        None, hash=Hash.NEVER, unit="MB", minimum=1,
        doc="memory per node; a point using P of G devices asks for P/G of it")
    mem_per_proc_mb: int | None = setting(
        None, hash=Hash.NEVER, unit="MB", minimum=1,
        doc="memory per training process; wins over mem_per_node_mb")
    gpu_request: GPURequest = setting(
        GPURequest.GRES, hash=Hash.NEVER, ref="gpu_request",
        doc="'gres' (--gres=gpu:P per node, default), 'gpus-per-node' (--gpus-per-node=P, e.g. "
            "Frontier) or 'none' (the nodes' GPUs come with the node)")
    exclusive: bool = setting(
        False, hash=Hash.WHEN_SET,
        doc="true: whole nodes per point (sbatch --exclusive), for timing isolation")
    extra: str | None = setting(
        None, hash=Hash.WHEN_SET, pattern=_OPTIONS,
        doc="further sbatch options from an allow-list (e.g. '--gpu-bind=closest'; "
            "config/sitepolicy.py SBATCH_OPTIONS; others with --trust-site)")
    srun_extra: str | None = setting(
        None, hash=Hash.WHEN_SET, pattern=_OPTIONS,
        doc="further options of the multi-node srun from an allow-list (sitepolicy.SRUN_OPTIONS; "
            "others with --trust-site)")
    torchrun_extra: str | None = setting(
        None, hash=Hash.WHEN_SET, pattern=_OPTIONS,
        doc="further torchrun options from an allow-list (e.g. '--numa-binding=node'; never the "
            "program, shape or rendezvous)")
    env: Mapping[str, str] = setting(
        factory=dict, hash=Hash.WHEN_SET,
        schema={"type": "object", "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                "additionalProperties": {"type": ["string", "number", "boolean"]}},
        doc="environment of the ranks (name: text), e.g. NCCL/RCCL settings; names from an "
            "allow-list (sitepolicy: NCCL_*, FI_*, OMP_*, ...; others with --trust-site); values "
            "of secret-looking names are redacted in every record")
    runtime_margin_min: int | None = setting(
        None, hash=Hash.NEVER, unit="min", minimum=0,
        doc="minutes added to platform.timeout_s for the Slurm time limit (default 5), so the "
            "runner's own watchdog fires first")
    rdzv_port: int | None = setting(
        None, hash=Hash.NEVER, minimum=1024, maximum=65535,
        doc="TCP port of the c10d rendezvous on the first node of a multi-node point; null: a "
            "free port the first node binds at job start")

    @classmethod
    def resolve(cls, *layers: Mapping | None) -> "Site":
        """The site of ``layers`` merged in order (module docstring), every value converted;
        ``ValueError`` (one line) for an unknown key or a value of the wrong kind."""
        merged: dict = {}
        env: dict[str, str] = {}
        for layer in layers:
            for key, value in (layer or {}).items():
                if key not in SITE_KEYS:
                    near = did_you_mean(key, SITE_KEYS)
                    raise ValueError(f"site: unknown key {key!r}{near}{' ' if near else '; '}"
                                     f"known keys: {', '.join(SITE_KEYS)}")
                if key == "env":
                    env.update({str(k): str(v) for k, v in (value or {}).items()})
                elif value is not None:  # null: not set in this layer (an earlier value stays)
                    merged[key] = value
        return cls(**{k: _convert(k, v) for k, v in merged.items()}, env=env)

    def merged(self, layer: Mapping | None) -> "Site":
        """This site with ``layer`` (a profile's ``site``) over it."""
        return Site.resolve(self.to_json(), layer) if layer else self

    def check(self, *, trusted: bool = False, where: str = "site") -> None:
        """The site policy on these settings (:mod:`~scalestudy.config.sitepolicy`):
        :class:`~scalestudy.config.sitepolicy.SiteError` (one line) for one not allowed."""
        sitepolicy.check_site_env(self.env, trusted=trusted, where=where)
        for key in sitepolicy.OPTION_KEYS:
            if getattr(self, key):
                sitepolicy.check_options(getattr(self, key), key, trusted=trusted, where=where)

    def redacted(self) -> tuple["Site", dict[str, str]]:
        """(this site with every secret-looking ``env`` value replaced by
        :data:`~scalestudy.config.sitepolicy.REDACTED`, {name: real value} of those)."""
        env, secrets = sitepolicy.split_secrets(self.env)
        return dataclasses.replace(self, env=env), secrets

    def to_json(self) -> dict:
        """The JSON form (``platform.site`` of ``study.json`` and ``point.json``): every key."""
        return {f.name: (dict(self.env) if f.name == "env" else getattr(self, f.name))
                for f in fields(self)}


#: Every site key and what it sets (the profiles' site.yaml files name them).
SITE_KEYS: dict[str, str] = {f.name: s.doc for f, s in settings.declared(Site)}
#: Keys whose value is a count, a size or a port (an integer).
_INT_KEYS = frozenset(f.name for f in fields(Site) if f.type == "int | None")
#: Words a profile writes for "not set".
_UNSET = ("", "null", "None")


def _convert(key: str, value):
    """One site value as its field's type (the profile's text included)."""
    if key in _INT_KEYS:
        if value in _UNSET:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            raise ValueError(f"site.{key}: expected an integer, got {value!r}") from None
    if key == "exclusive":
        if isinstance(value, str):
            return value.strip().lower() in ("1", "true", "yes", "on")
        return bool(value)
    if key == "gpu_request":
        try:
            return GPURequest(value or GPURequest.GRES)
        except ValueError:
            raise ValueError(f"site.gpu_request: {value!r}; use one of "
                             f"{allowed(GPURequest)}") from None
    return None if value in _UNSET else str(value)
