"""The GPU check's logic that needs no GPU: the two calls' schedules and budgets, the limits on
what comes back from the device, the preflight's verdict, which layouts run on one GPU over
gloo, which trace terms one GPU cannot show, the carried wheels' closure, energy counted once
per physical device, and how the trainer picks a backend when ranks share one GPU."""

from __future__ import annotations

import os

import pytest

from benchmarks import gloo_cuda, gpu_check, gpu_parts, gpu_wheels
from scalestudy.train import energy
from scalestudy.train.device import BACKEND_ENV, device_index, process_group_backend


def test_each_call_fits_its_budget_and_a_larger_share_is_refused(monkeypatch):
    for call in gpu_check.CALLS:
        for smoke in (False, True):
            rows = gpu_check.schedule(call, smoke)
            assert gpu_check.PREFLIGHT_S + sum(s for _, s in rows) <= \
                gpu_check.BUDGET[call][smoke]
    assert gpu_check.BUDGET[1][0] <= 240 and gpu_check.BUDGET[2][0] <= 360
    monkeypatch.setitem(gpu_check.CALLS, 1, (("probe", 500, 60),))
    with pytest.raises(ValueError, match="more than its 240 s"):
        gpu_check.schedule(1, False)


def test_every_part_belongs_to_one_call_and_names_fit_the_device():
    parts = [p for rows in gpu_check.CALLS.values() for p, *_ in rows]
    assert sorted(parts) == sorted(gpu_check.SHAPES) and len(set(parts)) == len(parts)
    for call in gpu_check.CALLS:
        names = gpu_check.out_names(call).values()
        assert len(names) <= gpu_check.FILES_PER_CALL
        assert all(gpu_check.NAME_OK.match(n) for n in names)


def test_a_part_of_another_shape_is_named():
    rec = gpu_check.blank("memory", True, "ok", "", "t", 1.0)
    assert gpu_check.shape_problem(rec) is None
    del rec["capacity"]
    assert gpu_check.shape_problem(rec) == "memory: missing capacity"
    assert "state" in gpu_check.shape_problem({**gpu_check.blank("energy", 1, "ok", "", "", 0),
                                               "state": "fine"})


def test_what_would_not_come_back_from_the_device_is_named(tmp_path):
    out = tmp_path / "out"
    (out / "a" / "b" / "c").mkdir(parents=True)
    assert gpu_check.out_problems(out) == []
    (out / "call1.json").write_text("{}")
    (out / "a" / "b" / "ok.txt").write_text("x")           # OUT/a/b/file comes back
    assert gpu_check.out_problems(out) == []
    (out / "a" / "b" / "c" / "deep.txt").write_text("x")   # OUT/a/b/c/file does not
    (out / "bad name.json").write_text("x")
    with open(out / "big.bin", "wb") as f:
        f.truncate(16 * 2**20 + 1)                          # sparse: no disk used
    for i in range(5):
        (out / f"f{i}").write_text("x")
    bad = gpu_check.out_problems(out)
    assert any("deeper than OUT/a/b/file" in b for b in bad)
    assert any(b.startswith("bad name.json: a name outside") for b in bad)
    assert any(b.startswith("big.bin:") and "16 MiB" in b for b in bad)
    assert any(b.startswith("10 files, more than 8") for b in bad)
    assert any("directly under OUT, more than 6" in b for b in bad)


def test_the_preflight_aborts_on_a_missing_module_or_no_cuda():
    info = {"torch": "2.11.0+cu130", "cuda": "13.0", "cuda_available": False, "missing": []}
    assert "no CUDA device visible to torch 2.11.0+cu130" in gpu_check.abort_reason(info, False)
    assert gpu_check.abort_reason(info, True) is None  # the smoke run needs no CUDA
    why = gpu_check.abort_reason({**info, "cuda_available": True, "missing": ["jsonschema"]},
                                 False)
    assert why.startswith("modules missing: jsonschema") and "make gpu-wheels" in why
    assert gpu_check.abort_reason({**info, "cuda_available": True}, False) is None


def test_layouts_needing_what_gloo_cannot_run_on_cuda_are_left_out_with_why():
    ranks = {n: gpu_parts.LAYOUTS[n][0] for n in gpu_parts.LAYOUTS}
    run, out = gloo_cuda.gpu_layouts(ranks)
    assert set(out) == {"pp2", "pp2xdp2xtp2"} and "recv, send" in out["pp2"]
    assert run == ["n1", "ddp2", "fsdp2", "tp2", "dp2xtp2"]
    # a reduce-scatter that does not average on CUDA: FSDP2 goes, TP (summing) stays
    run, out = gloo_cuda.gpu_layouts(ranks, gloo_cuda.GLOO_CUDA - {"reduce_scatter_tensor_avg"})
    assert run == ["n1", "ddp2", "tp2", "dp2xtp2"] and "reduce_scatter_tensor_avg" in out["fsdp2"]
    # nothing on CUDA: one rank (NCCL) still runs
    assert gloo_cuda.gpu_layouts(ranks, frozenset())[0] == ["n1"]


