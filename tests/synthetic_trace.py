"""Kineto traces of known composition, written the way ``torch.profiler`` writes a CUDA run's
(host operators launching kernels through ``cudaLaunchKernel`` with a ``correlation`` each,
kernels on a compute and a communication stream, ``record_param_comms`` naming its process
group, ``distributedInfo``), for the tests of the device reading and of HTA beside it.

A step is a list of device intervals ``(term, start_us, dur_us)`` relative to the step's
start: ``term`` is ``gemm_s``, ``attention_s``, ``elementwise_s``, ``optimizer_s``,
``data_s`` (a host-to-device copy) or ``comm:<kind>`` (an NCCL kernel of that mesh
dimension's process group); the device is idle wherever no interval runs. ``EXPECTED`` gives
the terms the reading must find in ``STEP``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

#: kernel and host operator per computing term
KERNELS = {
    "gemm_s": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "aten::mm"),
    "attention_s": ("flash_fwd_kernel", "aten::_scaled_dot_product_flash_attention"),
    "elementwise_s": ("vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "aten::gelu"),
    "optimizer_s": ("multi_tensor_apply_kernel", "aten::_foreach_add_"),
}
COMM_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GROUPS = {"tp": "3", "dp": "1", "pp": "2"}


def device_trace(rank: int, world: int, steps: list[list[tuple]], step_us: float,
                 gap_us: float = 50.0) -> dict:
    """A Kineto trace of ``steps`` (module doc), each a ``ProfilerStep#k`` of ``step_us`` µs
    on the host, ``gap_us`` between them."""
    events, corr = [], [1000]
    pid, tid = 100 + rank, 100 + rank

    def host(name, ts, dur, cat="cpu_op", args=None):
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
                       "dur": dur, "args": args or {}})

    def kernel(name, ts, dur, stream, cat="kernel", launch_ts=None):
        corr[0] += 1
        c = corr[0]
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "pid": pid, "tid": tid, "ts": launch_ts, "dur": 2,
                       "args": {"correlation": c}})
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts,
                       "dur": dur, "args": {"device": 0, "stream": stream, "correlation": c,
                                            "External id": c}})

    t = 1_000_000.0
    for k, intervals in enumerate(steps):
        host(f"ProfilerStep#{k}", t, step_us, cat="user_annotation")
        for i, (term, start, dur) in enumerate(intervals):
            op = t + 5 + 10 * i  # the host runs ahead, one launch every 10 µs
            if term.startswith("comm:"):
                kind = term.split(":")[1]
                host("record_param_comms", op, 8,
                     args={"Process Group Name": GROUPS[kind], "Collective name": "allreduce"})
                host("nccl:all_reduce", op + 1, 6)
                kernel(COMM_KERNEL, t + start, dur, 20, launch_ts=op + 2)
            elif term == "data_s":
                host("aten::copy_", op, 8)
                kernel("Memcpy HtoD (Pinned -> Device)", t + start, dur, 7, cat="gpu_memcpy",
                       launch_ts=op + 2)
            else:
                name, aten = KERNELS[term]
                if term == "optimizer_s":
                    host("Optimizer.step#AdamW.step", op, 9)
                host(aten, op + 0.5, 7)
                kernel(name, t + start, dur, 7, launch_ts=op + 2)
        host("cudaDeviceSynchronize", t + step_us - 3, 2, cat="cuda_runtime")
        t += step_us + gap_us
    events.sort(key=lambda e: e["ts"])
    return {
        "schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                                  "totalGlobalMem": 85_000_000_000}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world,
                            "pg_config": [{"pg_name": g, "pg_desc": f"mesh_{kind}",
                                           "ranks": list(range(world))}
                                          for kind, g in GROUPS.items()]},
        "traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": 0,
    }


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


#: One step of known composition (µs from the step's start; the host step is 1000 µs): a
#: copy in, GEMMs, attention, an all-reduce half under the elementwise kernels, the device
#: idle, the optimizer.
STEP = [("data_s", 10, 40), ("gemm_s", 50, 400), ("attention_s", 450, 150),
        ("elementwise_s", 600, 100), ("comm:dp", 650, 200), ("optimizer_s", 900, 80)]


#: The terms (s) the device reading must find in :data:`STEP`: each computing kernel's time,
#: the all-reduce's part outside them exposed and its part under them overlapped, and the
#: idle device as overhead: the step runs from its first host operator (the copy's, at
#: 5 µs) to the end of its last (the synchronisation's, at 999 µs), 920 µs of it busy.
EXPECTED = {"data_s": 40e-6, "gemm_s": 400e-6, "attention_s": 150e-6, "elementwise_s": 100e-6,
            "dp_comm_exposed_s": 150e-6, "dp_comm_overlapped_s": 50e-6, "optimizer_s": 80e-6,
            "overhead_s": (999 - 5 - 920) * 1e-6}


def host_trace(rank: int, world: int, steps: list[list[tuple]], step_us: float,
               gap_us: float = 100.0) -> dict:
    """A CPU (gloo) Kineto trace: each step a list of ``(name, start_us, dur_us, thread)``
    events, ``thread`` ``main`` (the host's operators and scopes, nested by time) or
    ``gloo`` (a collective's lifetime on gloo's worker thread, as gloo records it)."""
    events, pid = [], 200 + rank
    t = 2_000_000.0
    for k, evs in enumerate(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}",
                       "pid": pid, "tid": 1, "ts": t, "dur": step_us, "args": {}})
        for name, start, dur, thread in evs:
            events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": pid,
                           "tid": 1 if thread == "main" else 7, "ts": t + start, "dur": dur,
                           "args": {}})
        t += step_us + gap_us
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank,
                                                    "world_size": world},
            "traceEvents": events}


def dp_step(wait_us: float, late_us: float = 0.0) -> list[tuple]:
    """A data-parallel step on the host: forward and backward (GEMMs, a GELU, attention,
    autograd's wrapper and node), the gradient all-reduce launched inside the backward's last
    node (its lifetime from 258 µs, 22 µs of it under the backward) and waited for
    ``20 + wait_us`` µs with no operator running (DDP's wait records none), then the
    optimizer. ``late_us``: a GEMM of that length after the attention delays everything
    after it (a late rank: its all-reduce ends with its peers' when ``wait_us`` is theirs
    less ``late_us``)."""
    d = late_us
    end = 300 + wait_us + d
    extra = [("aten::mm", 200, d, "main")] if d else []
    return [("scalestudy::data", 0, 10, "main"), ("aten::to", 1, 2, "main"),
            ("scalestudy::forward_backward", 10, end - 10, "main"),
            ("aten::mm", 10, 100, "main"), ("aten::gelu", 110, 40, "main"),
            ("aten::_scaled_dot_product_flash_attention_for_cpu", 150, 50, "main"), *extra,
            ("autograd::engine::evaluate_function: AddmmBackward0", 200 + d, 80, "main"),
            ("AddmmBackward0", 201 + d, 78, "main"), ("aten::mm", 202 + d, 48, "main"),
            ("c10d::allreduce_", 255 + d, 3, "main"),
            ("gloo:all_reduce", 258 + d, end - 258 - d, "gloo"),
            ("Optimizer.step#AdamW.step", end, 60, "main"),
            ("aten::_foreach_add_", end + 5, 50, "main")]


#: The environment variable that slows a rank inside its forward (:func:`slow_forward_hook`):
#: ``rank=R:mm=K``, K extra 128x128 matrix products at the start of every MLP's forward.
SLOW_FORWARD_ENV = "SCALESTUDY_TEST_SLOW_FORWARD"
#: What a test puts in ``SCALESTUDY_STEP_HOOK`` to enable it.
SLOW_FORWARD_HOOK = "synthetic_trace:slow_forward_hook"


def slow_forward_hook(point, rank: int):
    """A step-hook factory (``scalestudy.train.hooks``) that slows one rank *inside* its
    forward: on the rank of :data:`SLOW_FORWARD_ENV`, every MLP forward of the built-in GPT
    first runs K extra matrix products on tensors of its own (real work, on no other rank's
    data: any layout). No per-step hook (None)."""
    import os

    import torch

    from scalestudy.models import gpt

    spec = dict(p.split("=") for p in os.environ.get(SLOW_FORWARD_ENV, "").split(":") if p)
    if not spec or int(spec["rank"]) != rank:
        return None
    a, k, plain = torch.randn(128, 128), int(spec["mm"]), gpt.MLP.forward

    def slowed(self, x):
        y = a
        for _ in range(k):
            y = torch.mm(y, a).div_(128.0)
        return plain(self, x)

    gpt.MLP.forward = slowed
    return None
