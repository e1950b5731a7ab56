"""``scalestudy calibrate``: the command line of :mod:`scalestudy.measure.calibrate`."""

from __future__ import annotations

import argparse

from scalestudy.config.vocab import TRAIN_PRECISIONS


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"MxNxK"`` -> ``(M, N, K)``."""
    try:
        m, n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: use MxNxK, e.g. 256x64x64") from None
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: sizes must be >= 1")
    return m, n, k


NAME = "calibrate"
SUMMARY = "measure this device's matmul ceiling (calibration.json)"
DESCRIPTION = ("Times a square matrix product (and the study's own shapes) on this device, the ceiling "
               "each point's utilisation is read against, and writes calibration.json.")
EXAMPLE = "scalestudy calibrate --device cpu --dtype fp32 --out calibration.json"


def add_arguments(p) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when a GPU is visible, else cpu (as the trainer decides)")
    p.add_argument("--dtype", choices=[d.value for d in TRAIN_PRECISIONS], default="fp32")
    p.add_argument("--out", required=True, help="calibration.json to write (atomically)")
    p.add_argument("--size", type=int, default=None, help="matrix size N (default: 512 cpu, 8192 cuda)")
    p.add_argument("--samples", type=int, default=15)
    p.add_argument("--max-seconds", type=float, default=5.0)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: one training process's, OMP_NUM_THREADS when "
                        "set, else its share of this host: run.launch.threads_per_process)")
    p.add_argument("--devices-per-node", type=int, default=1,
                   help="the study's devices per node: a CPU host's cores are shared among "
                        "that many processes (default 1)")
    p.add_argument("--shapes", nargs="*", type=parse_shape, default=[],
                   help="also time these MxNxK products (the study's own)")
    p.add_argument("--overhead", nargs="*", choices=["plain", "tp"], default=[],
                   help="on a CPU, also measure the framework's per-step overhead of these "
                        "layouts (microbench overhead: plain tensors, DTensor for tp) and the "
                        "copy bandwidth")


def run(args) -> int:
    from scalestudy.measure.calibrate import measure, measure_shapes, process_threads
    from scalestudy.record.io import write_json
    from scalestudy.train.device import resolve_device_type

    device = resolve_device_type(args.device)
    threads = args.threads or process_threads(args.devices_per_node)
    rec = measure(device, args.dtype, args.size, args.samples, max_seconds=args.max_seconds,
                  threads=threads)
    rec["shapes"] = measure_shapes(device, args.dtype, args.shapes)
    if args.overhead and device == "cpu":  # (a GPU's asynchronous launches hide it)
        from scalestudy.measure.bandwidth import bench_bandwidth
        from scalestudy.measure.overhead import bench_overhead

        rec["overhead"] = bench_overhead(layouts=tuple(args.overhead))
        rec["bandwidth"] = bench_bandwidth(device="cpu")
    write_json(args.out, rec)
    print(f"{rec['device_name']} {args.dtype} {rec['m']}^3 matmul: {rec['flops_per_s'] / 1e12:.4g} TFLOP/s "
          f"(median of {len(rec['samples_flops_per_s'])}) -> {args.out}")
    return 0

