"""Energy per training step from the device's own counters, where it exposes one.

One reader is chosen once per rank (``open_reader``), by device and availability:

- ``nvml`` (CUDA): ``nvmlDeviceGetTotalEnergyConsumption`` of the rank's GPU (mJ since the
  driver loaded; Volta and newer) through ``nvidia-ml-py`` (``import pynvml``), an optional
  package: without it there is no NVIDIA reading. Scope: the device, named by its NVML UUID
  (ranks sharing one GPU read the same counter: it is counted once).
- ``amdsmi`` (ROCm): ``amdsmi_get_energy_count`` of the rank's GPU (accumulator × resolution,
  µJ). Scope: the device.
- ``rapl`` (CPU): Linux powercap, the package zones ``intel-rapl:N`` under
  ``/sys/class/powercap`` (``energy_uj``, wrapping at ``max_energy_range_uj``; the same driver
  serves AMD CPUs). Usually readable by root only. Scope: the host: every process on the
  package is included, so a point's energy counts each host once.

``SCALESTUDY_ENERGY`` = ``auto`` (default) | ``off`` | ``nvml`` | ``amdsmi`` | ``rapl`` forces a
choice; ``SCALESTUDY_POWERCAP`` points the RAPL reader at another tree (tests). When no
counter is readable, the reason is recorded instead of a number (never a guess).

Reading: the counter is read in the trainer's untimed step hook, before each step's first
device synchronisation, and once after the timed loop (``StepEnergy``): step ``i``'s energy is
the difference of the readings before steps ``i`` and ``i+1``, over the time between them. No
device synchronisation or collective is added; the timed region (between the two
synchronisations of ``train.loop.timed_steps``) is untouched.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path
from typing import Callable

POWERCAP = "/sys/class/powercap"
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


class EnergyUnavailable(Exception):
    """No readable energy counter (the message says why)."""


class RaplReader:
    """Sum of the package zones' ``energy_uj`` (joules), with wrap-around handled."""

    source, scope = "rapl", "host"

    def __init__(self, root: str | os.PathLike | None = None):
        root = Path(root or os.environ.get("SCALESTUDY_POWERCAP") or POWERCAP)
        if not root.is_dir():
            raise EnergyUnavailable(f"no RAPL: {root} does not exist")
        zones = []
        for z in sorted(root.iterdir()):
            if not _PACKAGE_ZONE.match(z.name):
                continue  # sub-zones (core, dram) are inside their package; mmio duplicates it
            try:
                name = (z / "name").read_text().strip()
            except OSError:
                name = ""
            if name and not name.startswith("package"):
                continue  # psys (platform) would count the packages twice
            zones.append(z)
        if not zones:
            raise EnergyUnavailable(f"no RAPL package zone under {root}")
        self.zones, self.last, self.range, self.total_uj = zones, [], [], 0.0
        for z in zones:
            try:
                self.last.append(int((z / "energy_uj").read_text()))
            except PermissionError:
                raise EnergyUnavailable(f"RAPL not readable: {z / 'energy_uj'} needs root "
                                        "(or a relaxed powercap permission)") from None
            except (OSError, ValueError) as e:
                raise EnergyUnavailable(f"RAPL not readable: {z / 'energy_uj'}: {e}") from None
            try:
                self.range.append(int((z / "max_energy_range_uj").read_text()))
            except (OSError, ValueError):
                self.range.append(0)

    def read(self) -> float:
        for i, z in enumerate(self.zones):
            raw = int((z / "energy_uj").read_text())
            delta = raw - self.last[i]
            if delta < 0:  # the counter wrapped
                delta += self.range[i] or 0
            self.total_uj += max(delta, 0)
            self.last[i] = raw
        return self.total_uj * 1e-6


