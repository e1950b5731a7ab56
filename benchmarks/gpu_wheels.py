"""Wheels the GPU machine's image lacks, for its Python (no network there: the device tool
carries the folder). ``make gpu-wheels`` runs ``download`` then ``verify``;
``scripts/gpu_check.sh`` runs ``missing`` and installs those names before a call's clock.

    python -m benchmarks.gpu_wheels download DEST [--python 3.12]
    python -m benchmarks.gpu_wheels verify DEST [--python 3.12]
    python -m benchmarks.gpu_wheels missing DEST/names.txt    # the names this Python lacks

``download`` resolves ``WANTED`` with its dependencies (``WANTED_NO_DEPS`` without) for that
Python and the device's platform, keeps only the distributions the image does not have (``IMAGE``, the image's
``pip list``), adds the wheels of 3.11 and 3.13 for any wheel built for one CPython ABI, and
writes the kept names to ``DEST/names.txt``. ``verify``: a ``pip install --dry-run
--no-index`` of those names from ``DEST`` for that Python, and every kept wheel's
requirements met by the image or the kept wheels.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: What the GPU check imports that the image lacks: the study schema's validator
#: (``config.study``), resolved with its dependencies, and HTA (the trace part reads beside
#: it; ``traceinsight`` on PyPI) with the modules it imports, without its dependencies (they
#: pull jupyterlab: 55 MiB in all, nearly the device's 64 MiB working tree).
WANTED = ("jsonschema",)
WANTED_NO_DEPS = ("traceinsight", "plotly", "pydot")
#: Requirements a carried wheel declares but the check never imports: carried without them.
UNUSED = {"traceinsight": {"jupyterlab": "its notebooks' front end; hta imports none of it"}}
IMAGE_FILE = Path(__file__).with_name("gpu_image_packages.txt")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
#: Pythons beside the device's for a wheel built for one CPython ABI (an image update).
OTHER_PYTHONS = ("3.11", "3.13")


def norm(name: str) -> str:
    """PEP 503's normalised name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def image() -> set[str]:
    """The image's distributions (normalised names)."""
    return {norm(line.strip()) for line in IMAGE_FILE.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def wheel_name(path: Path) -> tuple[str, str, str]:
    """``(normalised name, version, tags)`` of a wheel file name."""
    parts = path.name[:-4].split("-")
    return norm(parts[0]), parts[1], "-".join(parts[-3:])


def abi_specific(path: Path) -> bool:
    """Whether a wheel is built for one CPython ABI (``cp312-cp312-…``; not ``abi3``)."""
    _, _, tags = wheel_name(path)
    py, abi, _ = tags.split("-")
    return abi not in ("none", "abi3")


def requirements(path: Path, python: str) -> list[str]:
    """The normalised names a wheel requires on Linux under ``python`` (extras left out)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    env = {"python_version": python, "python_full_version": python + ".0",
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
           "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append(norm(req.name))
    return out


def closure_problems(kept: dict[str, list[str]], have: set[str]) -> list[str]:
    """``kept``: carried name -> its requirements. What no carried wheel and no image
    package provides, and what is carried although the image has it."""
    bad = [f"{n}: the image has it; carrying it would shadow the image's" for n in kept
           if n in have]
    for name, reqs in sorted(kept.items()):
        bad += [f"{name} requires {r}: neither carried nor on the image" for r in reqs
                if r not in kept and r not in have and r not in UNUSED.get(name, {})]
    return bad


def _pip(py: str, *args: str) -> list[str]:
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    return [sys.executable, "-m", "pip", *args, "--only-binary=:all:", "--python-version", py,
            "--implementation", "cp", *plat]


def download(dest: Path, py: str) -> list[str]:
    """Fill ``dest`` (emptied first) and write ``dest/names.txt``; returns the kept names."""
    have = image()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(_pip(py, "download", "-q", "-d", tmp, *WANTED), check=True)
        subprocess.run(_pip(py, "download", "-q", "--no-deps", "-d", tmp, *WANTED_NO_DEPS),
                       check=True)
        kept = []
        for whl in sorted(Path(tmp).glob("*.whl")):
            name, version, _ = wheel_name(whl)
            if name in have:
                continue
            shutil.move(str(whl), dest / whl.name)
            kept.append(name)
            if abi_specific(dest / whl.name):
                for other in OTHER_PYTHONS:
                    subprocess.run(_pip(other, "download", "-q", "--no-deps", "-d", str(dest),
                                        f"{name}=={version}"), check=True)
    (dest / "names.txt").write_text("".join(f"{n}\n" for n in kept))
    return kept


def verify(dest: Path, py: str) -> list[str]:
    """What would fail installing ``dest/names.txt`` on the device's Python ``py``."""
    names = (dest / "names.txt").read_text().split()
    wheels = {}
    for whl in sorted(dest.glob("*.whl")):
        name, _, tags = wheel_name(whl)
        if name in names and (not abi_specific(whl) or tags.startswith(
                f"cp{py.replace('.', '')}-")):
            wheels[name] = requirements(whl, py)
    bad = [f"{n}: no wheel for Python {py}" for n in names if n not in wheels]
    bad += closure_problems(wheels, image())
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(_pip(py, "install", "--dry-run", "--no-index", "--no-deps",
                                "--find-links", str(dest), "--target", tmp, *names),
                           capture_output=True, text=True)
    if r.returncode:
        bad.append(f"pip install --dry-run for Python {py}: "
                   + (r.stderr.strip().splitlines() or ["?"])[-1])
    return bad


def missing(names_file: Path) -> list[str]:
    """The names in ``names_file`` not installed for this Python (in file order)."""
    from importlib import metadata

    out = []
    for name in Path(names_file).read_text().split():
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_wheels")
    ap.add_argument("action", choices=("download", "verify", "missing"))
    ap.add_argument("path", type=Path)
    ap.add_argument("--python", default="3.12", help="the device's Python (X.Y)")
    a = ap.parse_args(argv)
    if a.action == "missing":
        names = missing(a.path)
        if names:
            print("\n".join(names))
        return 0
    if a.action == "download":
        kept = download(a.path, a.python)
        print(f"gpu-wheels: {len(kept)} distributions the image lacks: {' '.join(kept)}")
    bad = verify(a.path, a.python)
    for py in OTHER_PYTHONS if a.action == "verify" else ():
        bad += [f"(Python {py}) {b}" for b in verify(a.path, py)]
    size = sum(p.stat().st_size for p in a.path.glob("*.whl"))
    print(f"gpu-wheels: {a.path}: {size / 2**20:.1f} MiB; " + ("verified" if not bad else
                                                               "problems:\n  " + "\n  ".join(bad)))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
