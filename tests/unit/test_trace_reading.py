"""The profiler-trace reader on traces of known composition: a host (gloo) step read instant by
instant into its terms, the waiting for the slowest rank paired across ranks, the pipeline
bubble split from the transfers, a device (CUDA) step read on its streams with HTA beside it,
and damaged traces giving an empty breakdown with one line of reason."""

from __future__ import annotations

import gzip
import json
import os

import pytest

import synthetic_trace as st
from scalestudy.config.layout import group_key, profiled_ranks, rank_coords
from scalestudy.record import trace_terms as rb
from scalestudy.record import hta
from scalestudy.record.terms import MEASURED_TERMS
from scalestudy.record.timeline import Transfer, classify_chain, read_trace_steps, transfer_kind
from scalestudy.record.trace import TraceError, read_trace

US = 1e-6
DP2 = {"dp": 2, "tp": 1, "pp": 1, "cp": 1}


def _close(got: float, want: float, tol: float = 1e-9) -> bool:
    return abs(got - want) <= tol


def test_host_step_every_instant_given_to_one_term(tmp_path):
    wait = 500.0
    path = st.write(tmp_path / "rank0.json.gz", st.host_trace(0, 2, [st.dp_step(wait)], 2000))
    (r,) = read_trace_steps(read_trace(path), DP2)
    t = r.terms
    assert _close(r.span_s, (360 + wait) * US)
    assert _close(sum(t.values()), r.span_s)
    assert _close(t["data_s"], 10 * US) and _close(t["gemm_s"], 148 * US)
    assert _close(t["elementwise_s"], 40 * US) and _close(t["attention_s"], 50 * US)
    # autograd's own time (its wrapper, the node between its operators) is host overhead,
    # even while the all-reduce is in flight: it is not waiting
    assert _close(t["overhead_s"], 29 * US)
    # the launch (3 µs) and the wait in the backward's scope, no operator running (20 + wait)
    assert _close(t["dp_comm_exposed_s"], (23 + wait) * US)
    assert _close(t["optimizer_s"], 60 * US) and t["unattributed_s"] == 0
    assert _close(r.overlapped["dp"], 22 * US)
    (x,) = r.transfers
    assert (x.kind, x.op, x.index) == ("dp", "gloo:all_reduce", 0)


def test_a_gap_outside_every_operator_is_unattributed(tmp_path):
    step = [("aten::mm", 0, 100, "main"), ("aten::add", 150, 50, "main")]
    path = st.write(tmp_path / "rank0.json", st.host_trace(0, 1, [step], 1000))
    (r,) = read_trace_steps(read_trace(path), DP2)
    assert _close(r.terms["unattributed_s"], 50 * US) and _close(r.span_s, 200 * US)


def test_the_slower_ranks_wait_is_the_other_ranks_sync_wait(tmp_path):
    """Rank 1 reaches the all-reduce 400 µs late: rank 0 waits 400 µs more; the pairing moves
    those to rank 0's sync_wait, leaves the transfer exposed, and names rank 1 the rank that
    waited least."""
    for rank, wait, late in ((0, 500.0, 0.0), (1, 100.0, 400.0)):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(wait, late)] * 3, 2000))
    rec = rb.run_breakdown(tmp_path, {"dp": 2, "tp": 1, "pp": 1, "cp": 1},
                           expected_ranks=[0, 1])
    assert rec["state"] == "ok", rec
    r0, r1 = rec["per_rank"]["0"]["terms"], rec["per_rank"]["1"]["terms"]
    assert _close(r0["sync_wait_s"], 400 * US) and _close(r1["sync_wait_s"], 0.0)
    assert _close(r0["dp_comm_exposed_s"], 123 * US) and _close(r1["dp_comm_exposed_s"], 123 * US)
    assert rec["rank_waited_least"] == 1
    assert rb.check_breakdown(rec) is None
    assert _close(sum(rec["terms"][k] for k in MEASURED_TERMS), rec["step_s"])


