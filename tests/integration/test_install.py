"""The package installs and works as a user installs it: a fresh venv (no site packages of
this environment, nothing borrowed), the CPU torch pin first, then ``pip install .`` with its
declared dependencies resolved by pip, then ``scalestudy run STUDY.yaml`` from an unrelated
directory puts every result, ``report.html`` included, under ``./results/``.

The install is ``scripts/fresh-install.sh`` (the commands a user types). Cost: pip downloads
and resolves the dependencies from the index (snakemake, pandas, pyarrow, matplotlib, ...
about 90 MB) and unpacks torch from its wheel (1-4 minutes on the 2-core CI box), so
``.ci/run`` runs the same script before the suite and names the venv in
``SCALESTUDY_INSTALL_VENV``; the test then checks that venv and runs a study through it.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STUDY = """\
name: fresh
models:
  m: {layers: 2, hidden: 32, heads: 2, seq_len: 16, vocab: 64}
train: {steps: 4, warmup_steps: 1}
platform: {device: cpu}
series:
  - {name: w, mode: weak, model: m, gpus: [1], micro_batch: 2}
"""


@pytest.mark.workflow
@pytest.mark.timeout(900)
def test_pip_install_with_its_dependencies_then_run_a_study_from_any_directory(tmp_path):
    # nothing of this environment: no PYTHONPATH, no user site, no editable checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    prepared = os.environ.get("SCALESTUDY_INSTALL_VENV")
    if prepared:  # .ci/run installed it with the same script before the suite
        venv = Path(prepared)
        assert (venv / "bin" / "scalestudy").exists(), f"{venv}: no scalestudy installed"
    else:
        venv = tmp_path / "venv"
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(ROOT / "scripts" / "fresh-install.sh"), str(venv),
                            str(ROOT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=800)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        print(f"fresh venv: pip install torch pin + . with dependencies: "
              f"{time.monotonic() - t0:.0f} s")
    py = venv / "bin" / "python"
    check = subprocess.run([py, "-m", "pip", "check"], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # every requirement is met
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    ours = (sysconfig.get_paths()["purelib"], str(ROOT / "src"))
    assert not [p for p in Path(site).glob("*.pth") if any(o in p.read_text() for o in ours)]
    where = subprocess.run([py, "-c", "import scalestudy.paths as p; print(p.workflow_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout  # the wheel's copy

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "my-study.yaml").write_text(STUDY)
    run = subprocess.run([venv / "bin" / "scalestudy", "run", "my-study.yaml"], cwd=work,
                         env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = work / "results" / "fresh"
    for name in ("plan.tsv", "runs.csv", "efficiency.csv", "summary.md", "report.html",
                 "figures/efficiency_weak.png"):
        assert (out / name).is_file(), name
    assert "| w | weak | 1 |" in (out / "summary.md").read_text()
    status = next(out.glob("runs/*/status.json")).read_text()
    assert '"state": "ok"' in status
