"""The GPU check: every figure a GPU user relies on, gathered in one call of at most 9 minutes on
one H100/H200 (``scripts/gpu_check.sh``), each part in its own process under its own watchdog,
each finished part's JSON written to ``OUT/NN_<part>.json`` before the next starts (a cut run
keeps what it finished). ``--smoke`` runs every part's same logic on the CPU with tiny models
(the test suite runs it); ``--dry-run`` prints the schedule.

    python -m benchmarks.gpu_check --out OUT [--smoke] [--budget 540] [--parts probe,trainer]
    python -m benchmarks.gpu_check --dry-run

The parts, in order (``SCHEDULE``; ``benchmarks/gpu_parts.py`` holds them):

0. ``probe``: Python, torch, CUDA, driver, ``nvidia-smi``, ``pip list``, free disk, the
   modules the pipeline needs (installed from carried wheels when ``GPU_WHEELS`` names them);
1. ``trainer``: the ~1.1B GPT, seq 2048, bf16, eager/compiled × checkpointing none/full
   (``benchmarks/gpu.py``): tokens/s, MFU against the spec peak and the measured matmul
   ceiling, peak memory; below MFU 50%, one profiled step names the top kernels and the gaps;
2. ``layouts``: one point per layout through the pipeline's runner (N=1 on the device's
   backend; DDP, FSDP2, TP, PP at 2 ranks, DP×TP at 4, PP×DP×TP at 8 sharing the GPU over
   gloo with CUDA tensors): each one's losses against the one-rank losses, and every
   ``runs.csv`` column a GPU run fills;
3. ``memory``: single-device points (two model sizes × micro-batch × seq × checkpointing ×
   precision): the memory model's estimate against the allocator's peak, the reserved /
   allocated ratio, the presets' stated capacity against ``torch.cuda.mem_get_info``;
4. ``stepmodel``: the calibrate job on the device, then the step model on the device's preset
   with and without it against the measured step times of parts 1 and 3;
5. ``energy``: joules per token from NVML's energy counter against ``nvidia-smi``'s power
   draw sampled during the same run;
6. ``trace``: one profiled point read by the breakdown reader (HTA beside it where
   installed): its terms against the step time.

Every part's JSON has ``part``, ``state`` (ok, failed, timeout, skipped), ``reason``,
``device``, ``smoke``, ``started``, ``wall_s`` and the keys of ``SHAPES``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

#: (part, watchdog seconds on a GPU, watchdog seconds of the CPU smoke run): the time shares.
SCHEDULE = (("probe", 20, 60), ("trainer", 150, 150), ("layouts", 110, 150),
            ("memory", 90, 90), ("stepmodel", 60, 60), ("energy", 40, 60), ("trace", 50, 60))
#: The whole call's bound on one GPU (seconds): 9 minutes.
BUDGET_S = 540
#: Keys every part's JSON has.
COMMON = ("part", "state", "reason", "device", "smoke", "started", "wall_s")
#: Keys of each part's JSON beyond ``COMMON`` (the fixed shape a test checks).
SHAPES = {
    "probe": ("python", "torch", "cuda", "cuda_available", "devices", "driver", "nvidia_smi",
              "disk_free_gb", "modules", "missing", "installed_from_wheels", "pip_list"),
    "trainer": ("records", "calibration", "target_mfu", "below_target", "profile"),
    "layouts": ("backend", "tolerance", "reference", "layouts", "columns_missing", "pipeline"),
    "memory": ("points", "within", "reserved_over_allocated", "headroom", "capacity"),
    "stepmodel": ("calibration", "points", "median_ratio", "median_ratio_preset", "goal"),
    "energy": ("nvml", "smi", "ratio"),
    "trace": ("run", "terms", "step_time_s", "traced_step_s", "unattributed_s", "hta"),
}
STATES = ("ok", "failed", "timeout", "skipped")


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def part_file(out: Path, part: str) -> Path:
    index = [p for p, *_ in SCHEDULE].index(part)
    return out / f"{index:02d}_{part}.json"


def blank(part: str, smoke: bool, state: str, reason: str, started: str, wall: float) -> dict:
    """A part's record with every key of its shape (None where it knows nothing)."""
    return {"part": part, "state": state, "reason": reason,
            "device": "cpu" if smoke else "cuda", "smoke": smoke, "started": started,
            "wall_s": round(wall, 2), **dict.fromkeys(SHAPES[part])}


