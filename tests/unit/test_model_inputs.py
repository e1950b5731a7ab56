"""One choice of the performance model's inputs (``scalestudy.perf.inputs.model_inputs``):
the hardware and the building blocks measured on it, the same for ``predict``, ``status`` and
``tune``. Pure: files written by hand, no training, no process group."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from scalestudy.config.study import load_study
from scalestudy.config.vocab import Device
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.inputs import host_measurements, model_inputs
from scalestudy.perf.rates import Measured, block_key
from scalestudy.perf.stepmodel import predict_step_time
from scalestudy.plan.planner import plan_points
from scalestudy.report import status
from scalestudy import cli

DEFAULT = "workflow/config/default.yaml"
BLOCKS = {"fwd_bwd": 8e-3, "layer": 3e-3, "embedding": 2e-4, "head": 1e-3,
          "optimizer": 1.5e-3, "optimizer_layer": 6e-4}


@pytest.fixture(scope="module")
def study():
    return load_study(DEFAULT)


@pytest.fixture(scope="module")
def points(study):
    return {(p.series, p.n): p for p in plan_points(study) if p.feasible}


@pytest.fixture
def study_dir(tmp_path, study, points):
    """``results/<study>`` of a CPU study after its host measurements: calibration.json (own
    products, overhead, bandwidth, blocks of weak-dp's micro-batch, core sharing, sync wait)
    and the microbench jobs' matmul and collectives tables."""
    d = tmp_path / study.name
    (d / "microbench").mkdir(parents=True)
    p = points[("weak-dp", 1)]
    key = block_key(p.model, p.seq_len, p.micro_batch, "plain")
    cal = {
        "dtype": "fp32", "m": 512, "n": 512, "k": 512, "flops_per_s": 9e10,
        "shapes": [{"m": 256, "n": 64, "k": 64, "flops_per_s": 3e10}],
        "overhead": [{"layout": "plain", "phase": ph, "layers": L, "sample": i,
                      "seconds": (1e-3 if ph == "fwd_bwd" else 2e-3) + 5e-4 * L + 1e-5 * i}
                     for ph in ("fwd_bwd", "optimizer") for L in (1, 4) for i in range(3)],
        "bandwidth": [{"device": "cpu", "bytes": 1 << 26, "sample": i, "seconds": 0.01,
                       "bytes_per_s": 20e9 - 1e9 * i} for i in range(3)],
        "blocks": [{"key": key, "layout": "plain", "micro_batch": p.micro_batch, "block": b,
                    "sample": i, "seconds": v} for b, v in BLOCKS.items() for i in range(2)],
        "core_sharing": [{"procs": k, "sample": 0, "seconds": f, "factor": f}
                         for k, f in ((1, 1.0), (2, 1.4), (4, 2.9))],
        "sync_wait": [{"procs": 2, "grain_s": 2e-3, "sample": 0, "wait_s": 3e-4}]}
    (d / "calibration.json").write_text(json.dumps(cal))
    pd.DataFrame([{"op": op, "group_size": g, "bytes": b, "sample": 0,
                   "seconds": 1e-4 * g + b / 1e9} for op in ("all_reduce", "send_recv")
                  for g in (2, 4) for b in (4096, 65536, 1048576)]).to_csv(
        d / "microbench" / "collectives.csv", index=False)
    pd.DataFrame([{"dtype": "fp32", "m": 256, "n": 256, "k": 256, "sample": 0,
                   "flops_per_s": 1e9}]).to_csv(d / "microbench" / "matmul.csv", index=False)
    return d


def _gpu(study, hardware):
    """The study as a GPU study on ``hardware`` (a study.json may carry any name)."""
    return replace(study, platform=replace(study.platform, device=Device.CUDA, hardware=hardware))


def test_a_cpu_study_is_priced_on_its_hosts_measurements(study, study_dir):
    mi = model_inputs(study, study_dir)
    assert mi.hw.name == "cpu-local"
    # a CPU study's devices are the processes one host runs: its platform's, not the preset's
    assert mi.hw.devices_per_node == study.platform.devices_per_node != \
        HardwareSpec.load("cpu-local").devices_per_node
    # what a study measured on its host: calibration.json, with the
    # microbench job's collectives
    mb = study_dir / "microbench"
    own = Measured.from_calibration(study_dir / "calibration.json")
    bench = Measured.from_csv(str(mb / "matmul.csv"), str(mb / "collectives.csv"))
    assert mi.measured == replace(own, collectives=bench.collectives)
    assert mi.measured == host_measurements(study_dir)
    m = mi.measured
    assert m.matmul == {"fp32": [(512, 512, 512, 9e10), (256, 64, 64, 3e10)]}
    assert len(m.blocks) == 1 and m.core_sharing == {1: 1.0, 2: 1.4, 4: 2.9}
    assert m.sync_wait == {2: [(2e-3, 3e-4)]} and m.mem_bw == 20e9
    assert m.overhead["fwd_bwd_fixed_s"] == pytest.approx(1e-3)
    assert set(m.collectives) == {(op, g) for op in ("all_reduce", "send_recv") for g in (2, 4)}
    assert mi.source == "cpu-local + calibration.json + microbench (collectives.csv)"
    # no calibration: the microbench job's matmuls and collectives
    (study_dir / "calibration.json").unlink()
    mi = model_inputs(study, study_dir)
    assert mi.measured.matmul == {"fp32": [(256, 256, 256, 1e9)]} and not mi.measured.blocks
    assert mi.source == "cpu-local + microbench (matmul.csv, collectives.csv)"


def test_status_and_predict_price_a_study_the_same(study, study_dir, points, tmp_path):
    hw, measured, what = status._model(study, study_dir)
    mi = model_inputs(study, study_dir)
    assert hw.name == mi.hw.name == "cpu-local" and measured == mi.measured and what == mi.source
    assert measured.blocks and measured.core_sharing  # status used to drop both
    p = points[("weak-dp", 1)]
    assert predict_step_time(p, hw, measured).composed_from_blocks
    # predict's own output, for every point: status's model gives the same step time
    out = tmp_path / "predict"
    assert cli.main(["predict", DEFAULT, "--results", str(study_dir.parent), "--out", str(out),
                             "--runs", str(tmp_path / "none.csv")]) == 0
    pred = pd.read_csv(out / "study_predictions.csv").set_index("config_hash")["step_time_s"]
    for p in points.values():
        assert predict_step_time(p, hw, measured).step_time_s == pytest.approx(
            pred[p.config_hash], rel=1e-9)


def test_a_gpu_study_is_priced_on_its_system_preset(study, study_dir):
    mi = model_inputs(_gpu(study, "MI250X"), study_dir)  # an alias of MI250X-GCD
    assert mi.hw.name == "frontier" and mi.measured is None  # the CPU host's files: not its
    assert "platform.hardware 'MI250X'" in mi.source
    hw, measured, what = status._model(_gpu(study, "H100-SXM5"), study_dir)
    assert hw.name == "dgx-h100" and measured is None and what.startswith("dgx-h100")


@pytest.mark.parametrize("hardware", ["Quantum-9000", "MI300X", None])
def test_a_gpu_study_without_a_system_is_one_clear_error(study, study_dir, hardware):
    gpu = _gpu(study, hardware)
    with pytest.raises(ValueError) as e:
        model_inputs(gpu, study_dir)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("platform.hardware ")
    assert "--hardware PRESET" in msg and "frontier" in msg
    assert status._model(gpu, study_dir) == (None, None, f"model unavailable: {msg}")
    # a named system prices it
    assert model_inputs(gpu, study_dir, hardware="dgx-h100").hw.name == "dgx-h100"


def test_explicit_hardware_framework_and_tables_win(study, study_dir, tmp_path):
    mi = model_inputs(study, study_dir, hardware="frontier", framework="megatron-lm")
    assert mi.hw.name == "frontier" and mi.hw.framework.name == "megatron-lm"
    assert mi.hw.framework != HardwareSpec.load("frontier").framework
    assert mi.measured is None  # a named system: not priced with the study host's figures
    assert mi.source == "frontier driven by megatron-lm"
    # the study's own host by name: its preset as described
    assert model_inputs(study, study_dir, hardware="cpu-local").measured is None
    # explicit tables replace whatever the study measured
    mm = tmp_path / "mm.csv"
    pd.DataFrame([{"dtype": "bf16", "m": 2048, "n": 2048, "k": 2048, "sample": 0,
                   "flops_per_s": 95.75e12}]).to_csv(mm, index=False)
    for st in (study, None):
        mi = model_inputs(st, study_dir, hardware="frontier", matmul_csv=str(mm))
        assert mi.measured.matmul == {"bf16": [(2048, 2048, 2048, 95.75e12)]}
        assert not mi.measured.blocks and mi.source == f"frontier + {mm}"
    mi = model_inputs(study, study_dir, framework="torchtitan", matmul_csv=str(mm))
    assert mi.hw.name == "cpu-local" and mi.hw.framework.name == "torchtitan"
    assert not mi.measured.blocks
    with pytest.raises(ValueError, match="--hardware PRESET"):
        model_inputs()
    with pytest.raises(ValueError, match="no such preset"):
        model_inputs(study, study_dir, hardware="nowhere")