def test_a_peers_wait_for_the_late_rank_waiting_for_a_core_is_waiting_for_a_core(tmp_path):
    """Rank 1 reaches the all-reduce 400 µs late, after an extra GEMM in which it waited 200
    µs for a core (its sampler's samples beside its trace): of rank 0's 400 µs wait, those
    200 are waiting for a core, the rest waiting for the slowest rank."""
    for rank, wait, late in ((0, 500.0, 0.0), (1, 100.0, 400.0)):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(wait, late)] * 3, 2000))
    t0 = 2_000_000e3  # (ns: the synthetic trace's steps start at 2 s, one every 2100 µs)
    samples = [[t0 + k * 2100e3 + dt * 1e3, w * 1e3 + k * 200e3]
               for k in range(3) for dt, w in ((200, 0), (600, 200))]
    (tmp_path / "traces" / "rank1.runqueue.json").write_text(json.dumps({"samples": samples}))
    rec = rb.run_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    r0, r1 = rec["per_rank"]["0"]["terms"], rec["per_rank"]["1"]["terms"]
    assert _close(r1["core_wait_s"], 200 * US) and _close(r1["sync_wait_s"], 0.0)
    assert _close(r0["core_wait_s"], 200 * US) and _close(r0["sync_wait_s"], 200 * US)
    assert _close(r0["dp_comm_exposed_s"], 123 * US)
    assert _close(sum(r0[k] for k in MEASURED_TERMS), rec["per_rank"]["0"]["step_s"])


def test_the_backends_threads_wait_for_a_core_only_while_the_bytes_move(tmp_path):
    """Rank 0 waits 400 µs for rank 1 in the all-reduce, then 123 µs while the bytes move.
    Its backend threads waited 300 µs for a core while it waited for rank 1 (nothing to move
    yet: still waiting for the slowest rank) and 50 µs while the bytes moved (the transfer
    held up: waiting for a core)."""
    for rank, wait, late in ((0, 500.0, 0.0), (1, 100.0, 400.0)):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(wait, late)] * 3, 2000))
    t0 = 2_000_000e3  # (ns: the synthetic trace's steps start at 2 s, one every 2100 µs)
    samples = [[t0 + k * 2100e3 + dt * 1e3, 0, (o + k * 350) * 1e3]
               for k in range(3) for dt, o in ((300, 0), (600, 300), (700, 300), (800, 350))]
    (tmp_path / "traces" / "rank0.runqueue.json").write_text(json.dumps({"samples": samples}))
    rec = rb.run_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    r0 = rec["per_rank"]["0"]["terms"]
    assert _close(r0["sync_wait_s"], 400 * US) and _close(r0["core_wait_s"], 50 * US)
    assert _close(r0["dp_comm_exposed_s"], 73 * US)
    assert _close(sum(r0[k] for k in MEASURED_TERMS), rec["per_rank"]["0"]["step_s"])


def test_a_rank_whose_own_transfer_ends_late_waited_for_no_one(tmp_path):
    """Both ranks launch the all-reduce at 258 µs; rank 0's ends 400 µs after rank 1's (its
    own threads were late to finish it): that is its transfer, not waiting for rank 1."""
    for rank, wait in ((0, 500.0), (1, 100.0)):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(wait)] * 3, 2000))
    rec = rb.run_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    r0 = rec["per_rank"]["0"]["terms"]
    assert r0["sync_wait_s"] == 0 and _close(r0["dp_comm_exposed_s"], 523 * US)