def shape_problem(rec: dict) -> str | None:
    """Why a part's record is not of its fixed shape, or None."""
    part = rec.get("part")
    if part not in SHAPES:
        return f"unknown part {part!r}"
    missing = [k for k in COMMON + SHAPES[part] if k not in rec]
    if missing:
        return f"{part}: missing {', '.join(missing)}"
    if rec["state"] not in STATES:
        return f"{part}: state {rec['state']!r} is not one of {', '.join(STATES)}"
    if not isinstance(rec["wall_s"], (int, float)) or rec["wall_s"] < 0:
        return f"{part}: wall_s {rec['wall_s']!r} is not seconds"
    return None


def schedule(smoke: bool, budget: float = BUDGET_S) -> list[tuple[str, float]]:
    """``[(part, watchdog seconds)]``; ``ValueError`` when the shares exceed ``budget``."""
    rows = [(p, float(cpu if smoke else gpu)) for p, gpu, cpu in SCHEDULE]
    total = sum(s for _, s in rows)
    if not smoke and total > budget:
        raise ValueError(f"the parts' watchdogs add up to {total:g} s, more than {budget:g} s")
    return rows


def _watched(argv: list[str], limit: float) -> tuple[str, str]:
    """Run a part in a session of its own under its watchdog: on timeout its process group is
    killed, and the launches it started in sessions of their own (torchrun, whose ranks die
    with it), orphaned back to this process (a subreaper: ``scalestudy.run.lifetime``), with
    it. ``(state, reason)`` if it writes no JSON of its own."""
    from scalestudy.run import lifetime

    lifetime.become_subreaper()
    keep = lifetime.children()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        lifetime.end_orphans(keep)
        return "timeout", f"over its watchdog of {limit:.0f} s"
    tail = (out or "").strip().splitlines()[-1:]
    return "failed", f"exit {proc.returncode}: {tail[0][:200] if tail else 'no output'}"


def run_all(out: Path, smoke: bool, budget: float = BUDGET_S, parts: list[str] | None = None,
            python: str = sys.executable) -> list[dict]:
    """Every part in order, each ``python -m benchmarks.gpu_parts PART`` under its watchdog
    (its share, at most what is left of ``budget``); a part that ends without its JSON gets
    one saying why (``timeout`` or ``failed``). Returns the records."""
    from scalestudy.record.io import write_json

    out.mkdir(parents=True, exist_ok=True)
    t0, records = time.monotonic(), []
    for part, share in schedule(smoke, budget if not smoke else float("inf")):
        if parts and part not in parts:
            continue
        path, started = part_file(out, part), now()
        path.unlink(missing_ok=True)
        left = budget - (time.monotonic() - t0)
        if left < 5:
            rec = blank(part, smoke, "skipped", f"the {budget:g} s budget is used up", started, 0)
            write_json(path, rec)
            records.append(rec)
            continue
        limit, t1 = min(share, left), time.monotonic()
        argv = [python, "-m", "benchmarks.gpu_parts", part, "--out", str(out), "--json",
                str(path)] + (["--smoke"] if smoke else [])
        state, why = _watched(argv, limit)
        rec = json.loads(path.read_text()) if path.exists() else None
        if rec is None:
            rec = blank(part, smoke, state, why, started, time.monotonic() - t1)
            write_json(path, rec)
        records.append(rec)
        print(f"gpu_check: {part}: {rec['state']} in {rec['wall_s']} s {rec['reason']}",
              flush=True)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("results/gpu-check"))
    ap.add_argument("--smoke", action="store_true", help="the same logic on the CPU, tiny")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="the whole call (s)")
    ap.add_argument("--parts", default=None, help="comma-separated parts (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print the schedule, run nothing")
    a = ap.parse_args(argv)
    if a.dry_run:
        rows = schedule(a.smoke)
        for part, s in rows:
            print(f"{part:<10} {s:5.0f} s")
        print(f"{'total':<10} {sum(s for _, s in rows):5.0f} s (budget {a.budget:g} s)")
        return 0
    recs = run_all(a.out, a.smoke, a.budget, a.parts.split(",") if a.parts else None)
    return 0 if all(r["state"] in ("ok", "skipped") for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
