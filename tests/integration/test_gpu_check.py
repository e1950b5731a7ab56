"""The GPU check's rehearsal (``scripts/gpu_check.sh --rehearse``): both device calls' smoke
runs, each into its own OUT as the device returns it (limits on count, depth, size and names),
each within its budget, the memory part killed as by its watchdog after its first point;
every part's record of its fixed shape, its figures what it says; a call aborts in seconds,
with one line, where CUDA is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import gloo_cuda, gpu_check, gpu_parts
from scalestudy.record.terms import MEASURED_TERMS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--rehearse"], env=env,
                       capture_output=True, text=True, timeout=1200)
    return out, r


def load(out: Path, call: int) -> dict:
    return json.loads((out / f"call{call}" / gpu_check.out_names(call)["json"]).read_text())


def test_the_rehearsal_passes_within_the_devices_limits(rehearsal):
    out, r = rehearsal
    assert r.returncode == 0 and "gpu_check: rehearsal passed" in r.stdout, \
        r.stdout[-4000:] + r.stderr[-3000:]
    for call in gpu_check.CALLS:
        o = out / f"call{call}"
        assert gpu_check.out_problems(o) == []
        names = sorted(p.name for p in o.iterdir())
        assert set(names) <= set(gpu_check.out_names(call).values()), names
        doc = load(out, call)
        assert doc["wall_s"] <= doc["budget_s"] == gpu_check.BUDGET[call][1]
        assert set(doc["parts"]) == {p for p, *_ in gpu_check.CALLS[call]}
        for rec in doc["parts"].values():
            assert gpu_check.shape_problem(rec) is None, rec
            assert rec["smoke"] and rec["device"] == "cpu"


def test_a_part_killed_mid_way_keeps_its_finished_points_and_nothing_runs_on(rehearsal):
    out, _ = rehearsal
    mem = load(out, 1)["parts"]["memory"]
    assert mem["state"] == "timeout" and "after 1 point(s)" in mem["reason"]
    assert mem["points_done"] == 1 and len(mem["points"]) == 1
    assert mem["points"][0]["state"] == "ok" and mem["points"][0]["measured_bytes"] > 0
    # the killed part's launch ended with it (its torchrun, orphaned back to the check, killed
    # with it; the ranks die with torchrun: scalestudy.run.lifetime)
    for _ in range(60):
        left = subprocess.run(["pgrep", "-f", "gpu-check-work1-"], capture_output=True,
                              text=True).stdout
        if not left:
            break
        time.sleep(0.5)
    assert left == ""


def test_the_parts_measure_what_they_say(rehearsal):
    out, _ = rehearsal
    c1, c2 = load(out, 1)["parts"], load(out, 2)["parts"]
    assert c1["probe"]["torch"] and c1["probe"]["modules"]["jsonschema"]
    trainer = c1["trainer"]
    assert [(r["config"], r["compile"], r["state"]) for r in trainer["records"]] == \
        [("eager", False, "ok"), ("compile", True, "ok")]
    # the compiled configuration's Inductor cache: the call's fixed folder, not the run's
    assert trainer["compile_cache"]["files"] > 0
    assert "/runs/" not in trainer["compile_cache"]["dir"]
    assert trainer["profile"]["top"] and trainer["profile"]["breakdown_state"] == "ok"
    assert trainer["profile"]["trace_file"] == "call1-trace.json.gz"
    layouts = c2["layouts"]
    assert set(layouts["layouts"]) == set(gpu_parts.SMOKE_LAYOUTS) == {"n1", "dp2xtp2"}
    tol = layouts["tolerance"]["loss_abs"]
    assert all(r["within"] and r["max_loss_diff"] <= tol for r in layouts["layouts"].values())
    assert layouts["columns_missing"] == {} and layouts["left_out"] == {}
    # the collectives probe ran on two ranks (CPU tensors here: every op exact)
    assert set(layouts["gloo_cuda"]) == set(gloo_cuda.OPS)
    assert set(layouts["gloo_cuda"].values()) == {"ok"}
    step = c2["stepmodel"]
    assert step["points"] and all(p["predicted_s"] > 0 for p in step["points"])
    trace = c2["trace"]
    terms = trace["terms"]
    assert abs(sum(terms[k] for k in MEASURED_TERMS) - trace["traced_step_s"]) \
        < 1e-9 * trace["traced_step_s"]
    assert trace["hta"] is None  # a CPU trace: nothing for HTA to read
    assert set(trace["not_shown"]) == {"tp_comm_s", "pp_p2p_s", "pp_bubble_s", "cp_comm_s"}
    assert trace["trace_file"] == "call2-trace.json.gz"
    assert (out / "call2" / "call2-trace.json.gz").stat().st_size > 0


def test_a_call_without_cuda_aborts_in_seconds_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--call", "1", "--out",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"})
    assert r.returncode == 3, r.stdout + r.stderr
    assert r.stdout.strip().count("\n") == 0 and "call 1 aborted: no CUDA device" in r.stdout
    doc = json.loads((tmp_path / "out" / "call1.json").read_text())
    assert doc["state"] == "aborted" and doc["parts"] == {} and doc["preflight"]["torch"]
    assert gpu_check.out_problems(tmp_path / "out") == []
