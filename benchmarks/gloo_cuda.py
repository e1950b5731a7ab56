"""Which collectives gloo runs correctly on this device's tensors, tried once each on two
ranks sharing the device (what the GPU check's layouts part runs its multi-rank layouts on).

    python -m benchmarks.gloo_cuda OUT.json [--device cuda|cpu]

Each op is checked against its exact result (small integers in fp32: no rounding).
``send``/``recv`` are not tried on CUDA: gloo hands the tensor's raw pointer to its TCP
buffer, so a device address would be read as host memory (``ProcessGroupGloo::send``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

#: The ops tried (``_avg``: with ``ReduceOp.AVG``, as FSDP2 reduces).
OPS = ("all_reduce", "all_reduce_avg", "broadcast", "all_gather", "all_gather_into_tensor",
       "reduce_scatter_tensor", "reduce_scatter_tensor_avg", "all_to_all_single")
NOT_TRIED_ON_CUDA = {"send": "a raw device pointer to gloo's TCP buffer",
                     "recv": "a raw device pointer to gloo's TCP buffer"}


#: Collectives ``ProcessGroupGloo`` runs on CUDA tensors, each by copying them to pinned host
#: memory, running on the host and copying back (an ``Async*CUDAWork`` per op); read in
#: torch/csrc/distributed/c10d/ProcessGroupGloo.cpp, and the same classes are in torch
#: 2.11.0+cu130's libraries (all-reduce, all-gather, all-to-all, broadcast, gather, reduce,
#: scatter). ``reduce_scatter_tensor`` is an all-reduce of the whole input, then each
#: rank's chunk. Not taken: ``send``/``recv`` (the
#: tensor's raw pointer goes to gloo's TCP buffer: a device address) and
#: ``all_gather_into_tensor_coalesced`` (no CUDA work).
GLOO_CUDA = frozenset({"all_reduce", "all_reduce_avg", "broadcast", "all_gather",
                       "all_gather_into_tensor", "reduce_scatter_tensor",
                       "reduce_scatter_tensor_avg", "all_to_all_single", "gather", "scatter",
                       "reduce"})
#: What each layout's wrappers issue (DDP: a broadcast at wrap, bucketed all-reduces; FSDP2:
#: all-gather and reduce-scatter (averaging) into/from flat tensors; DDP with TP or PP is
#: FSDP2's ``replicate`` (an averaging all-reduce); TP's DTensor redistributions: all-reduce,
#: all-gather, reduce-scatter; PP: PipelineStage's P2P send/recv).
LAYOUT_NEEDS = {
    "n1": frozenset(), "ddp2": frozenset({"broadcast", "all_reduce"}),
    "fsdp2": frozenset({"all_gather_into_tensor", "reduce_scatter_tensor_avg", "all_reduce"}),
    "tp2": frozenset({"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"}),
    "pp2": frozenset({"send", "recv", "all_reduce"}),
    "dp2xtp2": frozenset({"all_reduce", "all_reduce_avg", "all_gather_into_tensor",
                          "reduce_scatter_tensor"}),
    "pp2xdp2xtp2": frozenset({"send", "recv", "all_reduce", "all_reduce_avg",
                              "all_gather_into_tensor", "reduce_scatter_tensor"}),
}


def gpu_layouts(ranks: dict[str, int], taken=GLOO_CUDA) -> tuple[list[str], dict]:
    """``(layouts to run with their ranks sharing one GPU over gloo, {left out: why})`` of
    ``ranks`` (layout -> its number of ranks): a layout runs when gloo takes CUDA tensors for
    every collective it issues; one rank needs none (it runs on NCCL)."""
    run, out = [], {}
    for name, n in ranks.items():
        lacking = sorted(LAYOUT_NEEDS[name] - taken) if n > 1 else []
        if lacking:
            out[name] = (f"gloo does not take CUDA tensors for {', '.join(lacking)} (a raw "
                         "device pointer handed to its TCP transport); on several GPUs NCCL "
                         "runs it")
        else:
            run.append(name)
    return run, out


def _try(op: str, rank: int, world: int, device) -> str:
    """``ok``, or why not (the exception, or the wrong value)."""
    import torch
    import torch.distributed as dist

    t = torch.full((world * 2,), float(rank + 1), device=device)
    want_sum = float(sum(range(1, world + 1)))
    try:
        if op in ("all_reduce", "all_reduce_avg"):
            dist.all_reduce(t, op=dist.ReduceOp.AVG if op.endswith("avg") else dist.ReduceOp.SUM)
            want = torch.full_like(t, want_sum / (world if op.endswith("avg") else 1))
            got = t
        elif op == "broadcast":
            dist.broadcast(t, src=0)
            got, want = t, torch.full_like(t, 1.0)
        elif op == "all_gather":
            outs = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(outs, t)
            got = torch.cat(outs)
            want = torch.cat([torch.full_like(t, float(r + 1)) for r in range(world)])
        elif op == "all_gather_into_tensor":
            got = torch.empty(world * t.numel(), device=device)
            dist.all_gather_into_tensor(got, t)
            want = torch.cat([torch.full_like(t, float(r + 1)) for r in range(world)])
        elif op.startswith("reduce_scatter_tensor"):
            got = torch.empty(2, device=device)
            avg = op.endswith("avg")
            dist.reduce_scatter_tensor(got, t, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM)
            want = torch.full_like(got, want_sum / (world if avg else 1))
        else:  # all_to_all_single: rank r sends its chunk j (value r+1) to rank j
            got = torch.empty_like(t)
            dist.all_to_all_single(got, t)
            want = torch.cat([torch.full((2,), float(r + 1), device=device) for r in range(world)])
        if device.type == "cuda":
            torch.cuda.synchronize()
        return "ok" if torch.equal(got.cpu(), want.cpu()) else \
            f"wrong result: {got.cpu().tolist()} (want {want.cpu().tolist()})"
    except Exception as e:  # noqa: BLE001 - the op's failure is the finding
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _worker(rank: int, world: int, init: str, device_type: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(0)
    found = {op: _try(op, rank, world, device) for op in OPS}
    dist.barrier()
    if rank == 0:
        tmp = Path(out).with_name("." + Path(out).name)
        tmp.write_text(json.dumps({"device": device_type, "torch": torch.__version__,
                                   "ops": found, "not_tried": NOT_TRIED_ON_CUDA
                                   if device_type == "cuda" else {}}, indent=1))
        os.replace(tmp, out)
    dist.destroy_process_group()


def run(out: Path, device_type: str, world: int = 2) -> dict:
    """The findings (``{"ops": {op: "ok" | why}, ...}``), also written to ``out``."""
    import tempfile

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        mp.spawn(_worker, args=(world, init, device_type, str(out)), nprocs=world, join=True)
    return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gloo_cuda")
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args(argv)
    found = run(a.out, a.device)
    print(json.dumps(found["ops"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
