"""The benchmarks behind ``make bench``: ``python -m benchmarks`` from the repository root
(``benchmarks/__main__.py``). Not part of the installed package; they import ``scalestudy``.

Each module measures one thing and returns a plain dict with a ``figures`` list: rows of
``{benchmark, figure, value, unit, target, op, met, note}`` (``op`` is how ``value`` compares
with ``target``: ``<=`` or ``>=``; ``met`` is None without a target). A target is reported,
never enforced: timings are not asserted in the tests.

- ``trainer`` -- the trainer's step time vs a bare PyTorch loop, side by side in one process.
- ``harness`` -- a real sweep of a study: wall time minus the training processes' own time.
- ``scale``   -- planning, aggregating and ``snakemake -n`` at 10,000 points.
- ``gpu``     -- MFU, tokens/s and peak memory of a ~1B GPT on one GPU (``--smoke``: tiny, CPU);
  ``gpu_check`` (``scripts/gpu_check.sh``) gathers it with every other GPU figure in one
  9-minute call, part by part (``gpu_parts``).
- ``predict`` -- the performance model against the study's measured step times: per-point
  predicted/measured ratios and their median (the study's ``predict`` job's output); from the
  same study's traces, what the profiler costs (``overhead``) and the model's predicted /
  measured term by term (``terms``: ``benchmarks/breakdown.py``).
- ``foreign`` -- the built-in trainer vs torchtitan (same Llama shape, batch, FSDP2, N):
  tokens/s ratio of alternating runs, its spread.
- ``tune``    -- the layout search (``scalestudy tune --measure``) against the measured grid:
  how often it finds the grid best within its 95% CI, vs random search and the model's pick.
"""

from __future__ import annotations


def figure(benchmark: str, name: str, value, unit: str, target=None, op: str | None = None,
           note: str = "") -> dict:
    """One row of ``figures.csv``. ``met`` compares ``value`` with ``target`` by ``op``."""
    met = None
    if target is not None and value is not None and op in ("<=", ">="):
        met = bool(value <= target) if op == "<=" else bool(value >= target)
    return {"benchmark": benchmark, "figure": name, "value": value, "unit": unit,
            "target": target, "op": op, "met": met, "note": note}
