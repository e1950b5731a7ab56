"""Building-block measurements: tidy CSVs, plots, the torchrun collectives job, and the
predicted-vs-measured step-time regression on CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.measure.attention import bench_attention
from scalestudy.measure.bandwidth import bench_bandwidth
from scalestudy.measure.collectives import OPS
from scalestudy.measure import overhead
from scalestudy.measure.overhead import bench_overhead
from scalestudy.measure.plots import plot
from scalestudy.measure.validate import VALIDATE_CASES, bench_validate
from scalestudy import cli

ROOT = Path(__file__).resolve().parents[2]


def test_matmul_csv_and_plot(tmp_path):
    out = tmp_path / "matmul.csv"
    assert cli.main(["microbench", "matmul", "--out", str(out), "--sizes", "32", "64",
                            "--dtypes", "fp32", "--samples", "2"]) == 0
    df = pd.read_csv(out)
    assert set(df.columns) >= {"device", "dtype", "m", "n", "k", "sample", "seconds", "flops_per_s"}
    assert len(df) == 4 and (df["flops_per_s"] > 0).all()
    assert df["flops_per_s"].iloc[0] == pytest.approx(2 * 32**3 / df["seconds"].iloc[0])
    png = tmp_path / "matmul.png"
    cli.main(["microbench", "plot", "matmul", str(out), "--out", str(png)])
    assert png.stat().st_size > 1000


def test_the_command_line_offers_its_subcommands(tmp_path, capsys, monkeypatch):
    """``scalestudy microbench``: the subcommands the workflow's rules and
    the docs run, each with a required ``--out``, and the tables and summaries they write."""
    with pytest.raises(SystemExit) as e:
        cli.main(["microbench", "--help"])
    assert e.value.code == 0
    usage = capsys.readouterr().out
    assert all(c in usage for c in ("matmul", "collectives", "overhead", "validate", "memory", "plot"))
    for cmd in ("matmul", "collectives", "overhead", "validate", "memory"):
        with pytest.raises(SystemExit) as e:
            cli.main(["microbench", cmd])
        assert e.value.code == 2 and "--out" in capsys.readouterr().err
    # overhead: the table and the fitted overhead a preset takes (few samples: a quick run)
    monkeypatch.setattr(overhead, "bench_overhead",
                        lambda: bench_overhead(layers=(1, 2), samples=1, warmup=1, layouts=("plain",)))
    out = tmp_path / "overhead.csv"
    assert cli.main(["microbench", "overhead", "--out", str(out)]) == 0
    assert {"layout", "phase", "layers", "seconds"} <= set(pd.read_csv(out).columns)
    assert "fit (fastest sample" in capsys.readouterr().out
    # as a module, the way the workflow's jobs run it
    out = tmp_path / "m.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "scalestudy", "microbench", "matmul", "--out",
                        str(out), "--sizes", "16", "--dtypes", "fp32", "--samples", "1"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "matmul: 1 rows" in r.stdout and len(pd.read_csv(out)) == 1


def test_attention_bandwidth_overhead_rows():
    att = bench_attention([(1, 2, 16, 8)], ["fp32"], "cpu", samples=1)
    assert att[0]["flops_per_s"] > 0 and att[0]["batch_heads"] == 2
    bw = bench_bandwidth(2**20, "cpu", samples=1)
    assert bw[0]["bytes_per_s"] > 0
    ov = bench_overhead(layers=(1, 2), samples=1, warmup=1)
    assert {r["phase"] for r in ov} == {"fwd_bwd", "optimizer"}


@pytest.mark.dist
def test_collectives_under_torchrun(tmp_path):
    out = tmp_path / "coll.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    cmd = ["timeout", "120", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", "-m", "scalestudy", "microbench", "collectives", "--out",
           str(out), "--sizes", "4096", "65536", "--samples", "2"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=150)
    df = pd.read_csv(out)
    assert set(df["op"]) == set(OPS)
    assert (df["group_size"] == 2).all() and (df["world_size"] == 2).all()
    ar = df[df["op"] == "all_reduce"].iloc[0]
    assert ar["busbw_Bps"] == pytest.approx(ar["algbw_Bps"] * 1.0)  # 2(p-1)/p = 1 at p = 2
    png = tmp_path / "coll.png"
    plot("collectives", out, png)
    assert png.exists()


def test_predicted_vs_measured_rows_are_complete_and_consistent():
    """The validation rows behind the ``predict`` benchmark: the model's prediction from the
    building blocks measured in this process and the real step time of the same model (their
    ratio is a ``make bench`` figure, never asserted here: it is a timing comparison)."""
    cases = {"tiny-b2": VALIDATE_CASES["tiny-b2"]}
    (r,) = bench_validate(cases)
    assert r["case"] == "tiny-b2" and r["micro_batch"] == 2
    assert r["predicted_s"] > 0 and r["measured_s"] > 0
    parts = ("compute_s", "overhead_s", "optimizer_s")
    assert all(r[k] >= 0 for k in parts) and sum(r[k] for k in parts) <= r["predicted_s"] * (1 + 1e-9)
    assert r["rel_error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