def test_pipeline_waiting_beyond_one_transfer_is_the_bubble():
    from scalestudy.record.timeline import StepReading

    def reading(exposed: list[float], lives: list[float]):
        ts = [Transfer("pp", "gloo:recv", i, 0.0, life, exposed=e)
              for i, (e, life) in enumerate(zip(exposed, lives))]
        terms = dict.fromkeys(MEASURED_TERMS, 0.0)
        terms["pp_p2p_s"] = sum(exposed)
        return StepReading("ProfilerStep#0", 1.0, terms, {}, ts)

    readings = {0: [reading([0.3, 0.01], [0.3, 0.01])], 1: [reading([0.02], [0.05])]}
    rb.split_pipeline(readings)
    t0, t1 = readings[0][0].terms, readings[1][0].terms
    assert _close(t0["pp_bubble_s"], 0.29) and _close(t0["pp_p2p_s"], 0.02)
    assert _close(t1["pp_bubble_s"], 0.01) and _close(t1["pp_p2p_s"], 0.01)


def test_transfer_kinds_from_the_launch_and_the_layout():
    assert transfer_kind((), "gloo:send", DP2) == "pp"
    assert transfer_kind(("FSDP::all_gather",), "gloo:all_gather", DP2) == "dp"
    assert transfer_kind(("_c10d_functional::all_reduce",), "gloo:all_reduce",
                         {"tp": 2}) == "tp"
    assert transfer_kind(("_c10d_functional::all_reduce",), "gloo:all_reduce",
                         {"tp": 1, "cp": 2}) == "cp"
    assert transfer_kind(("scalestudy::clip_grad_norm", "c10d::allreduce_"),
                         "gloo:all_reduce", DP2) == "optimizer"
    assert transfer_kind((), "ncclDevKernel_AllReduce", {"tp": 2, "dp": 2}, "mesh_tp") == "tp"
    assert transfer_kind((), "ncclDevKernel_AllReduce", {"tp": 2, "dp": 2}, "mesh_dp") == "dp"
    assert classify_chain(("scalestudy::forward_backward", "aten::linear", "aten::addmm")) == "gemm_s"
    assert classify_chain(("aten::addmm", "aten::empty")) == "gemm_s"  # an allocation inside
    assert classify_chain(("aten::_scaled_dot_product_flash_attention", "aten::mm")) == \
        "attention_s"
    assert classify_chain(("Optimizer.step#AdamW.step", "aten::mm")) == "optimizer_s"


def test_device_step_read_on_the_streams_exactly(tmp_path):
    path = st.write(tmp_path / "rank0.json.gz", st.device_trace(0, 2, [st.STEP] * 2, 1000))
    trace = read_trace(path)
    assert trace.on_gpu and trace.rank == 0 and trace.world_size == 2
    for r in read_trace_steps(trace, DP2):
        got = {**r.terms, "dp_comm_overlapped_s": r.overlapped["dp"]}
        for k, v in st.EXPECTED.items():
            assert _close(got[k], v), (k, got[k], v)
        assert _close(sum(r.terms.values()), r.span_s)
        assert {k for k, v in r.terms.items() if v} == {k for k in st.EXPECTED
                                                        if k in r.terms}


def test_device_comm_of_the_tensor_parallel_group_is_tp(tmp_path):
    step = [("gemm_s", 10, 100), ("comm:tp", 110, 50), ("gemm_s", 160, 100)]
    path = st.write(tmp_path / "rank0.json", st.device_trace(0, 2, [step], 400))
    (r,) = read_trace_steps(read_trace(path), {"tp": 2, "dp": 1})
    assert _close(r.terms["tp_comm_s"], 50 * US) and r.terms["dp_comm_exposed_s"] == 0


