"""The parts of the GPU check (``benchmarks/gpu_check.py``: the schedule, the shapes, the
watchdogs), each run in its own process:

    python -m benchmarks.gpu_parts PART --out OUT --work WORK [--smoke]

A part saves its record after every point it finishes (``Ctx.save``: ``WORK/parts/PART.json``,
then ``OUT/callN.json`` rewritten), so a watchdog's kill keeps what it finished; its run
folders stay under ``WORK``.

Every measuring part runs real points through the pipeline's runner (``point.json`` ->
``scalestudy.run.runner`` -> torchrun -> the built-in trainer), so each figure is what a
study's point records; ``smoke`` runs the same logic on the CPU (gloo, fp32, tiny models).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

from benchmarks import gloo_cuda
from benchmarks.gpu_check import CALLS, HOLD_ENV, OUT_LIMITS, blank, call_of, now, out_names, publish

#: The pipeline's modules a device image may lack (DESIGN: no snakemake, no jsonschema there).
NEEDED = ("snakemake", "jsonschema", "pandas", "yaml", "seaborn", "optuna", "pyarrow",
          "pynvml", "hta")
#: Loss tolerance of a layout against the one-rank run (nats): bf16 on a GPU, fp32 on the CPU.
#: bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3): a loss of ~5.5 nats computed
#: from bf16 activations moves by ~1e-2 when the reduction order changes, and 6 steps of AdamW
#: at lr 3e-4 carry such differences forward; 2e-2 holds that with no room for a wrong
#: gradient (one skipped all-reduce shifts the loss by more after 2 steps). fp32: reduction
#: order only (1e-5 measured on gloo), with margin.
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-4}
#: The models of the parts besides the trainer's 1.1B: a device-sized one, a CPU-sized one.
MODELS = {
    False: {"small": {"layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024, "vocab": 32000},
            "medium": {"layers": 12, "hidden": 2048, "heads": 16, "seq_len": 1024,
                       "vocab": 32000}},
    True: {"small": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 256},
           "medium": {"layers": 2, "hidden": 96, "heads": 4, "seq_len": 64, "vocab": 256}},
}


class Ctx:
    """What a part knows: its work folder (``out``: run folders), the folder that comes back
    (``ret``), smoke or not, the device and precision."""

    def __init__(self, part: str, work: Path, ret: Path, smoke: bool):
        self.part, self.out, self.ret, self.smoke = part, work, ret, smoke
        self.call, self.started, self.t0 = call_of(part), now(), time.monotonic()
        self.device = "cpu" if smoke else "cuda"
        self.precision = "fp32" if smoke else "bf16"
        self.points = 0

    def record(self, state: str, reason: str, got: dict) -> dict:
        rec = blank(self.part, self.smoke, state, reason, self.started,
                    time.monotonic() - self.t0)
        rec.update(got, points_done=self.points)
        return rec

    def save(self, partial: dict, points: int | None = None) -> None:
        """After a finished point: the part's record so far (``running``) to the work folder
        and into ``OUT/callN.json``."""
        from scalestudy.record.io import write_json

        self.points = self.points + 1 if points is None else points
        write_json(self.out / "parts" / f"{self.part}.json",
                   self.record("running", "", partial))
        publish(self.ret, self.out, self.call)
        if f"{self.part}:{self.points}" in os.environ.get(HOLD_ENV, "").split(","):
            time.sleep(3600)  # the rehearsal's kill comes here (gpu_check.HOLD_ENV)

    def put(self, src: Path, role: str) -> str | None:
        """Copy ``src`` to ``OUT`` under the call's name for ``role`` when it fits the device's
        16 MiB a file; the name, or why not."""
        name = out_names(self.call)[role]
        size = Path(src).stat().st_size
        if size > OUT_LIMITS["file_bytes"]:
            return f"not returned: {size} bytes, more than 16 MiB"
        tmp = self.ret / f".{name}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, self.ret / name)
        return name

    def model(self, name: str):
        from scalestudy.config.parts import Model

        return Model(name=name, **MODELS[self.smoke][name])


def _run(point, run_dir: Path, env: dict | None = None) -> dict:
    """``point`` through the runner into ``run_dir`` (``env`` added to the launch's); the
    status, summary and point of its record."""
    from scalestudy.record.io import write_text
    from scalestudy.run import runner

    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "point.json", point.json_text())
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        status = runner.run_point(run_dir / "point.json", run_dir)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    summary = _load(run_dir / "summary.json")
    return {"status": status, "summary": summary, "run_dir": str(run_dir)}


def _load(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _point(ctx: Ctx, model, series: str, **layout):
    from scalestudy.config.point import Point
    from scalestudy.config.identity import identify

    kw = {"steps": 6, "warmup_steps": 2, "precision": ctx.precision, "device": ctx.device,
          "devices_per_node": 8, "timeout_s": 240, "collective_timeout_s": 120, "lr": 3e-4,
          "study": "gpu-check", "series": series, "mode": "strong", **layout}
    return identify(Point.for_layout(model, **kw))


# --- 0. probe --------------------------------------------------------------------------------


def probe(ctx: Ctx) -> dict:
    import torch

    smi = shutil.which("nvidia-smi")
    text = (subprocess.run([smi], capture_output=True, text=True, timeout=20).stdout
            if smi else "")
    driver = (subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
              if smi else None)
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    # installed by scripts/gpu_check.sh before the call's clock, into a folder of its own
    carried = {"site": os.environ.get("GPU_SITE"), "names": os.environ.get("GPU_CARRIED"),
               "install": os.environ.get("GPU_CARRIED_STATE")}
    pip = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True, timeout=60).stdout.splitlines()
    cuda = torch.cuda.is_available()
    devices = [{"name": torch.cuda.get_device_name(i),
                "total_bytes": torch.cuda.get_device_properties(i).total_memory}
               for i in range(torch.cuda.device_count())] if cuda else []
    ok = cuda or ctx.smoke
    return {"state": "ok" if ok else "failed",
            "reason": "" if ok else "no CUDA device visible to torch",
            "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "cuda_available": cuda, "devices": devices,
            "driver": driver, "nvidia_smi": text.splitlines()[:20],
            "disk_free_gb": shutil.disk_usage(ctx.out).free / 1e9,
            "modules": {m: importlib.util.find_spec(m) is not None for m in NEEDED},
            "missing": missing, "carried": carried, "pip_list": pip[:400]}


# --- 1. trainer ------------------------------------------------------------------------------


def top_activity(trace_path: Path, n: int = 10) -> list[dict]:
    """The ``n`` device kernels (``aten::`` operators on a CPU trace, nested ones counted in
    their parents too) with the most time in a trace, with their share of the traced steps."""
    from scalestudy.record.trace import read_trace

    tr = read_trace(trace_path)
    events = tr.gpu or [e for e in tr.host if e.tid == tr.main_tid and e.name.startswith("aten::")]
    total: dict = {}
    for e in events:
        total[e.name] = total.get(e.name, 0.0) + e.dur
    span = sum(s.dur for s in tr.steps)
    return [{"name": k[:120], "seconds": v, "share_of_steps": v / span if span else None}
            for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:n]]


def trainer(ctx: Ctx, budget: float) -> dict:
    from benchmarks import gpu
    from scalestudy.config.parts import Profile
    from scalestudy.config.identity import identify

    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # each point's watchdog: what is left of the part's share (a cold compile on a loaded
    # CPU takes minutes), the profiled step after them
    rec = gpu.measure(ctx.out / "trainer", smoke=ctx.smoke, budget_s=budget * 0.8,
                      timeout_s=budget * 0.8,
                      configs=["eager", "compile"] if ctx.smoke else None,
                      on_point=lambda r: ctx.save({"records": r["records"],
                                                   "calibration": r["calibration"]}))
    ok = [r for r in rec["records"] if r["state"] == "ok"]
    mfus = [r["mfu"] for r in ok if r["mfu"] is not None]
    below = (max(mfus) < gpu.TARGET_MFU) if mfus else None
    profile = None
    if ok and (below or ctx.smoke):  # the best configuration (smoke: eager), one step traced
        best = (next(r for r in ok if r["config"] == "eager") if ctx.smoke and
                any(r["config"] == "eager" for r in ok) else
                max(ok, key=lambda r: r["tokens_per_s"] or 0))
        run_dir = ctx.out / "trainer" / "runs" / gpu.run_dir_name(best["config"])
        point = json.loads((run_dir / "point.json").read_text())
        from scalestudy.config.point import Point

        p = Point.from_json(point)
        p = identify(p.replace(profile=Profile(enabled=True, steps=1, warmup=1),
                               config_hash="", point_id=""))
        run = _run(p, ctx.out / "trainer" / "runs" / "profiled")
        brk = _load(Path(run["run_dir"]) / "breakdown.json")
        trace = Path(run["run_dir"]) / "traces" / "rank0.json.gz"
        profile = {"trace_file": ctx.put(trace, "trace") if trace.exists() else None,"config": best["config"], "breakdown_state": brk.get("state"),
                   "top": top_activity(trace) if trace.exists() else [],
                   "device_idle_or_host_s": (brk.get("terms") or {}).get("overhead_s"),
                   "unattributed_s": (brk.get("terms") or {}).get("unattributed_s"),
                   "step_s": brk.get("step_s")}
    bad = [f"{r['config']}: {r['state']} {r['reason']}".strip() for r in rec["records"]
           if r["state"] not in ("ok", "skipped")]  # skipped: the budget ran out first
    state = "ok" if ok and not bad else "failed"
    return {"state": state, "reason": "; ".join(bad) or ("" if ok else "no configuration ran"),
            "records": rec["records"], "calibration": rec["calibration"],
            "target_mfu": gpu.TARGET_MFU, "below_target": below, "profile": profile,
            "compile_cache": {"dir": cache, "files": sum(1 for p in Path(cache).rglob("*")
                                                         if p.is_file()) if cache else None}}


# --- 2. layouts ------------------------------------------------------------------------------

#: name -> (N, study series keys): each layout trains the reference's global batch of 8
#: sequences (micro-batch x accumulation x dp), the same data and seed.
LAYOUTS = {
    "n1": (1, {"micro_batch": 8}), "ddp2": (2, {"micro_batch": 4}),
    "fsdp2": (2, {"micro_batch": 4, "dp_mode": "fsdp"}), "tp2": (2, {"micro_batch": 8, "tp": 2}),
    "pp2": (2, {"micro_batch": 2, "pp": 2}), "dp2xtp2": (4, {"micro_batch": 4, "tp": 2}),
    "pp2xdp2xtp2": (8, {"micro_batch": 2, "tp": 2, "pp": 2}),
}
#: the layouts of the CPU smoke run: the one-rank reference and a 2-D one (DDP over TP), the
#: part's logic whatever the layout; every layout's own parity on the CPU is
#: tests/integration/test_parallel_parity.py's
SMOKE_LAYOUTS = ("n1", "dp2xtp2")
#: runs.csv columns a GPU run fills (a CPU run has no spec peak and maybe no energy counter)
GPU_COLUMNS = ("step_time_median_s", "tokens_per_s", "mfu", "hfu", "peak_memory_gb",
               "joules_per_token")
CPU_COLUMNS = ("step_time_median_s", "tokens_per_s", "peak_memory_gb")


def layouts(ctx: Ctx) -> dict:
    from scalestudy.analysis.aggregate import collect
    from scalestudy.config.study import validate
    from scalestudy.plan.planner import plan_points, write_plan

    # which collectives gloo runs on this device's tensors, tried on two ranks (the smoke
    # run: CPU tensors); where the probe itself fails, the table read in the sources
    try:
        probe_ops = gloo_cuda.run(ctx.out / "gloo_cuda.json", ctx.device)["ops"]
        taken = frozenset(op for op, r in probe_ops.items() if r == "ok")
    except Exception as e:  # noqa: BLE001 - a crashed probe: say so, use the table
        probe_ops, taken = {"probe": f"{type(e).__name__}: {str(e)[:200]}"}, gloo_cuda.GLOO_CUDA
    names, left_out = ((list(SMOKE_LAYOUTS), {}) if ctx.smoke else
                       gloo_cuda.gpu_layouts({n: LAYOUTS[n][0] for n in LAYOUTS}, taken))
    doc = {"name": "layouts", "models": {"m": MODELS[ctx.smoke]["small"]},
           "train": {"steps": 6, "warmup_steps": 2, "precision": ctx.precision, "lr": 3e-4},
           "platform": {"device": ctx.device, "devices_per_node": 8, "timeout_s": 240},
           "series": [{"name": n, "mode": "strong", "model": "m", "gpus": [LAYOUTS[n][0]],
                       "global_batch": 8, **LAYOUTS[n][1]} for n in names]}
    study = validate(doc)
    points = plan_points(study)
    study_dir = ctx.out / "layouts" / study.name
    write_plan(points, study_dir, study)
    backend = "gloo" if ctx.smoke else "gloo with CUDA tensors (nccl at N=1)"
    tol = TOLERANCE[ctx.precision]
    losses: dict = {}
    fixed = {"backend": backend, "tolerance": {"loss_abs": tol, "precision": ctx.precision},
             "reference": "n1", "left_out": left_out, "gloo_cuda": probe_ops}
    for p in points:
        env = {} if (ctx.smoke or p.n == 1) else {"SCALESTUDY_DIST_BACKEND": "gloo"}
        run = _run(p, study_dir / "runs" / p.point_id, env)
        steps_file = Path(run["run_dir"]) / "steps.jsonl"
        steps = ([json.loads(x) for x in steps_file.read_text().splitlines()]
                 if steps_file.exists() else [])
        losses[p.series] = {"state": str(run["status"]["state"]),
                            "reason": run["status"]["reason"], "n": p.n,
                            "losses": [s["loss"] for s in steps]}
        _parity(losses, tol)
        ctx.save({**fixed, "layouts": losses})
    runs, _, _ = collect(study_dir)  # runs.csv's rows (no parquet writer needed here)
    cols = CPU_COLUMNS if ctx.smoke else GPU_COLUMNS
    ok = runs[runs["status"] == "ok"]
    gaps = {c: ok.loc[ok[c].isna(), "series"].tolist() for c in cols if ok[c].isna().any()}
    bad = [n for n, r in losses.items() if not r.get("within", False)]
    return {"state": "ok" if not bad and not gaps else "failed",
            "reason": "; ".join(f"{n}: {losses[n]['state']} {losses[n]['reason']}".strip()
                                for n in bad) + ("; columns empty: " + str(gaps) if gaps else ""),
            **fixed, "layouts": losses, "columns_missing": gaps,
            "pipeline": "runner (point.json -> scalestudy.run.runner -> torchrun; no "
                        "Snakemake), runs.csv's rows by analysis.aggregate.collect"}


def _parity(losses: dict, tol: float) -> None:
    """Each layout's largest loss difference against ``n1`` (when both ran alike)."""
    ref = (losses.get("n1") or {}).get("losses")
    for rec in losses.values():
        if rec["losses"] and ref and len(rec["losses"]) == len(ref):
            rec["max_loss_diff"] = max(abs(a - b) for a, b in zip(rec["losses"], ref))
            rec["within"] = rec["max_loss_diff"] <= tol


# --- 3. memory -------------------------------------------------------------------------------


def memory_points(ctx: Ctx) -> list:
    """Single-device points: two models x micro-batch x seq x checkpointing x precision (12
    on a GPU; the smoke run's first two)."""
    combos = [(2, 1, "none", "bf16"), (2, 1, "full", "bf16"), (2, 1, "selective", "bf16"),
              (4, 2, "none", "bf16"), (2, 1, "none", "fp32"), (1, 1, "full", "fp32")]
    out = []
    for mb, div, ac, prec in combos:  # both models per combination: a cut part has both
        for name in ("small", "medium"):
            import dataclasses

            base = ctx.model(name)
            m = dataclasses.replace(base, seq_len=base.seq_len // div)
            prec = "fp32" if ctx.smoke else prec  # (bf16 matmul crawls on most CPUs)
            out.append(_point(ctx, m, f"mem-{name}-mb{mb}-s{m.seq_len}-{ac}-{prec}",
                              micro_batch=mb, activation_checkpointing=ac, precision=prec,
                              steps=3, warmup_steps=1))
    return out[:2] if ctx.smoke else out


def memory(ctx: Ctx) -> dict:
    from scalestudy.config import devices
    from scalestudy.perf.memory import estimate
    from scalestudy.plan.constraints import MEMORY_HEADROOM

    rows = []
    for p in memory_points(ctx):
        run = _run(p, ctx.out / "memory" / "runs" / p.series)
        s = run["summary"]
        meas, reserved = s.get("peak_memory_bytes"), s.get("peak_memory_reserved_bytes")
        est = estimate(p)["total_bytes"]
        rows.append({"series": p.series, "state": str(run["status"]["state"]),
                     "estimate_bytes": est, "measured_bytes": meas,
                     "memory_kind": s.get("memory_kind"),
                     "estimate_over_measured": est / meas if meas else None,
                     "reserved_over_allocated": reserved / meas if (reserved and meas) else None,
                     "step_time_median_s": s.get("step_time_median_s")})
        ctx.save({"points": rows})
    ratios = [r["estimate_over_measured"] for r in rows if r["estimate_over_measured"]]
    reserved = [r["reserved_over_allocated"] for r in rows if r["reserved_over_allocated"]]
    capacity = None
    if not ctx.smoke:
        import torch

        free, total = torch.cuda.mem_get_info()
        key = devices.device_key(torch.cuda.get_device_name(0))
        stated = (devices.devices().get(key) or {}).get("memory_gb") if key else None
        capacity = {"device": torch.cuda.get_device_name(0), "preset": key,
                    "preset_gb": stated, "measured_bytes": total, "measured_gb": total / 1e9,
                    "measured_gib": total / 2**30,
                    "preset_over_measured_gb": stated / (total / 1e9) if stated else None}
    within = [0.9 <= r <= 1.1 for r in ratios]
    return {"state": "ok" if rows and all(r["state"] == "ok" for r in rows) else "failed",
            "reason": "" if ratios else "no point measured", "points": rows,
            "within": {"goal": [0.9, 1.1], "points": len(within), "within": sum(within)},
            "reserved_over_allocated": max(reserved) if reserved else None,
            "headroom": {"planner": MEMORY_HEADROOM,
                         "allocated_fits_in_reserved_at": 1 / max(reserved) if reserved else None},
            "capacity": capacity}


# --- 4. step model ---------------------------------------------------------------------------


def _measured_runs(out: Path) -> list[Path]:
    """This call's finished single-device points, unprofiled (a profiler's cost is no part of
    the step the model predicts), under the work folder ``out``."""
    runs = []
    for summary in sorted(out.rglob("runs/*/summary.json")):
        point = _load(summary.parent / "point.json")
        if point.get("n") == 1 and not (point.get("profile") or {}).get("enabled"):
            runs.append(summary.parent)
    return runs


def stepmodel(ctx: Ctx) -> dict:
    from scalestudy.config.point import Point
    from scalestudy.perf.hardware import HardwareSpec
    from scalestudy.perf.inputs import CPU_PRESET, system_of
    from scalestudy.perf.rates import Measured
    from scalestudy.perf.stepmodel import predict_step_time

    cal = ctx.out / "stepmodel" / "calibration.json"
    cal.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "scalestudy", "calibrate", "--device", ctx.device,
            "--dtype", ctx.precision, "--out", str(cal)]
    argv += ["--size", "256", "--samples", "5", "--max-seconds", "1", "--threads", "1"] \
        if ctx.smoke else []
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120)
    measured = Measured.from_calibration(cal)
    rows = []
    for run_dir in _measured_runs(ctx.out):
        s = _load(run_dir / "summary.json")
        if not s.get("step_time_median_s"):
            continue
        p = Point.from_json(_load(run_dir / "point.json"))
        hw = HardwareSpec.load(CPU_PRESET if ctx.smoke else system_of(s.get("device_name")))
        t = s["step_time_median_s"]
        rows.append({"run": run_dir.name, "measured_s": t,
                     "predicted_s": predict_step_time(p, hw, measured).step_time_s,
                     "predicted_preset_s": predict_step_time(p, hw).step_time_s})
    for r in rows:
        r["ratio"], r["ratio_preset"] = (r["predicted_s"] / r["measured_s"],
                                         r["predicted_preset_s"] / r["measured_s"])
    ctx.points = len(rows)
    med = statistics.median(r["ratio"] for r in rows) if rows else None
    return {"state": "ok" if rows else "failed",
            "reason": "" if rows else "no measured single-device point in this call",
            "calibration": _load(cal), "points": rows, "median_ratio": med,
            "median_ratio_preset": (statistics.median(r["ratio_preset"] for r in rows)
                                    if rows else None), "goal": [0.9, 1.1]}


