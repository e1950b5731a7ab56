"""The layout search against its ground truth (``python -m benchmarks tune``).

The study ``benchmarks/tune.yaml`` (a tiny GPT on 4 CPU processes, 33 feasible layouts) is
measured exhaustively once through the pipeline itself (``tune.measure.SnakemakeTrials``: the
rung studies, Snakemake, the runner, the records): every layout at full length with the
study's 3 repeats, and every layout at the first fidelity rung. Each layout's true rate is the
mean of its repeats' tokens/s per device with a 95% confidence interval (Student's t, n - 1
degrees of freedom); the grid best is the layout with the highest mean, and a search "finds
it" when the layout it returns has a mean inside the grid best's interval (at or above its
lower end).

Then each strategy runs with a budget of a third of the grid (``tune.trials``) over
:data:`SEEDS` seeds, replayed on those measurements: every evaluation the search asks for is
answered by one of that layout's measured runs at that fidelity, drawn at random (seeded), so
the search sees the run-to-run noise a live search sees, and the device-hours it spends are
those runs' own. The search code is the one ``scalestudy tune --measure`` runs
(``tune.search.build``), only its ``evaluate`` reads the grid instead of starting Snakemake.

- ``tpe``: the study's own settings: the model's 2 best predicted layouts first, then TPE,
  with successive halving from 4 steps (eta 3) to the full 12;
- ``tpe-cold``: the same without the warm start (what the search finds on its own);
- ``random``: Optuna's random sampler, no warm start, every trial at full length;
- ``model-only``: the layout the performance model ranks first, measured.

Figures: per strategy, in how many of the seeds the returned layout is within the grid best's
95% CI, the median ratio of its true rate to the grid best's, and the median device-hours
spent; beside them, the host's noise: the median and largest spread (slowest / fastest) of a
layout's repeats. No target: the figures say whether the search beat random search here, or
not.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

from benchmarks import figure

STUDY = Path(__file__).with_name("tune.yaml")
#: Seeds of every strategy's search.
SEEDS = (0, 1, 2, 3, 4)
#: Student's t at 97.5% for n - 1 degrees of freedom (a two-sided 95% interval).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean and its two-sided 95% interval (one value: itself)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    half = T975.get(len(xs) - 1, 1.96) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - half, m + half


def measure_grid(study, workdir: Path) -> dict:
    """Every feasible layout of ``study`` measured through the pipeline at every rung:
    ``{(layout, steps): [Outcome per repeat]}`` and the planned layouts."""
    from scalestudy import paths
    from scalestudy.analysis.aggregate import collect
    from scalestudy.record.states import RunState
    from scalestudy.tune.measure import Outcome, SnakemakeTrials
    from scalestudy.tune.space import layouts, planned, rung_study, rungs

    lays = [lay for lay, p in planned(study, layouts(study.tune)).items() if p.feasible]
    tune_dir = workdir / "grid" / "tune"
    ev = SnakemakeTrials(study, str(STUDY), tune_dir, str(paths.profile("local")))
    table = {}
    for steps in rungs(study.tune, study.train.steps):
        ev([(lay, steps) for lay in lays])  # every repeat of every layout, one Snakemake run
        rung = rung_study(study, lays, steps)
        runs, _, _ = collect(ev.results / rung.name)
        by_series = {}
        for r in runs.to_dict("records"):
            by_series.setdefault(r["series"], []).append(r)
        for lay in lays:
            table[(lay, steps)] = [
                Outcome(RunState(r["status"]), str(r.get("reason") or ""),
                        float(r["tokens_per_s_per_device"]) if r["status"] == "ok" else 0.0,
                        float(r["peak_memory_gb"]), float(r["wall_s"]), r["point_id"], False)
                for r in by_series.get(lay.name, [])]
    return {"layouts": lays, "table": table}


class Replay:
    """``evaluate`` of a search that answers each ``(layout, steps)`` with one of the grid's
    measured runs of it, drawn with a seeded generator."""

    def __init__(self, table: dict, seed: int):
        self.table, self.rng = table, random.Random(seed)

    def __call__(self, batch):
        return {key: self.rng.choice(self.table[key]) for key in batch}


def search_once(study, table: dict, workdir: Path, strategy: str, seed: int, budget: int):
    """One search of ``strategy`` with ``seed`` and ``budget`` trials, replayed on ``table``:
    its rows."""
    from scalestudy.config.vocab import Sampler
    from scalestudy.tune.search import build

    t = study.tune
    if strategy == "random":
        t = replace(t, sampler=Sampler.RANDOM, warm_start=0, min_steps=None)
    elif strategy == "tpe-cold":
        t = replace(t, warm_start=0)
    s = replace(study, tune=replace(t, seed=seed, trials=budget))
    search, _ = build(s, workdir / f"{strategy}-seed{seed}", Replay(table, seed))
    return search.run()


def measure(workdir: Path, seeds=SEEDS) -> dict:
    """The grid, the strategies over ``seeds``, and the figures (module doc)."""
    from scalestudy.config.study import load_study
    from scalestudy.tune.search import predictions
    from scalestudy.tune.space import planned

    study = load_study(STUDY)
    grid = measure_grid(study, workdir)
    lays, table = grid["layouts"], grid["table"]
    full = study.train.steps
    truth = {}
    for lay in lays:
        ok = [o.tokens_per_s_per_device for o in table[(lay, full)] if o.state == "ok"]
        truth[lay] = mean_ci(ok) if ok else (0.0, 0.0, 0.0)
    best = max(lays, key=lambda lay: truth[lay][0])
    low = truth[best][1]
    spreads = []
    for lay in lays:
        ok = [o.tokens_per_s_per_device for o in table[(lay, full)] if o.state == "ok"]
        if len(ok) > 1 and min(ok) > 0:
            spreads.append(max(ok) / min(ok))
    budget = math.ceil(len(lays) / 3)
    predicted, _ = predictions(study, {lay: p for lay, p in planned(study, lays).items()})
    pick = max(predicted, key=lambda lay: predicted[lay])
    results = {"model-only": [{"seed": None, "layout": pick.name, "rate": truth[pick][0],
                               "hit": truth[pick][0] >= low, "device_hours": None}]}
    for strategy in ("tpe", "tpe-cold", "random"):
        results[strategy] = []
        for seed in seeds:
            rows = search_once(study, table, workdir / "searches", strategy, seed, budget)
            done = [r for r in rows if r["state"] == "complete"]
            found = (max(done, key=lambda r: r["measured_tokens_per_s_per_device"])
                     if done else None)
            lay = next((x for x in lays if found and x.name == found["layout"]), None)
            rate = truth[lay][0] if lay else 0.0
            results[strategy].append({
                "seed": seed, "layout": lay.name if lay else None, "rate": rate,
                "hit": rate >= low, "device_hours": sum(r["device_hours"] for r in rows),
                "layouts_measured": len({r["layout"] for r in rows
                                         if r["state"] not in ("refused", "duplicate")})})
    figs = []
    noise = (f"host noise: a layout's 3 repeats differ by {statistics.median(spreads):.2f}x "
             f"median, {max(spreads):.2f}x max" if spreads else "host noise: not measured")
    for strategy, runs in results.items():
        hits = sum(r["hit"] for r in runs)
        ratio = statistics.median(r["rate"] / truth[best][0] for r in runs)
        hours = [r["device_hours"] for r in runs if r["device_hours"] is not None]
        figs.append(figure("tune", f"{strategy}: within the grid best's 95% CI", hits / len(runs),
                           "fraction", note=f"{hits} of {len(runs)} seeds; budget {budget} of "
                           f"{len(lays)} layouts; grid best {best.name} "
                           f"{truth[best][0]:.0f} tok/s/device (CI low {low:.0f}); {noise}"))
        figs.append(figure("tune", f"{strategy}: found / grid best (median)", ratio, "x",
                           note=f"layouts found: {sorted({r['layout'] for r in runs})}"))
        if hours:
            figs.append(figure("tune", f"{strategy}: device-hours spent (median)",
                               statistics.median(hours), "h", note="replayed runs' own wall x N"))
    return {"study": str(STUDY), "grid_layouts": len(lays), "budget": budget,
            "grid_best": {"layout": best.name, "mean": truth[best][0], "ci": truth[best][1:]},
            "truth": {lay.name: truth[lay] for lay in lays}, "spreads": spreads,
            "results": results, "figures": figs}
