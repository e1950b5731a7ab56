"""The package works outside a checkout: ``pip install .`` (not editable) into a fresh venv,
then ``scalestudy run STUDY.yaml`` from an unrelated directory puts every result under
``./results/``.

The fresh venv gets this environment's dependencies (torch, snakemake, pandas, ...) through a
``.pth`` line naming their site-packages folder, so nothing large is downloaded; the
scalestudy package itself, with its Snakefile, rules, schema and profiles, comes only from the
wheel that pip builds (the checkout's editable path is not on that venv's ``sys.path``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
@pytest.mark.timeout(400)
def test_pip_install_then_run_a_study_from_any_directory(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    build = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(ROOT)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]

    where = subprocess.run([py, "-c", "import scalestudy.paths as p; print(p.workflow_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout  # the wheel's copy

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "my-study.yaml").write_text(STUDY)
    run = subprocess.run([venv / "bin" / "scalestudy", "run", "my-study.yaml"], cwd=work,
                         env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = work / "results" / "fresh"
    for name in ("plan.tsv", "runs.csv", "efficiency.csv", "summary.md", "report.html",
                 "figures/efficiency_weak.png"):
        assert (out / name).is_file(), name
    assert "| w | weak | 1 |" in (out / "summary.md").read_text()
    status = next(out.glob("runs/*/status.json")).read_text()
    assert '"state": "ok"' in status
