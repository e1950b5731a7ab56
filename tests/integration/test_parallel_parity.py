"""Every parallel layout reproduces the single-process run (CPU, gloo, fp32).

One torchrun launch per world size trains all layouts of that size one after another
(tests/parity_worker.py) and compares each with a single-process reference computed in the
same job. Tolerances: per-step loss 1e-5 absolute, parameters after 5 AdamW steps 2e-4
absolute (reduction order differs between layouts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from parity_worker import LAYOUTS, STEPS, tp_only  # noqa: E402

LOSS_TOL = 1e-5
PARAM_TOL = 2e-4
# bf16 compute vs the fp32 reference: a smoke test of the mixed-precision path (the loss
# trajectory stays close; AdamW moves each weight by up to lr per step whatever the rounding)
BF16_LOSS_TOL = 5e-3
BF16_PARAM_TOL = 3e-2
LAUNCH_TIMEOUT_S = {2: 150, 4: 200, 8: 300}


def _launch(world: int, tmp_path: Path) -> dict:
    out = tmp_path / f"parity_w{world}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    cmd = ["timeout", "-k", "10", str(LAUNCH_TIMEOUT_S[world]), *torchrun, "--standalone",
           f"--nproc-per-node={world}", str(ROOT / "tests" / "parity_worker.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT_S[world] + 30)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        pytest.fail(f"torchrun world={world} exited {proc.returncode}:\n{tail}")
    return json.loads(out.read_text())


def _table(results: list[dict]) -> str:
    lines = [f"{'layout':34} {'world':>5} {'max|dloss|':>11} {'max|dparam|':>11} {'time s':>7}"]
    for r in results:
        f = lambda v: "-" if v is None else f"{v:.2e}"  # noqa: E731
        lines.append(f"{r['name']:34} {r['world']:>5} {f(r['max_loss_diff']):>11} "
                     f"{f(r['max_param_diff']):>11} {r['seconds']:>7.1f}")
    return "\n".join(lines)


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda w: f"world{w}")
def report(request, tmp_path_factory) -> dict:
    """One torchrun launch per world size, shared by this module's tests."""
    return _launch(request.param, tmp_path_factory.mktemp(f"parity_w{request.param}"))


@pytest.mark.timeout(400)
def test_parity(report: dict) -> None:
    world = report["world"]
    expected = [n for n, p in LAYOUTS.items() if p.n == world]
    results = report["results"]
    print(f"\nparity, world {world}, {STEPS} steps, fp32 (tolerances: loss {LOSS_TOL}, "
          f"params {PARAM_TOL})\n" + _table(results))
    assert [r["name"] for r in results] == expected
    bad = []
    for r in results:
        if r["error"]:
            bad.append(f"{r['name']}: {r['error']}")
        elif len(r["losses"]) != STEPS:
            bad.append(f"{r['name']}: {len(r['losses'])} losses")
        elif r["max_loss_diff"] > (BF16_LOSS_TOL if r["point"]["train"]["precision"] == "bf16"
                                   else LOSS_TOL) or \
                r["max_param_diff"] > (BF16_PARAM_TOL if r["point"]["train"]["precision"] == "bf16"
                                       else PARAM_TOL):
            bad.append(f"{r['name']}: loss diff {r['max_loss_diff']:.2e}, "
                       f"param diff {r['max_param_diff']:.2e}")
    assert not bad, "\n".join(bad)
    # the reference itself must learn, or parity would be trivially easy
    ref = results[0]["ref_losses"]
    assert ref[-1] < ref[0] - 0.05, ref


def test_tensor_parallel_exchanges_are_the_models_count(report: dict) -> None:
    """The trainer's tensor-parallel collectives of a step, counted by PyTorch's
    ``CommDebugMode`` (layouts of TP alone), are the step model's: ``sync_counts`` per
    micro-batch (4 a layer: one replicated input per attention and MLP block, so wq/wk/wv's
    and w1/w3's input gradients are exchanged once; the embedding's; the head's logits
    gather and input gradient) times the micro-batches, and clipping's norm all-reduce."""
    from scalestudy.config.point import Point
    from scalestudy.perf.hardware import HardwareSpec
    from scalestudy.perf.host import sync_counts

    hw = HardwareSpec.load("cpu-local")
    counted = {r["name"]: r for r in report["results"] if r["collectives"] is not None}
    assert sorted(counted) == sorted(n for n, p in LAYOUTS.items()
                                     if p.n == report["world"] and tp_only(p))
    for name, r in counted.items():
        point = Point.from_json(r["point"], name)
        if point.parallel.activation_checkpointing != "none":
            continue  # torch's non-reentrant recompute stops before a layer's last exchange
        per_mb, per_step = sync_counts(point, hw, 0, point.model.layers, 0)
        clip = 1 if point.train.grad_clip else 0
        assert sum(r["collectives"].values()) == per_mb * point.grad_accum + per_step + clip, (
            name, r["collectives"])