def test_hta_agrees_with_the_own_reading_on_device_traces(tmp_path):
    if not hta.available():
        if os.environ.get("SCALESTUDY_REQUIRE_HTA") == "1":
            pytest.fail("SCALESTUDY_REQUIRE_HTA=1 but HTA (traceinsight) is not installed")
        pytest.skip("HTA not installed (pip install 'scalestudy[hta]')")
    steps = [st.STEP, [("gemm_s", 20, 300), ("comm:dp", 100, 400), ("elementwise_s", 600, 50)]]
    for rank in (0, 1):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.device_trace(rank, 2, steps, 1000))
    rec = rb.run_breakdown(tmp_path, {"dp": 2, "tp": 1, "pp": 1, "cp": 1}, expected_ranks=[0, 1])
    assert rec["state"] == "ok" and rec["device"] == "gpu"
    assert rec["hta"]["state"] == "ok" and rec["hta"]["agree"], rec["hta"]
    own = rec["temporal"]["0"]
    # two steps: 1880 µs of kernels, idle between, the all-reduce 200/400 µs under compute
    assert _close(own["compute_s"], (400 + 150 + 100 + 80 + 300 + 50) * US)
    assert 0 < own["comm_overlap"] < 1


@pytest.mark.parametrize("damage,why", [
    ("cut", "cut"), ("not_json", "not JSON"), ("no_steps", "no profiled step"),
    ("bad_time", "no finite ts"), ("missing_rank", "no trace of rank"),
    ("not_a_trace", "no traceEvents")])
def test_a_damaged_trace_gives_an_empty_breakdown_with_its_reason(tmp_path, damage, why):
    traces = tmp_path / "traces"
    for rank in (0, 1):
        st.write(traces / f"rank{rank}.json.gz", st.host_trace(rank, 2, [st.dp_step(50)], 900))
    target = traces / "rank1.json.gz"
    data = gzip.decompress(target.read_bytes())
    doc = json.loads(data)
    if damage == "cut":
        target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])
    elif damage == "not_json":
        target.write_bytes(gzip.compress(data[: len(data) // 2]))
    elif damage == "no_steps":
        doc["traceEvents"] = [e for e in doc["traceEvents"] if "ProfilerStep" not in e["name"]]
        st.write(target, doc)
    elif damage == "bad_time":
        doc["traceEvents"][3]["ts"] = "soon"
        st.write(target, doc)
    elif damage == "missing_rank":
        target.unlink()
    else:
        st.write(target, {"events": []})
    rec = rb.run_breakdown(tmp_path, DP2 | {"pp": 1}, expected_ranks=[0, 1])
    assert rec["state"] == "empty" and why in rec["reason"] and "\n" not in rec["reason"]
    assert rb.check_breakdown(rec) is None
    rb.write_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    got, reason = rb.read_breakdown(tmp_path)
    assert got is None and why in reason


def test_a_trace_over_its_cap_or_a_fifo_is_refused_unread(tmp_path):
    path = st.write(tmp_path / "rank0.json", st.host_trace(0, 1, [st.dp_step(1)], 500))
    with pytest.raises(TraceError, match="more than the 10"):
        read_trace(path, max_bytes=10)
    fifo = tmp_path / "rank1.json.gz"
    os.mkfifo(fifo)
    with pytest.raises(TraceError, match="not a regular file"):
        read_trace(fifo)


@pytest.mark.parametrize("field,value", [("step_s", -1.0), ("state", "fine"),
                                         ("rank_waited_least", 9), ("schema", 0),
                                         ("runqueue_wait_s", -0.5), ("raw_step_s", 1e-9),
                                         ("profiler_s", "x"), ("straggler", {"rank": 9}),
                                         ("named_by_kernel", [1]),
                                         ("hta", {"state": "ok", "ranks": {"0": {}}})])
def test_a_damaged_breakdown_record_is_refused_with_the_field(tmp_path, field, value):
    for rank in (0, 1):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(50)], 900))
    rec = rb.write_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    rec[field] = value
    (tmp_path / rb.BREAKDOWN_FILE).write_text(json.dumps(rec))
    got, reason = rb.read_breakdown(tmp_path)
    assert got is None and field in reason


