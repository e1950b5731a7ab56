"""The hardware description: device peaks (the MFU denominator) and systems (the performance
model's presets), both read from one file shipped with the package, ``data/hardware.yaml``.

A device the table does not know, a CPU, or a precision that is not an MFU denominator of the
device (fp32 on a GPU) gets no peak: ``(None, None, None)``, never a fallback guess.
Units: peaks in FLOP/s, memory in bytes (the YAML says TFLOP/s and GB), bandwidth in bytes/s
per direction per device, latency in seconds per collective call.
"""

from __future__ import annotations

import os
import platform as pyplatform
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

from scalestudy.config.vocab import DType, parse

TABLE = "hardware.yaml"


@lru_cache(maxsize=1)
def table() -> dict:
    """The parsed ``data/hardware.yaml``: ``{"devices": {...}, "systems": {...}}``."""
    import yaml

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
    dtype = parse(DType, dtype, "dtype")
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


def peaks_table():
    """The devices as a table: ``device, unit, mfu_dtypes, peak_tflops_dense (bf16),
    memory_gb, source`` (a pandas DataFrame, for documentation and checks)."""
    import pandas as pd

    return pd.DataFrame([{"device": k, "unit": d["unit"], "mfu_dtypes": "/".join(d["mfu_dtypes"]),
                          "peak_tflops_dense": d["peak_tflops"]["bf16"],
                          "memory_gb": d["memory_gb"], "source": d["source"]}
                         for k, d in devices().items()])


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


# --- systems (the performance model's presets) ----------------------------------------------


@dataclass(frozen=True)
class Link:
    """A communication path: ``bandwidth`` in bytes/s per direction per device, ``latency``
    in seconds per collective call, ``bandwidth_pair`` (optional) for groups of two."""

    bandwidth: float
    latency: float
    bandwidth_pair: float | None = None

    def bw(self, group: int, adjacent: bool = True) -> float:
        """Bandwidth for a group of ``group`` ranks; ``adjacent``: consecutive devices (the
        pair bandwidth applies to two adjacent devices only, e.g. the GCDs of one MI250X)."""
        if group == 2 and adjacent and self.bandwidth_pair:
            return self.bandwidth_pair
        return self.bandwidth


@dataclass(frozen=True)
class HardwareSpec:
    """A device and its interconnect. Rates in FLOP/s and bytes/s, sizes in bytes."""

    name: str
    device: str
    devices_per_node: int
    peak_flops: dict
    memory_bytes: float
    mem_bw: float
    matmul_efficiency: float
    intra: Link
    inter: Link | None = None
    source: str = ""
    overhead: dict = field(default_factory=dict)
    compute_units: int | None = None  # cores a CPU node's processes share; None: one per device

    def peak(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise ValueError(f"hardware {self.name!r} declares no peak for {dtype!r}; add "
                             "peak_tflops to its description")
        return float(self.peak_flops[dtype])

    @classmethod
    def from_dict(cls, d: dict, name: str, source: str = "") -> "HardwareSpec":
        """A system entry of ``hardware.yaml`` (or a YAML file of the same form). Its device's
        peaks, memory and bandwidth come from the devices table unless it declares them."""
        dev = devices().get(d.get("device") or "", {})
        for key in ("devices_per_node", "intra_node"):
            if key not in d:
                raise ValueError(f"hardware {name!r}: {key} is missing")
        peaks = d.get("peak_tflops") or dev.get("peak_tflops")
        mem = d.get("memory_gb") or dev.get("memory_gb")
        if not peaks or mem is None:
            raise ValueError(f"hardware {name!r}: device {d.get('device')!r} is not in the "
                             "devices table; declare peak_tflops and memory_gb")

        def link(x):
            if not x:
                return None
            return Link(float(x["bandwidth"]), float(x.get("latency", 0.0)),
                        float(x["bandwidth_pair"]) if x.get("bandwidth_pair") else None)

        return cls(
            name=name, device=str(d.get("device") or name),
            devices_per_node=int(d["devices_per_node"]),
            peak_flops={k: float(v) * 1e12 for k, v in peaks.items()},
            memory_bytes=float(mem) * 1e9,
            mem_bw=float(d.get("mem_bw") or dev.get("mem_bw") or 1e12),
            matmul_efficiency=float(d.get("matmul_efficiency", 1.0)),
            intra=link(d["intra_node"]), inter=link(d.get("inter_node")), source=source,
            overhead={k: float(v) for k, v in (d.get("overhead") or {}).items()},
            compute_units=int(d["compute_units"]) if d.get("compute_units") else None,
        )

    @classmethod
    def load(cls, name_or_path: str) -> "HardwareSpec":
        """A system of ``hardware.yaml`` by name, or a YAML file describing one."""
        import yaml

        p = Path(name_or_path)
        if p.suffix in (".yaml", ".yml") and p.exists():
            d = yaml.safe_load(p.read_text())
            return cls.from_dict(d, str(d.get("name") or p.stem), source=str(p))
        systems = table()["systems"]
        if name_or_path not in systems:
            raise ValueError(f"--hardware {name_or_path!r}: no such preset; use one of "
                             f"{', '.join(presets())} or a path to a YAML file")
        return cls.from_dict(systems[name_or_path], name_or_path,
                             source=f"preset {name_or_path}")


def presets() -> list[str]:
    """Names of the systems in ``hardware.yaml``."""
    return sorted(table()["systems"])