def test_the_terms_a_trace_cannot_show():
    one = gpu_parts.terms_not_shown(1, 1, 1, 1, gpus=1)
    assert set(one) == {"dp_comm_exposed_s", "sync_wait_s", "tp_comm_s", "pp_p2p_s",
                        "pp_bubble_s", "cp_comm_s"}
    shared = gpu_parts.terms_not_shown(2, 1, 1, 1, gpus=1)
    assert "gloo through host memory" in shared["dp_comm_exposed_s"]
    assert "tp_comm_s" in shared and "dp = 1" not in shared["dp_comm_exposed_s"]
    assert "dp_comm_exposed_s" not in gpu_parts.terms_not_shown(2, 1, 1, 1, gpus=2)


def test_carried_wheels_close_over_the_image_and_never_shadow_it():
    have = {"attrs", "typing-extensions", "numpy"}
    kept = {"jsonschema": ["attrs", "referencing", "rpds-py"], "referencing": ["attrs"],
            "rpds-py": [], "traceinsight": ["jupyterlab", "numpy"]}
    assert gpu_wheels.closure_problems(kept, have) == []  # jupyterlab: declared unused
    bad = gpu_wheels.closure_problems({**kept, "attrs": []}, have)
    assert bad == ["attrs: the image has it; carrying it would shadow the image's"]
    del kept["rpds-py"]
    assert gpu_wheels.closure_problems(kept, have) == [
        "jsonschema requires rpds-py: neither carried nor on the image"]
    assert gpu_wheels.norm("Typing_Extensions") == "typing-extensions"
    assert {"torch", "nvidia-ml-py", "pandas"} <= gpu_wheels.image()
    assert not set(gpu_wheels.WANTED + gpu_wheels.WANTED_NO_DEPS) & gpu_wheels.image()


def test_wheel_tags_say_which_are_built_for_one_python(tmp_path):
    from pathlib import Path

    assert gpu_wheels.abi_specific(Path("rpds_py-1-cp312-cp312-manylinux_2_17_x86_64.whl"))
    assert not gpu_wheels.abi_specific(Path("tornado-6-cp311-abi3-manylinux1_x86_64.whl"))
    assert not gpu_wheels.abi_specific(Path("jsonschema-4-py3-none-any.whl"))


def test_ranks_sharing_one_gpu_count_its_energy_once():
    dev = [{"source": "nvml", "scope": "device", "host": "h", "device_id": "GPU-a",
            "j": [2.0, 2.0], "s": [0.5, 0.5]} for _ in range(4)]
    per_step, s = energy.summarize(dev, steps=2, warmup=1, tokens_per_step=10)
    assert per_step[1]["energy_j"] == 2.0 and s["counted_ranks"] == [0]
    assert s["joules_per_token"] == pytest.approx(0.2) and "1 device(s) of 4 rank(s)" in s["note"]
    two = [dict(dev[0]), {**dev[1], "device_id": "GPU-b"}, {**dev[2], "device_id": None}]
    _, s = energy.summarize(two, steps=2, warmup=1, tokens_per_step=10)
    assert s["counted_ranks"] == [0, 1, 2]  # a rank without a device id counts on its own


def test_ranks_sharing_a_gpu_wrap_onto_it_and_gloo_can_be_asked_for():
    assert [device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [device_index(r, 2) for r in range(4)] == [0, 1, 0, 1]
    assert process_group_backend("cpu", {}) == "gloo"
    assert process_group_backend("cuda", {BACKEND_ENV: "gloo"}) == "gloo"
    with pytest.raises(ValueError, match="use one of gloo, nccl"):
        process_group_backend("cuda", {BACKEND_ENV: "mpi"})
    assert os.environ.get(BACKEND_ENV) is None


def test_the_torch_internals_torchrun_replaces_have_the_shape_it_reads():
    # the same on torch 2.11 (the GPU machine's) and 2.13; another shape is left unpatched
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler \
        import SubprocessHandler
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    from scalestudy.run import torchrun

    assert torchrun._params(SubprocessHandler._popen) == ["self", "args", "env"]
    assert torchrun._params(DynamicRendezvousHandler._create_tcp_store_server) == \
        ["self", "master_addr", "master_port"]
    assert torchrun._params(None) is None


def test_records_pack_without_caches_or_traces_and_are_left_out_over_the_limit(tmp_path,
                                                                               monkeypatch):
    import tarfile

    work, out = tmp_path / "work", tmp_path / "out"
    for rel in ("memory/runs/a/summary.json", "cache/inductor/k.py", "trace/runs/t/traces/r.gz",
                "parts/memory.json"):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(os.urandom(600).hex())
    out.mkdir()
    said = gpu_check.pack_records(out, work, 1)
    path = out / "call1-records.tar.gz"
    assert said.startswith("call1-records.tar.gz: ")
    with tarfile.open(path) as tar:
        assert sorted(tar.getnames()) == ["memory/runs/a/summary.json", "parts/memory.json"]
    monkeypatch.setitem(gpu_check.OUT_LIMITS, "file_bytes", 100)
    assert "records left out" in gpu_check.pack_records(out, work, 1)
    assert list(out.iterdir()) == []
