"""A study folder written as the pipeline writes it, with known answers and no training:
ok, failed, infeasible and not-run points, two repeats (``make_study``). Shared by the
aggregate, plot, export and trust tests."""

import json
from pathlib import Path

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Platform, Train
from scalestudy.config.vocab import FlopsConvention
from scalestudy.config import flops
from scalestudy.plan.planner import write_plan
from scalestudy.record.io import write_json, write_text

MODEL = Model(name="tiny", vocab=256, seq_len=64, layers=2, hidden=64, heads=4, ffn_hidden=None,
              mlp="gelu", tied_embeddings=False, bias=True)
# steady-state multipliers with median exactly 1 (so the median step time is the base time)
NOISE = [1.0, 0.99, 1.01, 0.98, 1.02, 1.0, 0.97, 1.03]
CEILING = 5e10  # measured matmul ceiling, FLOP/s

# (series, mode, n, global_batch, base step time s, state per repeat (None = no status.json))
# weak: E = 1, 1, 0.8 then OOM at 8; strong: E = 1, 1, 0.8 and N=8 infeasible in the plan.
POINTS = [
    ("weak-dp", "weak", 1, 4, 0.10, ["ok", "ok"]),
    ("weak-dp", "weak", 2, 8, 0.10, ["ok", "ok"]),
    ("weak-dp", "weak", 4, 16, 0.125, ["ok", None]),
    ("weak-dp", "weak", 8, 32, 0.0, ["oom", "oom"]),
    ("strong-dp", "strong", 1, 16, 0.8, ["ok", "ok"]),
    ("strong-dp", "strong", 2, 16, 0.4, ["ok", "ok"]),
    ("strong-dp", "strong", 4, 16, 0.25, ["ok", "timeout"]),
    ("strong-dp", "strong", 8, 16, 0.0, ["infeasible", "infeasible"]),
]


def make_point(series: str, mode: str, n: int, gb: int, repeat: int, state: str | None,
               device: str = "cpu") -> Point:
    """The planned point of a row of POINTS: weak with micro_batch gb/n, strong with
    micro_batch 2 (grad_accum = gb/(2n)); id ``<series>_n<N>_dp<N>-tp1-pp1_gb<gb>_abcd<N>_r<r>``."""
    batch = {"micro_batch": gb // n, "grad_accum": 1} if mode == "weak" else \
        {"micro_batch": 2, "global_batch": gb}
    p = Point.build(MODEL, n=n, **batch, platform=Platform(device=device, hardware=None),
                    train=Train(steps=10, warmup_steps=2),
                    study="synth", series=series, mode=mode, baseline_n=1,
                    flops_convention="megatron", feasible=state != "infeasible",
                    reason="needs 9.9 GB per device > 8 GB" if state == "infeasible" else "",
                    mem_estimate_gb=0.01)
    return p.replace(config_hash=f"abcd{n:04d}", repeat=repeat,
                     point_id=f"{series}_n{n}_dp{n}-tp1-pp1_gb{gb}_abcd{n:04d}_r{repeat}")


def make_study(root: Path, references=("frontier_dash2024",), break_invariant=False,
               calibration=True, peak=None) -> Path:
    """Write plan.tsv, study.json, calibration.json and run dirs like the pipeline does.
    ``peak``: ``(key, FLOP/s, source)`` a GPU run would record (default: CPU, no peak)."""
    key, peak_flops, source = peak or (None, None, None)
    study_dir = root / "synth"
    plan = []
    for series, mode, n, gb, t, states in POINTS:
        if break_invariant and series == "strong-dp" and n == 4:
            gb = 32
        for r, state in enumerate(states):
            point = make_point(series, mode, n, gb, r, state, "cuda" if key else "cpu")
            assert point.global_batch == gb and point.n == n
            plan.append(point)
            if state == "infeasible":
                continue
            pid = point.point_id
            d = study_dir / "runs" / pid
            write_text(d / "point.json", point.json_text())
            if state is None:
                continue  # planned, never ran: no status.json
            status = {"state": state, "reason": "" if state == "ok" else f"{state} at step 3",
                      "evidence": [], "exit_code": 0 if state == "ok" else 1,
                      "started": "2026-01-01T00:00:00", "finished": "2026-01-01T00:00:09",
                      "wall_s": 9.0}
            write_json(d / "status.json", status)
            if state != "ok":
                continue
            steps = [t * 5, t * 3] + [t * m for m in NOISE]
            lines = [json.dumps({"step": i, "loss": 5.5 - 0.3 * i, "step_time_s": x,
                                 "warmup": i < 2, "tokens": gb * 64}) for i, x in enumerate(steps)]
            write_text(d / "steps.jsonl", "\n".join(lines) + "\n")
            write_json(d / "summary.json", {
                "point_id": pid, "n_params": flops.param_count(MODEL), "steps": 10,
                "warmup_steps": 2, "loss_first": 5.5, "loss_last": 2.8, "tokens_per_step": gb * 64,
                "step_time_median_s": t, "tokens_per_s": gb * 64 / t,
                "model_flops_per_step": {c: flops.model_flops_per_step(MODEL, gb, c)
                                         for c in FlopsConvention},
                "hardware_flops_per_step": {c: flops.hardware_flops_per_step(MODEL, gb, c)
                                            for c in FlopsConvention},
                "device_type": "cuda" if key else "cpu", "device_name": key or "AMD EPYC",
                "hardware": key, "dtype": "fp32",
                "peak_flops_per_device": peak_flops, "peak_source": source,
                "peak_memory_bytes": 3.4e8, "memory_kind": "cpu_max_rss", "train_wall_s": 2.0})
    write_plan(plan, study_dir)
    write_json(study_dir / "study.json", {"name": "synth", "flops_convention": "megatron",
                                          "references": list(references),
                                          "series": [{"name": "weak-dp"}, {"name": "strong-dp"}]})
    if calibration:
        write_json(study_dir / "calibration.json", {
            "device_name": "AMD EPYC", "device_type": "cpu", "host": "h", "dtype": "fp32",
            "m": 512, "n": 512, "k": 512, "flops_per_s": CEILING,
            "samples_flops_per_s": [CEILING] * 3})
    return study_dir
