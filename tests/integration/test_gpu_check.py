"""The GPU check's CPU smoke run (``scripts/gpu_check.sh --smoke``): every part runs its same
logic on tiny models and writes its JSON of a fixed shape; the layouts match the one-rank
losses; a cut run keeps the parts it finished and leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gpu_check, gpu_parts

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--smoke"], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_every_part_writes_its_json_of_its_shape(smoke):
    for part, *_ in gpu_check.SCHEDULE:
        rec = json.loads(gpu_check.part_file(smoke, part).read_text())
        assert gpu_check.shape_problem(rec) is None, rec
        assert rec["state"] == "ok" and rec["smoke"] and rec["device"] == "cpu", rec["reason"]


def test_the_parts_measure_what_they_say(smoke):
    def load(part):
        return json.loads(gpu_check.part_file(smoke, part).read_text())

    probe = load("probe")
    assert probe["torch"] and probe["modules"]["jsonschema"] and probe["modules"]["snakemake"]
    assert probe["installed_from_wheels"] == []  # a smoke run installs nothing
    trainer = load("trainer")
    assert {r["config"] for r in trainer["records"]} == {"eager", "eager-ac"}
    assert trainer["profile"]["top"] and trainer["profile"]["breakdown_state"] == "ok"
    layouts = load("layouts")
    assert set(layouts["layouts"]) == set(gpu_parts.SMOKE_LAYOUTS) == {"n1", "dp2xtp2"}
    tol = layouts["tolerance"]["loss_abs"]
    assert all(r["within"] and r["max_loss_diff"] <= tol for r in layouts["layouts"].values())
    assert layouts["columns_missing"] == {}
    memory = load("memory")
    assert len(memory["points"]) == 2 and all(p["estimate_bytes"] > 0 for p in memory["points"])
    step = load("stepmodel")
    assert step["points"] and all(p["predicted_s"] > 0 for p in step["points"])
    trace = load("trace")
    terms = trace["terms"]
    assert abs(sum(terms[k] for k in ("gemm_s", "elementwise_s", "attention_s", "overhead_s",
                                      "optimizer_s", "dp_comm_exposed_s", "sync_wait_s",
                                      "grad_accum_s", "data_s", "unattributed_s", "tp_comm_s",
                                      "pp_p2p_s", "pp_bubble_s", "cp_comm_s"))
               - trace["traced_step_s"]) < 1e-9 * trace["traced_step_s"]
    assert trace["hta"] is None  # a CPU trace: nothing for HTA to read


def test_a_cut_run_keeps_what_it_finished_and_leaves_nothing_running(tmp_path):
    # 14 s: the probe (2-9 s) leaves the layouts part at least the 5 s a part needs to start,
    # and far less than its two launches take (19 s on an idle 2-core host)
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--smoke", "--out",
                        str(tmp_path), "--parts", "probe,layouts,trace", "--budget", "14"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"})
    assert r.returncode == 1, r.stdout + r.stderr
    states = {p: json.loads(gpu_check.part_file(tmp_path, p).read_text())["state"]
              for p in ("probe", "layouts", "trace")}
    assert states == {"probe": "ok", "layouts": "timeout", "trace": "skipped"}, r.stdout
    # the killed part's launch ends with it (its torchrun, orphaned back to the check, killed
    # with it; the ranks die with torchrun: scalestudy.run.lifetime)
    for _ in range(60):
        left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
        if not left.stdout:
            break
        time.sleep(0.5)
    assert left.stdout == "", subprocess.run(["ps", "-o", "pid,args", "-p",
                                              ",".join(left.stdout.split())],
                                             capture_output=True, text=True).stdout


def test_the_schedule_fits_nine_minutes():
    r = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    total = float(r.stdout.splitlines()[-1].split()[1])
    assert total == sum(s for _, s in gpu_check.schedule(False)) <= gpu_check.BUDGET_S == 540
