"""Device peaks (the MFU denominator) and device detection.

The peaks table ships with the package (``data/hardware_peaks.csv``, one row per device with
its source). A device the table does not know, a CPU, or a precision the table does not list
(fp32 on a GPU) gets no peak: ``(None, None, None)``, never a fallback guess.
"""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from importlib import resources


DTYPES = ("fp32", "bf16", "fp16")

# torch.cuda.get_device_name() strings -> table key. Order matters: first match wins.
# Variants with a different peak (H100 NVL, H200 NVL, A100 PCIe, GH200) are deliberately
# absent: they have no row, so they get no peak.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bMI250X\b", "MI250X-GCD"),  # "AMD Instinct MI250X (/ MI250)": one GCD per device
    (r"\bMI300X\b", "MI300X"),
    (r"\bH200\b(?!.*\bNVL\b)", "H200-SXM"),  # "NVIDIA H200"
    (r"\bH100\b.*\bPCIe\b", "H100-PCIe"),
    (r"\bH100\b.*\b(SXM|HBM3)\b", "H100-SXM5"),  # "NVIDIA H100 80GB HBM3"
    (r"\bA100[- ]SXM", "A100-SXM4"),  # "NVIDIA A100-SXM4-80GB" / "-40GB"
)


@lru_cache(maxsize=1)
def _peaks() -> "pd.DataFrame":
    import pandas as pd  # not at module level: every training rank imports this module

    with resources.files("scalestudy").joinpath("data", "hardware_peaks.csv").open() as f:
        return pd.read_csv(f)


def load_peaks() -> "pd.DataFrame":
    """The peaks table: ``device, unit, dtype, peak_tflops_dense, memory_gb, source`` (``device`` is the key)
    (``dtype`` is a ``/``-separated list, e.g. ``bf16/fp16``)."""
    return _peaks().copy()


def device_key(device_name_or_key: str | None) -> str | None:
    """Table key for a device name (``"NVIDIA H100 80GB HBM3"``) or key (``"H100-SXM5"``),
    or ``None`` when the table has no row for it."""
    if not device_name_or_key:
        return None
    name = str(device_name_or_key).strip()
    keys = {k.lower(): k for k in _peaks()["device"]}
    if name.lower() in keys:
        return keys[name.lower()]
    if name.lower() == "mi250x":  # the package: the table (and the Frontier study) count GCDs
        return "MI250X-GCD"
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return key
    return None


def resolve_peak(device_name_or_key: str | None, dtype: str) -> tuple[str | None, float | None, str | None]:
    """``(key, peak FLOP/s per device, source)`` for a device and precision
    (``fp32|bf16|fp16``); ``(None, None, None)`` for a CPU, an unknown device or a precision
    the table does not list."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
    key = device_key(device_name_or_key)
    if key is None:
        return None, None, None
    row = _peaks().set_index("device").loc[key]
    if dtype not in str(row["dtype"]).split("/"):
        return None, None, None
    return key, float(row["peak_tflops_dense"]) * 1e12, str(row["source"])


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def detect_device(device_type: str) -> dict:
    """``{"device_type", "device_name", "count"}`` of this host for ``cpu`` or ``cuda``
    (ROCm builds report as ``cuda``). For ``cpu`` the count is the usable cores."""
    if device_type == "cpu":
        try:
            count = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - non-Linux
            count = os.cpu_count() or 1
        return {"device_type": "cpu", "device_name": _cpu_name(), "count": count}
    if device_type == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("device_type='cuda' but torch sees no GPU; use device: cpu")
        return {
            "device_type": "cuda",
            "device_name": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
        }
    raise ValueError(f"device_type={device_type!r} is not supported; allowed: cpu, cuda")


def resolve_device_type(requested: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu`` (ROCm builds report cuda)."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("platform.device is cuda but no GPU is visible to this process")
    return requested
