"""The devices of the shipped hardware table (``data/hardware.yaml``): the words
``platform.hardware`` may be, each device's peak per precision and memory (facts with their
source, read by the aggregate's MFU and the planner's memory rule), and the rows the
performance model (``scalestudy.perf.hardware``) reads its systems from; this host's CPU."""

from __future__ import annotations

import os
import platform as pyplatform
import re
from functools import lru_cache
from importlib import resources

import yaml

from scalestudy.config.vocab import DType, member

TABLE = "hardware.yaml"


@lru_cache(maxsize=1)
def table() -> dict:
    """The parsed ``data/hardware.yaml``: ``{"devices": {...}, "systems": {...}}``."""
    text = resources.files("scalestudy").joinpath("data", TABLE).read_text()
    return yaml.safe_load(text)


def devices() -> dict[str, dict]:
    return table()["devices"]


def device_key(device_name_or_key: str | None) -> str | None:
    """Table key for a device name (``"NVIDIA H100 80GB HBM3"``), a key (``"H100-SXM5"``,
    any case) or an alias (``MI250X``); ``None`` when the table has no row for it."""
    if not device_name_or_key:
        return None
    name = str(device_name_or_key).strip().lower()
    for key, d in devices().items():
        if name == key.lower() or name in (a.lower() for a in d.get("aliases", ())):
            return key
    for key, d in devices().items():
        if any(re.search(p, name, flags=re.IGNORECASE) for p in d.get("names", ())):
            return key
    return None


def resolve_peak(device_name_or_key: str | None,
                 dtype: str) -> tuple[str | None, float | None, str | None]:
    """``(key, peak FLOP/s per device, source)`` for a device and precision; ``(None, None,
    None)`` for a CPU, an unknown device or a dtype that is not one of its MFU denominators."""
    dtype = member(DType, dtype, "dtype")
    key = device_key(device_name_or_key)
    if key is None:
        return None, None, None
    d = devices()[key]
    if dtype not in d.get("mfu_dtypes", ()):
        return None, None, None
    return key, float(d["peak_tflops"][dtype]) * 1e12, str(d["source"])


def memory_gb(device_name_or_key: str | None) -> float | None:
    """Memory per device (GB) of a known device, else None."""
    key = device_key(device_name_or_key)
    return None if key is None else float(devices()[key]["memory_gb"])


def cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return pyplatform.processor() or pyplatform.machine() or "cpu"


def usable_cpus() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