def test_the_ranks_wait_for_a_core_comes_from_their_profile_records(tmp_path):
    """``runqueue_wait_s``: the traced ranks' mean of their medians from ``summary.json``;
    None where a rank has none (not Linux, a foreign trainer) or the record is damaged."""
    for rank in (0, 1):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, [st.dp_step(50)], 900))

    def summary(*waits, step=0.01):
        ranks = [{"rank": r, "traced": True, "state": "ok", "runqueue_wait_s": w,
                  "profiled_step_s": step} for r, w in enumerate(waits)]
        (tmp_path / "summary.json").write_text(json.dumps({"profile": {"ranks": ranks}}))
        return rb.run_breakdown(tmp_path, DP2)

    assert summary(0.002, 0.004)["runqueue_wait_s"] == pytest.approx(0.003)
    assert summary(0.002, None)["runqueue_wait_s"] is None
    assert summary(0.002, -1.0)["runqueue_wait_s"] is None  # damaged: the profile's checks
    # read inside the step's timed window: a wait longer than the step is a damaged record
    assert summary(0.002, 0.004, step=0.003)["runqueue_wait_s"] is None
    assert rb.run_breakdown(tmp_path, DP2, expected_ranks=[0, 1])["runqueue_wait_s"] is None


def test_a_rank_reads_its_own_wait_for_a_core():
    from scalestudy.train.profile import runqueue_wait_s

    first = runqueue_wait_s()
    if first is None:
        pytest.skip("no /proc/thread-self/schedstat here (not Linux)")
    sum(range(2_000_000))  # some work; the figure never goes back
    assert 0 <= first <= runqueue_wait_s()


def test_the_sampler_writes_waits_the_reader_puts_on_the_traces_clock(tmp_path):
    """The trainer's run-queue sampler, beside a trace whose ts 0 is ``baseTimeNanoseconds``:
    its samples come back in seconds on the trace's clock, cumulative; the profiler's cost
    per event is a few µs of CPU, never negative."""
    from scalestudy.train import profile

    with profile.RunQueueSampler() as sampler:
        if not sampler._thread.is_alive():
            pytest.skip("no schedstat here (not Linux)")
        sum(range(3_000_000))
    assert len(sampler.samples) >= 2 and all(len(x) == 3 for x in sampler.samples)
    base = sampler.samples[0][0] - 5_000_000  # the trace's ts 0: 5 ms before the first
    doc = st.host_trace(0, 1, [[("aten::mm", 0, 100, "main")]], 1000)
    doc["baseTimeNanoseconds"] = base
    trace = read_trace(st.write(tmp_path / "rank0.json.gz", doc))
    profile._write_samples(sampler.samples, tmp_path / rb.RUNQUEUE_NAME.format(rank=0))
    got = rb.runqueue_samples(trace)
    # (within the float resolution of wall-clock nanoseconds: < 1 µs)
    assert _close(got[0][0], 5e-3, 1e-6) and len(got) == len(sampler.samples)
    assert all(a[1] <= b[1] and a[2] <= b[2] for a, b in zip(got, got[1:]))
    assert 0 <= profile.event_cost_s(ops=200, rounds=2) < 1e-3


def test_mesh_coordinates_and_groups_follow_the_trainers_mesh():
    sizes = {"pp": 2, "dp": 2, "tp": 2}
    assert rank_coords(5, sizes) == {"pp": 1, "dp": 0, "tp": 1}
    assert group_key(5, sizes, ("tp",)) == group_key(4, sizes, ("tp",))
    assert group_key(5, sizes, ("dp",)) == group_key(7, sizes, ("dp",))
    assert group_key(5, sizes, ("dp",)) != group_key(4, sizes, ("dp",))
    # one rank per pipeline stage (dp 0) and per data-parallel rank (stage 0), tp rank 0
    assert profiled_ranks(sizes, "groups") == [0, 2, 4]
    assert profiled_ranks(sizes, "all") == list(range(8))


