"""The performance model's inputs for a study: the system it prices on (a ``HardwareSpec``,
with its framework) and the building blocks measured on that machine (``Measured``), chosen
the same way for ``scalestudy predict``, ``scalestudy status`` and ``scalestudy tune``
(``model_inputs``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from scalestudy.config import devices
from scalestudy.config.studyspec import Study
from scalestudy.config.vocab import Device
from scalestudy.perf.hardware import HardwareSpec, presets
from scalestudy.perf.rates import Measured

#: The system a CPU (or auto-detected) study is priced on: the development host, measured.
CPU_PRESET = "cpu-local"


@dataclass(frozen=True)
class ModelInputs:
    """``hw``: the system (and framework) the model prices on; ``measured``: building blocks
    measured on that machine, or None; ``source``: one line saying where each came from."""

    hw: HardwareSpec
    measured: Measured | None
    source: str


def model_inputs(study: Study | None = None, study_dir: Path | str | None = None, *,
                 hardware: str | None = None, framework: str | None = None,
                 matmul_csv: str | None = None,
                 collectives_csv: str | None = None) -> ModelInputs:
    """The hardware and measured building blocks the step model prices ``study`` with.

    Hardware, first that applies:

    1. ``hardware``: a preset of ``hardware.yaml`` or a YAML path (``--hardware``);
    2. the study's platform: a CPU or auto-detected study (``platform.device`` cpu / auto)
       runs on ``cpu-local``, its devices (the processes one host runs, sharing its cores)
       ``platform.devices_per_node``; a GPU study on the system preset of its ``platform.hardware``
       (the first system of ``hardware.yaml`` with that device, ``config.devices``);
    3. else ``ValueError`` (one line naming ``platform.hardware`` and ``--hardware PRESET``).

    ``framework`` (a framework of ``hardware.yaml``): the hardware driven by it
    (``HardwareSpec.with_framework``); None keeps the system's own.

    Measured, first that applies:

    1. ``matmul_csv`` / ``collectives_csv``: microbench tables measured on that hardware;
    2. no ``hardware`` named and a CPU / auto study: what the study measured on its own host
       in ``study_dir`` (``host_measurements``: ``calibration.json`` and the ``microbench``
       jobs' tables);
    3. else None (the hardware description alone: a named system is priced as described,
       not with figures of the host the study ran on).

    Raises ``ValueError`` (an unknown preset, a GPU study without a system preset) and
    ``OSError`` / ``ValueError`` for unreadable measurement files."""
    cpu_study = study is not None and study.platform.device in (Device.CPU, Device.AUTO)
    if hardware:
        hw, where = HardwareSpec.load(hardware), hardware
    elif study is None:
        raise ValueError("no hardware to price on: name one with --hardware PRESET (one of "
                         f"{', '.join(presets())}) or a YAML path")
    elif cpu_study:
        hw = replace(HardwareSpec.load(CPU_PRESET),
                     devices_per_node=study.platform.devices_per_node)
        where = CPU_PRESET
    else:
        name = system_of(study.platform.hardware)
        hw = HardwareSpec.load(name)
        where = f"{name} (the system of platform.hardware {study.platform.hardware!r})"
    if framework:
        hw = hw.with_framework(framework)
        where += f" driven by {framework}"
    if matmul_csv or collectives_csv:
        measured = Measured.from_csv(matmul_csv, collectives_csv)
        what = " + ".join(str(p) for p in (matmul_csv, collectives_csv) if p)
        return ModelInputs(hw, measured, f"{where} + {what}")
    if hardware or not cpu_study or study_dir is None:
        return ModelInputs(hw, None, where)
    measured, found = _host(Path(study_dir))
    return ModelInputs(hw, measured, " + ".join([where, *found]))


def system_of(hardware: str | None) -> str:
    """The system preset of ``hardware.yaml`` for a GPU study's ``platform.hardware`` (a
    device name, key or alias of the devices table): the first system with that device.
    ``ValueError`` in one line when there is none."""
    key = devices.device_key(hardware)
    systems = devices.table()["systems"]
    name = next((s for s, d in systems.items() if key and d.get("device") == key), None)
    if name is not None:
        return name
    why = ("is not set (detected at run time)" if not hardware else
           f"{hardware!r} has no system preset" + ("" if key else " (not a device of the "
                                                          "hardware table)"))
    raise ValueError(f"platform.hardware {why}: name the system with --hardware PRESET (one "
                     f"of {', '.join(presets())}) or a YAML path")


def host_measurements(study_dir: Path | str) -> Measured:
    """The building blocks a CPU study measured on its own host during its run (the preset's
    figures stand in for what is missing): from ``calibration.json`` the rates of the study's
    own matrix products, its blocks timed piece by piece, the core sharing, the framework
    overhead, the copy bandwidth and the wait for the slowest rank; from the ``microbench``
    jobs (``microbench: {enabled: true}``) the collectives, and matmul rates where the
    calibration has none."""
    return _host(Path(study_dir))[0]


def _host(study_dir: Path) -> tuple[Measured, list[str]]:
    """``host_measurements`` and the files it read (for ``ModelInputs.source``)."""
    mb = study_dir / "microbench"
    files = [mb / f if (mb / f).exists() else None for f in ("matmul.csv", "collectives.csv")]
    bench = Measured.from_csv(*(str(f) if f else None for f in files))
    got = [f.name for f in files if f]
    cal = study_dir / "calibration.json"
    if not cal.exists():
        return bench, [f"microbench ({', '.join(got)})"] if got else []
    own = Measured.from_calibration(cal)
    used = [f.name for f in files[1:] if f] + (["matmul.csv"] if files[0] and not own.matmul
                                               else [])
    return (replace(own, matmul=own.matmul or bench.matmul, collectives=bench.collectives),
            ["calibration.json", *([f"microbench ({', '.join(used)})"] if used else [])])
