"""The trace reader on real GPU traces that are not ours (``tests/data/kineto``: public
Kineto traces of NCCL jobs and of a ROCm job, with their source and licence): a job without
send/recv has no pipeline time although NCCL ran its collectives through ``SendRecv``
kernels; all-to-all, all-gather and reduce-scatter are named by the op that launched them;
the terms regrouped as HTA groups time agree with HTA's temporal breakdown within 5 points
per rank; a ROCm trace of one process without ``distributedInfo`` is rank 0 of 1."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

from scalestudy.record import hta
from scalestudy.record import trace_terms as tt
from scalestudy.record.terms import MEASURED_TERMS
from scalestudy.record.kernels import BY_KERNEL_NAME, BY_LAUNCHER
from scalestudy.record.timeline import read_trace_steps
from scalestudy.record.trace import TraceError, read_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto"
#: (files, the job's layout as a point states it)
JOBS = {"torchrec": (["torchrec_rank-0.json.gz", "torchrec_rank-1.json.gz"], {"dp": 128}),
        "sharded": (["sharded_rank-0.json.gz"], {"dp": 16}),
        "ddp": (["ddp_rank-0.json.gz"], {"dp": 2}),
        "rocm": (["mi250_rocm.json.gz"], {})}


def _run(tmp_path: Path, job: str) -> dict:
    files, layout = JOBS[job]
    for f in files:
        shutil.copy(DATA / f, tmp_path / f)
    return tt.run_breakdown(tmp_path, layout, pattern="*.json.gz")


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict:
    """Each job's breakdown record, read once (HTA beside it where installed)."""
    return {job: _run(tmp_path_factory.mktemp(job), job) for job in JOBS}


@pytest.mark.parametrize("job", ["torchrec", "sharded", "ddp"])
def test_a_job_without_send_or_recv_has_no_pipeline_time(records, job):
    rec = records[job]
    assert rec["state"] == "ok", rec.get("reason")
    assert rec["terms"]["pp_p2p_s"] == 0 and rec["terms"]["pp_bubble_s"] == 0
    assert rec["terms"]["dp_comm_exposed_s"] > 0 and not rec["named_by_kernel"]
    for r, one in rec["per_rank"].items():  # each rank's whole step adds up
        assert abs(sum(one["terms"][k] for k in MEASURED_TERMS) - one["step_s"]) < 1e-9


def test_collectives_are_named_by_the_op_that_launched_them_not_the_kernel():
    tr = read_trace(DATA / "sharded_rank-0.json.gz")
    (step,) = read_trace_steps(tr, {"dp": 16})
    kernels = {t.op: set() for t in step.transfers}
    for t in step.transfers:
        assert t.named_by == BY_LAUNCHER and t.kind == "dp"
    names = {k.name.split("(")[0] for k in tr.gpu if "nccl" in k.name}
    assert names == {"ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t"}  # (what NCCL ran them as)
    assert set(kernels) == {"all_to_all", "reduce_scatter", "all_gather", "all_reduce"}
    # the DDP job's launcher says its collective and process group in record_param_comms
    (ddp,) = read_trace_steps(read_trace(DATA / "ddp_rank-0.json.gz"), {"dp": 2})
    assert {t.op for t in ddp.transfers} == {"all_reduce", "broadcast"}
    # Shampoo's all-gather inside the optimizer's step is the optimizer's
    two = read_trace_steps(read_trace(DATA / "torchrec_rank-0.json.gz"), {"dp": 128})
    assert {(t.kind, t.op) for s in two for t in s.transfers} == {
        ("dp", "all_to_all"), ("dp", "all_reduce"), ("optimizer", "all_gather")}


def test_a_transfer_without_a_launcher_falls_back_to_its_kernels_name(tmp_path):
    """The same trace with its launchers' host ops removed: the kernel's name is all there is
    (and each transfer says so); SendRecv then reads as point-to-point."""
    import json

    doc = json.loads(gzip.open(DATA / "sharded_rank-0.json.gz").read())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (
        e.get("name") == "record_param_comms" or str(e.get("name", "")).startswith(
            ("nccl:", "c10d::")))]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    (step,) = read_trace_steps(read_trace(path), {"dp": 16})
    assert {t.named_by for t in step.transfers} == {BY_KERNEL_NAME}
    assert {t.kind for t in step.transfers} == {"pp"}
    assert step.terms["pp_p2p_s"] > 0 and step.terms["dp_comm_exposed_s"] == 0


@pytest.mark.parametrize("job", ["torchrec", "sharded", "ddp", "rocm"])
def test_shares_agree_with_htas_temporal_breakdown_within_5_points_per_rank(records, job):
    if not hta.available():
        if os.environ.get("SCALESTUDY_REQUIRE_HTA") == "1":
            pytest.fail("SCALESTUDY_REQUIRE_HTA=1 but HTA (traceinsight) is not installed")
        pytest.skip("HTA not installed (pip install 'scalestudy[hta]')")
    rec = records[job]
    assert rec["hta"]["state"] == "ok", rec["hta"]
    assert set(rec["hta"]["ranks"]) == {str(r) for r in rec["ranks"]}
    for rank, x in rec["hta"]["ranks"].items():
        for k in ("idle", "compute", "non_compute"):
            assert x["differences"][k] <= 0.05, (rank, k, x)
    assert rec["hta"]["agree"]


def test_hta_reads_several_ranks_without_forking(records, monkeypatch):
    """A fork of a process running threads (a pytest-xdist worker, a Snakemake job) can hang
    on a lock one of them held: HTA parses a multi-rank job in the calling process."""
    if not hta.available():
        pytest.skip("HTA not installed (pip install 'scalestudy[hta]')")

    def no_fork():
        raise AssertionError("HTA forked")

    monkeypatch.setattr(os, "fork", no_fork)
    files = [str(DATA / f) for f in JOBS["torchrec"][0]]
    out = hta.cross_check(files, records["torchrec"]["temporal"])
    assert out["state"] == "ok" and set(out["ranks"]) == {"0", "1"}, out


def test_a_rocm_trace_of_one_process_is_rank_0_of_1(records, tmp_path):
    tr = read_trace(DATA / "mi250_rocm.json.gz")
    assert tr.rank is None and tr.on_gpu and len(tr.steps) == 2
    rec = records["rocm"]
    assert rec["state"] == "ok" and rec["ranks"] == [0] and rec["device"] == "gpu"
    one = rec["per_rank"]["0"]
    first = read_trace_steps(tr, {})[0]  # (the step that trains; the second is its tail)
    assert first.terms["gemm_s"] > 0  # rocBLAS/hipBLASLt's Tensile kernels (Cijk_...)
    assert abs(sum(one["terms"][k] for k in MEASURED_TERMS) - one["step_s"]) < 1e-12
    # several traces that name no rank are refused, naming the file
    for name in ("one.json.gz", "other.json.gz"):
        shutil.copy(DATA / "mi250_rocm.json.gz", tmp_path / name)
    bad = tt.run_breakdown(tmp_path, {}, pattern="*.json.gz")
    assert bad["state"] == "empty" and "names no rank" in bad["reason"]


def test_an_error_names_the_file_once_with_what_was_wrong(tmp_path):
    path = tmp_path / "rank3.json.gz"
    path.write_bytes((DATA / "mi250_rocm.json.gz").read_bytes()[:2000])
    with pytest.raises(TraceError) as e:
        read_trace(path)
    assert str(e.value).count("rank3.json.gz") == 1 and "cut" in str(e.value)
    assert "not JSON" not in str(e.value)