def test_waiting_for_a_core_is_taken_out_where_it_happened(tmp_path):
    """The sampler says the thread waited 30 µs for a core during the GEMM (10-110 µs) and
    20 µs during the all-reduce's wait: they leave the GEMMs and the exposed communication
    for core_wait_s, and the step still adds up."""
    path = st.write(tmp_path / "rank0.json.gz", st.host_trace(0, 2, [st.dp_step(500)], 2000))
    tr = read_trace(path)
    t0 = tr.steps[0].start
    samples = [(t0 + 10 * US, 0.0), (t0 + 110 * US, 30 * US), (t0 + 500 * US, 30 * US),
               (t0 + 600 * US, 50 * US)]
    (plain,) = read_trace_steps(tr, DP2)
    (r,) = read_trace_steps(tr, DP2, samples=samples)
    assert _close(r.terms["core_wait_s"], 50 * US) and plain.terms["core_wait_s"] == 0
    assert _close(r.terms["gemm_s"], plain.terms["gemm_s"] - 30 * US)
    assert _close(r.terms["dp_comm_exposed_s"], plain.terms["dp_comm_exposed_s"] - 20 * US)
    assert _close(sum(r.terms.values()), r.span_s) and _close(r.span_s, plain.span_s)


def test_the_profilers_cost_is_taken_out_per_event_where_it_was_paid(tmp_path):
    """2 µs per recorded event: each of the 12 main-thread events gives 2 µs back from the
    term it starts in (a piece shorter than that: the next piece pays the rest); nothing is
    scaled, the waiting stays, the raw span stays beside."""
    path = st.write(tmp_path / "rank0.json.gz", st.host_trace(0, 2, [st.dp_step(500)], 2000))
    tr = read_trace(path)
    (plain,) = read_trace_steps(tr, DP2)
    (r,) = read_trace_steps(tr, DP2, event_cost_s=2 * US)
    assert _close(r.profiler_s, 12 * 2 * US) and _close(r.raw_span_s, plain.span_s)
    assert _close(r.span_s, plain.span_s - 24 * US) and _close(sum(r.terms.values()), r.span_s)
    # the forward's scope and its mm start together; autograd's 1 µs wrapper and node leave
    # 2 µs of their cost to the backward's mm
    assert _close(r.terms["gemm_s"], plain.terms["gemm_s"] - 8 * US)
    assert _close(r.terms["optimizer_s"], plain.terms["optimizer_s"] - 2 * 2 * US)
    # the all-reduce's launch pays its event; its wait (no event) keeps every second
    assert _close(r.terms["dp_comm_exposed_s"], plain.terms["dp_comm_exposed_s"] - 2 * US)
    assert all(r.terms[k] <= plain.terms[k] + 1e-15 for k in MEASURED_TERMS)


def test_a_runs_terms_are_the_mean_of_its_ranks_whole_steps(tmp_path):
    """Three steps per rank of different lengths: each rank's terms are the mean of its whole
    steps' terms (they add up to its mean step), never medians taken term by term."""
    steps = [st.dp_step(100), st.dp_step(900), st.dp_step(400)]
    for rank in (0, 1):
        st.write(tmp_path / "traces" / f"rank{rank}.json.gz",
                 st.host_trace(rank, 2, steps, 2000))
    rec = rb.run_breakdown(tmp_path, DP2, expected_ranks=[0, 1])
    assert rec["state"] == "ok" and rec["step_choice"].startswith("the mean over")
    for one in rec["per_rank"].values():
        assert _close(one["step_s"], (360 + 1400 / 3) * US)
        assert _close(sum(one["terms"][k] for k in MEASURED_TERMS), one["step_s"])
        # the median of the exposed all-reduce would be 400 + 23 µs, and the other terms'
        # medians would add up to a step that never ran
        assert _close(one["terms"]["dp_comm_exposed_s"], (23 + 1400 / 3) * US)
    assert _close(rec["step_s"], (360 + 1400 / 3) * US)
    assert rb.check_breakdown(rec) is None