class NvmlReader:
    """Total energy of one NVIDIA GPU (joules) through NVML."""

    source, scope = "nvml", "device"

    def __init__(self, device_index: int, uuid: str | None = None):
        try:
            import pynvml
        except ImportError:
            raise EnergyUnavailable("no NVML: the optional package nvidia-ml-py (import "
                                    "pynvml) is not installed") from None
        try:
            pynvml.nvmlInit()
            handle = None
            if uuid:
                try:
                    handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                except pynvml.NVMLError:
                    handle = None
            if handle is None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(_physical_index(device_index))
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except pynvml.NVMLError as e:
            raise EnergyUnavailable(f"NVML energy counter not readable: {e}") from None
        self.nvml, self.handle = pynvml, handle
        try:
            got = pynvml.nvmlDeviceGetUUID(handle)
            self.device_id = got.decode() if isinstance(got, bytes) else str(got)
        except (pynvml.NVMLError, AttributeError):
            self.device_id = None  # then each rank counts as a device of its own

    def read(self) -> float:
        return self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) * 1e-3


class AmdSmiReader:
    """Energy accumulator of one AMD GPU (joules) through AMD SMI."""

    source, scope = "amdsmi", "device"

    def __init__(self, device_index: int):
        try:
            import amdsmi
        except ImportError:
            raise EnergyUnavailable("no AMD SMI: the amdsmi Python package is not "
                                    "installed") from None
        try:
            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            physical = _physical_index(device_index, "ROCR_VISIBLE_DEVICES",
                                       "HIP_VISIBLE_DEVICES")
            self.handle, self.device_id = handles[physical], f"amdsmi:{physical}"
            self.amdsmi = amdsmi
            self.read()
        except (amdsmi.AmdSmiException, IndexError, KeyError, TypeError) as e:
            raise EnergyUnavailable(f"AMD SMI energy counter not readable: {e}") from None

    def read(self) -> float:
        e = self.amdsmi.amdsmi_get_energy_count(self.handle)
        acc = e.get("energy_accumulator", e.get("power"))
        return float(acc) * float(e.get("counter_resolution", 1.0)) * 1e-6


def _physical_index(local: int, *variables: str) -> int:
    """The physical index of the ``local``-th visible device (``CUDA_VISIBLE_DEVICES`` etc.
    when it lists integers)."""
    for var in variables or ("CUDA_VISIBLE_DEVICES",):
        vis = os.environ.get(var)
        if vis:
            ids = [x.strip() for x in vis.split(",") if x.strip()]
            if local < len(ids) and ids[local].isdigit():
                return int(ids[local])
    return local


def open_reader(device_type: str, device_index: int = 0, uuid: str | None = None):
    """``(reader, None)`` or ``(None, why not)`` for this rank's device (module doc)."""
    choice = os.environ.get("SCALESTUDY_ENERGY", "auto").strip().lower() or "auto"
    if choice == "off":
        return None, "energy recording switched off (SCALESTUDY_ENERGY=off)"
    if choice == "auto":
        if device_type == "cuda":
            import torch

            order = ["amdsmi"] if getattr(torch.version, "hip", None) else ["nvml"]
        else:
            order = ["rapl"]
    elif choice in ("nvml", "amdsmi", "rapl"):
        order = [choice]
    else:
        return None, f"SCALESTUDY_ENERGY={choice!r} is not one of auto, off, nvml, amdsmi, rapl"
    reasons = []
    for name in order:
        try:
            if name == "nvml":
                return NvmlReader(device_index, uuid), None
            if name == "amdsmi":
                return AmdSmiReader(device_index), None
            return RaplReader(), None
        except EnergyUnavailable as e:
            reasons.append(str(e))
    return None, "; ".join(reasons)


