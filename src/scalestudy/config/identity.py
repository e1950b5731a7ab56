"""A point's identity: the SHA-256 of everything that changes what it measures
(:func:`config_hash`) and its readable id, also its run folder's name (:func:`point_id`)."""

from __future__ import annotations

import hashlib
import json

from scalestudy.config import settings
from scalestudy.config.checks import PointError
from scalestudy.config.parts import HASHED_SITE, POINT_SECTIONS, Site
from scalestudy.config.point import Point
from scalestudy.config.sitepolicy import is_secret
from scalestudy.config.settings import Hash
from scalestudy.config.vocab import Device

#: Hex digits of the config hash shown in a point id (the record holds the full SHA-256).
ID_HASH_CHARS = 12

#: Fields added after points were first hashed: hashed only when they differ from their
#: default, so a point planned before they existed keeps its hash and id (and its results).
HASHED_WHEN_SET = {"cp": 1}

#: Fields that label or judge a point without changing what is measured: not hashed.
UNHASHED = ("study", "series", "repeat", "baseline_n", "feasible", "reason", "mem_estimate_gb",
            "flops_convention", "references", "retries", "config_hash", "point_id")


def measured_site(site: Site, cpu: bool = False) -> dict:
    """The :data:`HASHED_SITE` settings of a ``platform.site`` that are set; a secret-looking
    environment variable contributes its name only (its value, redacted in records, never
    enters the hash). ``cpu``: a CPU point, whose unset ``cpus_per_proc`` means 1 (so 1 is
    the same point as unset)."""
    out = {}
    for k in HASHED_SITE:
        v = getattr(site, k)
        if v in (None, "", {}, False) or (cpu and k == "cpus_per_proc" and v == 1):
            continue
        if k == "env":
            v = {n: ("<secret>" if is_secret(n) else x) for n, x in v.items()}
        out[k] = v
    return out


def config_hash(point: Point) -> str:
    """SHA-256 (hex) over everything that changes the measurement: the model, the layout,
    the training settings, the platform with its memory limit and the site settings of
    :data:`HASHED_SITE` (not names, repeat, timeouts, partition or other allocation
    choices)."""
    doc = point.to_json()
    for key in UNHASHED + ("schema_version",):
        doc.pop(key, None)
    for key, default in HASHED_WHEN_SET.items():
        if doc.get(key) == default:
            del doc[key]
    for key, cls in POINT_SECTIONS.items():  # each setting's own role (its declaration)
        for f, s in settings.declared(cls):
            if s.hash == Hash.NEVER or (s.hash == Hash.WHEN_SET
                                        and doc[key].get(f.name) == settings.json_default(f)):
                doc[key].pop(f.name, None)
    measured = measured_site(point.platform.site, cpu=point.platform.device == Device.CPU)
    if measured:  # (a point without such settings keeps its id)
        doc["platform"]["site"] = measured
    if not point.profile.enabled:  # (a point planned before profiling existed keeps its id)
        del doc["profile"]
    blob = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _id_count(x) -> str:
    return str(int(x)) if float(x).is_integer() else "x"


def point_id(point: Point, repeat: int | None = None) -> str:
    """The readable id, also the run folder's name:
    ``<series>_n<N>_dp<dp>-tp<tp>-pp<pp>_mb<mb>-ga<ga>-gb<gb>_<hash prefix>_r<repeat>``
    (``-cp<cp>`` after the pp with context parallelism; ``repeat``: the point's own unless
    given)."""
    if not point.config_hash:
        raise PointError("point_id: the point has no config_hash yet")
    repeat = point.repeat if repeat is None else repeat
    cp = f"-cp{point.cp}" if point.cp > 1 else ""
    return (f"{point.series}_n{point.n}_dp{_id_count(point.dp)}-tp{point.tp}-pp{point.pp}{cp}"
            f"_mb{point.micro_batch}-ga{_id_count(point.grad_accum)}-gb{_id_count(point.global_batch)}"
            f"_{point.config_hash[:ID_HASH_CHARS]}_r{repeat}")


def identify(point: Point, repeat: int = 0) -> Point:
    """``point`` with its ``config_hash``, ``repeat`` and ``point_id`` set."""
    p = point.replace(config_hash=config_hash(point), repeat=repeat)
    return p.replace(point_id=point_id(p))
