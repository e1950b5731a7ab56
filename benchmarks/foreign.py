"""The built-in trainer against torchtitan (0.2.2, the ``foreign`` extra) on the same Llama
shape (torchtitan's llama3 ``debugmodel``), batch, FSDP2 and world size, on CPU processes
through tests/titan_cpu.py: tokens/s of each, from alternating runs (builtin, torchtitan,
torchtitan, builtin, ...: a drift of the host's load falls on both alike), each run a full
point through the runner (``scalestudy.run.runner.run_point``: torchrun, the record,
``summary.json``'s tokens/s over the steady steps). Target: the built-in trainer >= 0.95 of
torchtitan's tokens/s (the median of the per-pair ratios; its spread is the pairs' min-max)."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from benchmarks import figure

TARGET = 0.95


def study(tokenizer: Path, dataset: Path, *, n: int, seq_len: int, micro_batch: int,
          steps: int, warmup: int) -> dict:
    from tests.foreign_assets import DEBUGMODEL, titan_command

    common = {"mode": "weak", "model": "debug", "gpus": [n], "micro_batch": micro_batch,
              "dp_mode": "fsdp"}
    return {
        "name": "bench-foreign",
        "models": {"debug": {**DEBUGMODEL, "seq_len": seq_len}},
        "train": {"steps": steps, "warmup_steps": warmup, "precision": "fp32"},
        "platform": {"device": "cpu", "devices_per_node": n, "timeout_s": 900},
        "series": [
            {"name": "builtin", **common},
            {"name": "torchtitan", **common,
             "workload": {"command": titan_command(tokenizer, dataset), "metrics": "torchtitan"}},
        ],
    }


def measure(workdir: str | Path | None = None, *, pairs: int = 3, n: int = 2, seq_len: int = 128,
            micro_batch: int = 2, steps: int = 8, warmup: int = 2) -> dict:
    """``pairs`` alternating pairs of runs; returns the record with its figures."""
    from scalestudy.config.study import validate
    from scalestudy.plan.planner import plan_points
    from scalestudy.run.runner import run_point
    from tests.foreign_assets import write_assets

    workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-foreign-"))
    tokenizer, dataset = write_assets(workdir / "assets")
    doc = study(tokenizer, dataset, n=n, seq_len=seq_len, micro_batch=micro_batch, steps=steps,
                warmup=warmup)
    points = {p.series: p for p in plan_points(validate(doc))}
    runs: list[dict] = []
    for i in range(pairs):
        order = ("builtin", "torchtitan") if i % 2 == 0 else ("torchtitan", "builtin")
        for side in order:
            run_dir = workdir / "runs" / f"{side}_{i}"
            run_dir.mkdir(parents=True)
            (run_dir / "point.json").write_text(json.dumps(points[side].to_json()))
            status = run_point(run_dir / "point.json", run_dir)
            summary = {}
            if status["state"] == "ok":
                summary = json.loads((run_dir / "summary.json").read_text())
            runs.append({"pair": i, "side": side, "state": status["state"],
                         "reason": status.get("reason", ""),
                         "tokens_per_s": summary.get("tokens_per_s"),
                         "step_time_median_s": summary.get("step_time_median_s")})
    by = {(r["pair"], r["side"]): r["tokens_per_s"] for r in runs}
    ratios = [by[i, "builtin"] / by[i, "torchtitan"] for i in range(pairs)
              if by.get((i, "builtin")) and by.get((i, "torchtitan"))]
    ratio = statistics.median(ratios) if ratios else None
    tps = {side: [r["tokens_per_s"] for r in runs if r["side"] == side and r["tokens_per_s"]]
           for side in ("builtin", "torchtitan")}
    shape = (f"llama3 debugmodel (6 x 256, vocab 2048), seq {seq_len}, micro-batch {micro_batch}, "
             f"FSDP2, N={n}, fp32, {steps - warmup} steady steps")
    failed = [f"{r['side']}#{r['pair']}: {r['state']} {r['reason']}"[:160]
              for r in runs if r["state"] != "ok"]
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if ratios else "n/a"
    figures = [
        figure("foreign", "built-in trainer / torchtitan tokens/s (median of pairs)", ratio,
               "x", TARGET, ">=", f"{len(ratios)} alternating pairs, spread {spread}; {shape}"
               + (f"; failed: {'; '.join(failed)}" if failed else "")),
    ]
    for side, values in tps.items():
        figures.append(figure("foreign", f"  {side} tokens/s (median of runs)",
                              statistics.median(values) if values else None, "tokens/s",
                              note=f"runs: {', '.join(f'{v:.0f}' for v in values)}"))
    return {"workdir": str(workdir), "shape": shape, "runs": runs, "ratios": ratios,
            "ratio": ratio, "figures": figures}