# --- 5. energy -------------------------------------------------------------------------------


class PowerSampler:
    """``nvidia-smi``'s power draw (W) every 100 ms in a thread, with the time of each."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        smi = shutil.which("nvidia-smi")
        if smi:
            self.proc = subprocess.Popen([smi, "--query-gpu=power.draw",
                                          "--format=csv,noheader,nounits", "-lms", "100"],
                                         stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.split(",")[0])))
            except ValueError:
                continue

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def energy(ctx: Ctx) -> dict:
    p = _point(ctx, ctx.model("small"), "energy", micro_batch=4, steps=30 if not ctx.smoke else 6,
               warmup_steps=5 if not ctx.smoke else 2)
    sampler, t0 = PowerSampler(), time.monotonic()
    run = _run(p, ctx.out / "energy" / "runs" / "energy")
    t1 = time.monotonic()
    sampler.stop()
    e = run["summary"].get("energy") or {}
    nvml = {k: e.get(k) for k in ("source", "joules_per_token", "avg_power_w", "reason",
                                  "note", "counted_ranks")}
    smi = None
    if sampler.samples:  # the middle 60% of the run: its steady steps, not start-up
        lo, hi = t0 + 0.2 * (t1 - t0), t0 + 0.8 * (t1 - t0)
        mid = [w for t, w in sampler.samples if lo <= t <= hi]
        step = run["summary"].get("step_time_median_s")
        if mid and step:
            power = statistics.mean(mid)
            smi = {"avg_power_w": power, "samples": len(mid),
                   "joules_per_token": power * step / p.tokens_per_step}
    ctx.points = 1
    ratio = (nvml["joules_per_token"] / smi["joules_per_token"]
             if smi and nvml.get("joules_per_token") else None)
    ok = str(run["status"]["state"]) == "ok"
    return {"state": "ok" if ok else "failed",
            "reason": "" if (ok and ratio) else (run["status"]["reason"] if not ok else
                                                "not both counters read: " + str(
                                                    nvml.get("reason") or "no nvidia-smi")),
            "nvml": nvml, "smi": smi, "ratio": ratio}


# --- 6. trace --------------------------------------------------------------------------------


#: The trace's terms each layout dimension brings (``StepBreakdown``'s names): a trace of a
#: layout without it has nothing of them to show.
TERMS_OF = {"dp": ("dp_comm_exposed_s", "sync_wait_s"), "tp": ("tp_comm_s",),
            "pp": ("pp_p2p_s", "pp_bubble_s"), "cp": ("cp_comm_s",)}


def terms_not_shown(dp: int, tp: int, pp: int, cp: int, gpus: int) -> dict:
    """The terms a trace of this layout cannot show, and why: a dimension of 1 issues none of
    its collectives; ranks sharing fewer GPUs than they are run gloo (host-staged copies), so
    their communication is not the NCCL kernels a cluster's trace shows."""
    out = {}
    for dim, size in (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp)):
        for term in TERMS_OF[dim]:
            if size == 1:
                out[term] = f"{dim} = 1: no {dim} collective, no peer to wait for"
            elif gpus < dp * tp * pp * cp:
                out[term] = (f"{dp * tp * pp * cp} ranks on {gpus} device(s): gloo through "
                             "host memory, not NCCL kernels")
    return out


