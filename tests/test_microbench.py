"""Building-block measurements: tidy CSVs, plots, the torchrun collectives job, and the
predicted-vs-measured step-time regression on CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.measure import microbench

ROOT = Path(__file__).resolve().parents[1]


def test_matmul_csv_and_plot(tmp_path):
    out = tmp_path / "matmul.csv"
    assert microbench.main(["matmul", "--out", str(out), "--sizes", "32", "64",
                            "--dtypes", "fp32", "--samples", "2"]) == 0
    df = pd.read_csv(out)
    assert set(df.columns) >= {"device", "dtype", "m", "n", "k", "sample", "seconds", "flops_per_s"}
    assert len(df) == 4 and (df["flops_per_s"] > 0).all()
    assert df["flops_per_s"].iloc[0] == pytest.approx(2 * 32**3 / df["seconds"].iloc[0])
    png = tmp_path / "matmul.png"
    microbench.main(["plot", "matmul", str(out), "--out", str(png)])
    assert png.stat().st_size > 1000


def test_attention_bandwidth_overhead_rows():
    att = microbench.bench_attention([(1, 2, 16, 8)], ["fp32"], "cpu", samples=1)
    assert att[0]["flops_per_s"] > 0 and att[0]["batch_heads"] == 2
    bw = microbench.bench_bandwidth(2**20, "cpu", samples=1)
    assert bw[0]["bytes_per_s"] > 0
    ov = microbench.bench_overhead(layers=(1, 2), samples=1, warmup=1)
    assert {r["phase"] for r in ov} == {"fwd_bwd", "optimizer"}


@pytest.mark.dist
def test_collectives_under_torchrun(tmp_path):
    out = tmp_path / "coll.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = ["timeout", "120", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "scalestudy.measure.microbench", "collectives", "--out",
           str(out), "--sizes", "4096", "65536", "--samples", "2"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=150)
    df = pd.read_csv(out)
    assert set(df["op"]) == set(microbench.OPS)
    assert (df["group_size"] == 2).all() and (df["world_size"] == 2).all()
    ar = df[df["op"] == "all_reduce"].iloc[0]
    assert ar["busbw_Bps"] == pytest.approx(ar["algbw_Bps"] * 1.0)  # 2(p-1)/p = 1 at p = 2
    png = tmp_path / "coll.png"
    microbench.plot("collectives", out, png)
    assert png.exists()


@pytest.mark.timing
def test_predicted_vs_measured_step_time_on_cpu():
    """The perf model, fed with building blocks measured here (matmul at the model's shapes,
    fused attention, copy bandwidth, framework overhead), against real fp32 steps of the
    same model. Observed on the 2-core dev host (load 4-7): errors -38% .. +3%, the model
    under-predicting (it omits GELU/LayerNorm compute on CPU and the per-op cost of the
    larger models). Bound: predicted/measured in [0.4, 1.6]: wide enough for contention
    noise between the building-block and step measurements, narrow enough to catch a
    structural error (a missing backward pass is x3, a missing layer count x2+).
    Skipped on an oversubscribed host (1-min load > 3 x cores; seen here at load 27 on 2
    cores: a 100 ms training step is preempted many times, a 20 ms building-block sample is
    not, and the ratio fell to 0.19): timing comparisons mean nothing there."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 3 * cores:
        pytest.skip(f"host oversubscribed (load {load:.1f} on {cores} cores)")
    cases = {k: microbench.VALIDATE_CASES[k] for k in ("tiny-b8", "small-h128")}
    for r in microbench.bench_validate(cases):
        ratio = r["predicted_s"] / r["measured_s"]
        assert 0.4 <= ratio <= 1.6, r
