"""``scalestudy microbench``: the command line of :mod:`scalestudy.measure.microbench`."""

from __future__ import annotations

import json
import os

from scalestudy.measure.collectives import OPS

NAME = "microbench"
SUMMARY = "measure the model's building blocks on this machine"
DESCRIPTION = ("Matmul throughput, collective bandwidth (under torchrun), framework overhead, "
               "memory and step time against the model, each written as one tidy CSV; plot "
               "draws a matmul or collectives CSV.")
EXAMPLE = "scalestudy microbench matmul --out matmul.csv --sizes 256 512"


def add_arguments(ap) -> None:
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matmul", help="matmul throughput by shape and dtype")
    m.add_argument("--out", required=True)
    m.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024], help="square m=n=k")
    m.add_argument("--shapes", nargs="*", default=[], help="extra shapes as MxNxK")
    m.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    m.add_argument("--device", default="auto")
    m.add_argument("--samples", type=int, default=5)
    m.add_argument("--budget-s", type=float, default=25.0)
    c = sub.add_parser("collectives", help="collective bandwidth/latency (run under torchrun)")
    c.add_argument("--out", required=True)
    c.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 1048576, 8388608], help="bytes")
    c.add_argument("--group-sizes", type=int, nargs="*", default=None)
    c.add_argument("--ops", nargs="+", default=list(OPS))
    c.add_argument("--samples", type=int, default=15)
    c.add_argument("--budget-s", type=float, default=25.0)
    o = sub.add_parser("overhead", help="framework overhead per micro-batch and per layer")
    o.add_argument("--out", required=True)
    v = sub.add_parser("validate", help="predicted vs measured step time, one CPU process")
    v.add_argument("--out", required=True)
    r = sub.add_parser("memory", help="memory estimate vs measured peak on CPU")
    r.add_argument("--out", required=True)
    r.add_argument("--trainer", action="store_true",
                   help="also the trainer under ddp/zero1/fsdp at dp=2 (torchrun, minutes)")
    pl = sub.add_parser("plot", help="figure of a matmul or collectives CSV")
    pl.add_argument("kind", choices=["matmul", "collectives"])
    pl.add_argument("csv")
    pl.add_argument("--out", required=True)
    ch = sub.add_parser("_memory_child")
    ch.add_argument("spec")


def run(a) -> int:
    from scalestudy.measure.collectives import bench_collectives
    from scalestudy.measure.common import summarize, write_rows
    from scalestudy.measure.matmul import bench_matmul
    from scalestudy.measure.memory import bench_memory, bench_memory_trainer, memory_child
    from scalestudy.measure.microbench import square_shapes
    from scalestudy.measure.overhead import bench_overhead
    from scalestudy.measure.plots import plot
    from scalestudy.measure.validate import bench_validate

    if a.cmd == "matmul":
        shapes = square_shapes(a.sizes) + [tuple(int(x) for x in s.lower().split("x")) for s in a.shapes]
        rows = bench_matmul(shapes, a.dtypes, a.device, samples=a.samples, budget_s=a.budget_s)
        write_rows(a.out, rows)
        best = max((r["flops_per_s"] for r in rows), default=0.0)
        print(f"matmul: {len(rows)} rows, best {best / 1e9:.1f} GFLOP/s -> {a.out}")
    elif a.cmd == "collectives":
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        try:
            rows = bench_collectives(a.sizes, a.group_sizes, tuple(a.ops), samples=a.samples,
                                     budget_s=a.budget_s)
            if dist.get_rank() == 0:
                write_rows(a.out, rows)
                print(f"collectives: {len(rows)} rows -> {a.out}")
            dist.barrier()
        finally:
            dist.destroy_process_group()
    elif a.cmd == "overhead":
        rows = bench_overhead()
        write_rows(a.out, rows)
        for s in summarize(rows, ["layout", "phase", "layers"]):
            print(f"{s['layout']} {s['phase']} layers={s['layers']}: {s['seconds'] * 1e3:.2f} ms")
        from scalestudy.perf.rates import Measured

        fit = Measured.from_frames(overhead=rows, stat="best").overhead
        print("fit (fastest sample; a preset's overhead:):",
              ", ".join(f"{k}: {v * 1e3:.2f}e-3" for k, v in sorted(fit.items())))
    elif a.cmd == "validate":
        rows = bench_validate()
        write_rows(a.out, rows)
        for r in rows:
            print(f"{r['case']}: predicted {r['predicted_s'] * 1e3:.1f} ms (compute "
                  f"{r['compute_s'] * 1e3:.1f} of which attention {r['attention_s'] * 1e3:.1f}, "
                  f"elementwise {r['elementwise_s'] * 1e3:.1f}, overhead {r['overhead_s'] * 1e3:.1f}, optimizer "
                  f"{r['optimizer_s'] * 1e3:.1f}), measured {r['measured_s'] * 1e3:.1f} ms, "
                  f"error {r['rel_error']:+.1%}")
    elif a.cmd == "memory":
        rows = bench_memory() + (bench_memory_trainer() if a.trainer else [])
        write_rows(a.out, rows)
        for r in rows:
            print(f"{r['case']}: estimate {r['est_total_bytes'] / 2**20:.1f} MiB, measured "
                  f"{r['measured_bytes'] / 2**20:.1f} MiB, error {r['rel_error']:+.1%}")
    elif a.cmd == "plot":
        plot(a.kind, a.csv, a.out)
    elif a.cmd == "_memory_child":
        print(json.dumps(memory_child(json.loads(a.spec))))
    return 0