def trace(ctx: Ctx) -> dict:
    from scalestudy.config.parts import Profile

    n = 2 if ctx.smoke else 1  # the device has one GPU: one rank on NCCL
    p = _point(ctx, ctx.model("small"), "trace", dp=n, micro_batch=4,
               profile=Profile(enabled=True, steps=2, warmup=1))
    run = _run(p, ctx.out / "trace" / "runs" / "trace")
    ctx.points = 1
    brk = _load(Path(run["run_dir"]) / "breakdown.json")
    t = run["summary"].get("step_time_median_s")
    trace_path = Path(run["run_dir"]) / "traces" / "rank0.json.gz"
    ok = brk.get("state") == "ok"
    gpus = n if ctx.smoke else 1  # the smoke run's CPU ranks each stand for a device
    return {"state": "ok" if ok else "failed", "reason": brk.get("reason") or "",
            "run": run["run_dir"], "terms": brk.get("terms"), "step_time_s": t,
            "traced_step_s": brk.get("step_s"),
            "unattributed_s": (brk.get("terms") or {}).get("unattributed_s"),
            "hta": brk.get("hta"), "not_shown": terms_not_shown(p.dp, p.tp, p.pp, p.cp, gpus),
            "trace_file": ctx.put(trace_path, "trace") if trace_path.exists() else None}