class StepEnergy:
    """Readings of one rank's counter before every step and after the loop."""

    def __init__(self, reader, reason: str | None = None):
        self.reader, self.reason = reader, reason
        self.readings: list[tuple[float, float]] = []  # (joules, perf_counter seconds)

    @classmethod
    def for_device(cls, device) -> "StepEnergy":
        index, uuid = 0, None
        if device.type == "cuda":
            import torch

            index = device.index if device.index is not None else torch.cuda.current_device()
            props = torch.cuda.get_device_properties(index)
            uid = getattr(props, "uuid", None)
            uuid = f"GPU-{uid}" if uid is not None and not str(uid).startswith("GPU-") else uid
        reader, reason = open_reader(device.type, index, uuid)
        return cls(reader, reason)

    def mark(self, _step: int | None = None) -> None:
        """Read the counter (the step hook; untimed)."""
        if self.reader is None:
            return
        try:
            self.readings.append((self.reader.read(), time.perf_counter()))
        except Exception as e:  # noqa: BLE001 - a counter that fails mid-run: no energy, say why
            self.reason, self.reader = f"{self.reader.source} read failed: {e}", None
            self.readings = []

    def record(self) -> dict:
        """This rank's per-step energy (J) and the interval each covers (s)."""
        host = socket.gethostname()
        if self.reader is None or len(self.readings) < 2:
            return {"source": None, "reason": self.reason or "no readings", "host": host}
        j = [b[0] - a[0] for a, b in zip(self.readings, self.readings[1:])]
        s = [b[1] - a[1] for a, b in zip(self.readings, self.readings[1:])]
        return {"source": self.reader.source, "scope": self.reader.scope, "host": host,
                "device_id": getattr(self.reader, "device_id", None), "j": j, "s": s}


def chain(*hooks: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """One step hook calling each given hook in order (None: no hook at all)."""
    hs = [h for h in hooks if h is not None]
    if not hs:
        return None
    if len(hs) == 1:
        return hs[0]

    def hook(step: int) -> None:
        for h in hs:
            h(step)
    return hook


def summarize(records: list[dict | None], steps: int, warmup: int,
              tokens_per_step: float) -> tuple[list[dict], dict]:
    """Per-step fields for ``steps.jsonl`` and the ``energy`` entry of ``summary.json`` from
    every rank's ``StepEnergy.record()`` (rank order).

    A device-scope counter is counted once per physical device (its first rank: ranks sharing
    one GPU read the same counter; a rank without a device id counts on its own); a
    host-scope counter (RAPL) once per host. ``joules_per_token`` = energy over the steady-state steps ÷
    their tokens; ``avg_power_w`` = per counted rank, its steady energy ÷ the time it covers,
    summed. Without a counter on every rank: no numbers, the reason."""
    recs = [r or {} for r in records]
    missing = [i for i, r in enumerate(recs)
               if not r.get("source") or len(r.get("j") or []) != steps]
    if not recs or missing:
        why = next((recs[i].get("reason") for i in missing if recs[i].get("reason")), None)
        reason = why or "no energy readings"
        if recs and len(missing) < len(recs):
            reason = f"rank {missing[0]} has no energy readings: {reason}"
        return [{} for _ in range(steps)], {"source": None, "reason": reason}
    sources = sorted({r["source"] for r in recs})
    scope = recs[0].get("scope", "device")
    seen, counted = set(), []
    for i, r in enumerate(recs):
        key = (r.get("host"),) if scope == "host" else (
            (r.get("host"), r["device_id"]) if r.get("device_id") else ("rank", i))
        if key not in seen:
            seen.add(key)
            counted.append(i)
    per_step = [{"energy_j": sum(recs[i]["j"][k] for i in counted),
                 "rank_energy_j": [r["j"][k] for r in recs]} for k in range(steps)]
    steady = range(warmup, steps)
    joules = sum(recs[i]["j"][k] for i in counted for k in steady)
    power = sum(sum(recs[i]["j"][k] for k in steady) / max(sum(recs[i]["s"][k] for k in steady),
                                                            1e-12) for i in counted)
    tokens = tokens_per_step * len(steady)
    note = (f"host package energy (RAPL), every process on the host included; counted once per "
            f"host ({len(counted)} host(s))" if scope == "host" else
            f"device energy, summed over {len(counted)} device(s) of {len(recs)} rank(s)")
    summary = {"source": "+".join(sources), "scope": scope, "reason": None, "note": note,
               "joules_steady": joules, "steady_steps": len(steady),
               "joules_per_token": joules / tokens if tokens else None,
               "avg_power_w": power, "counted_ranks": counted}
    return per_step, summary