PARTS = {"probe": probe, "trainer": trainer, "layouts": layouts, "memory": memory,
         "stepmodel": stepmodel, "energy": energy, "trace": trace}


def main(argv: list[str] | None = None) -> int:
    from scalestudy.record.io import write_json

    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_parts")
    ap.add_argument("part", choices=list(PARTS))
    ap.add_argument("--out", type=Path, required=True, help="the folder that comes back")
    ap.add_argument("--work", type=Path, required=True, help="run folders, logs, caches")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    ctx = Ctx(a.part, a.work, a.out, a.smoke)
    share = next(cpu if a.smoke else gpu for p, gpu, cpu in CALLS[ctx.call] if p == a.part)
    try:
        got = PARTS[a.part](ctx, share) if a.part == "trainer" else PARTS[a.part](ctx)
    except Exception as e:  # noqa: BLE001 - the part's failure is its record
        got = {"state": "failed", "reason": f"{type(e).__name__}: {str(e)[:300]}",
               "traceback": traceback.format_exc(limit=6).splitlines()}
    rec = ctx.record(got.pop("state"), got.pop("reason"), got)
    if a.part == "probe":
        rec["points_done"] = 1
    write_json(a.work / "parts" / f"{a.part}.json", rec)
    publish(a.out, a.work, ctx.call)
    return 0 if rec["state"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
