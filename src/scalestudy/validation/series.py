"""The published scaling series against the step model, anchored at their smallest N: the
rows of a table that share a ``series`` id (``validation.published`` reads them), the model's
software rate solved on the first row (``perf.anchor``) and the efficiency at the largest N
predicted from it, every unsaid field read alike at both ends. Pure: no files, no figures."""

from __future__ import annotations

from scalestudy.validation import frontier

from scalestudy.perf import stepmodel
from scalestudy.perf.breakdown import StepBreakdown
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.validation.published import (FRONTIER, Case, Variant, cases, convention_flops,
                                        predicted_value, readings, systems, table_names)


#: The metric a series is read in when its rows give several (the first one present).
SERIES_METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct", "iteration_s", "hfu_pct")


def central_reading(c: Case, specs) -> tuple[float, Variant, StepBreakdown]:
    """``(value, variant, breakdown)`` of a case's central reading: the median one
    (``validation.readings``)."""
    vals = readings(c, specs)
    return vals[(len(vals) - 1) // 2]


def flops_rate(metric: str, value: float, v: Variant, peak: float) -> float:
    """A row's figure as model FLOP/s per device (its own convention; ``megatron`` for a
    metric without one), so that the points of a series whose model grows compare."""
    p = v.point
    conv = v.convention if v.convention != "none" else "megatron"
    if metric == "iteration_s":
        return convention_flops(p, conv) / (value * p.n)
    if metric == "tokens_per_s_per_gpu":
        return value * convention_flops(p, conv) / p.tokens_per_step
    if metric in ("mfu_pct", "hfu_pct"):
        return value / 100 * peak
    return value * 1e12


#: What each field a table may leave unsaid (``Case.ranged``) reads as in a variant: the
#: head count as the head dimension it gives (a weak series' model grows).
READING_FIELDS = {
    "micro_batch": lambda v: v.point.micro_batch,
    "vp": lambda v: v.point.parallel.virtual_stages,
    "recompute": lambda v: v.point.parallel.activation_checkpointing,
    "dp_mode": lambda v: v.point.parallel.dp_mode,
    "vocab": lambda v: v.point.model.vocab,
    "heads": lambda v: v.point.model.hidden // v.point.model.heads,
    "flash_attention": lambda v: v.point.model.attention,
    "precision": lambda v: v.framework,
    "dp_impl": lambda v: v.framework,
    "flops_convention": lambda v: v.convention,
    "fp8_speedup": lambda v: v.fp8_speedup,
}


def reading_key(v: Variant, unsaid) -> tuple:
    """What a reading assumes about the fields ``unsaid`` (``Case.ranged`` names, each read
    by ``READING_FIELDS``; the global batch changes along a series and is left out): the same
    run configuration at every point of a series. A published field is no assumption and may
    change along it."""
    return tuple(READING_FIELDS[f](v) for f in sorted(set(unsaid) - {"global_batch"}))


def anchored_efficiency(metric: str, first: Case, last: Case, v0: Variant, vn: Variant,
                        specs, scenario: str = "central") -> tuple[float, float]:
    """``(efficiency, rate)``: the model's software rate solved so that reading ``v0`` of the
    series' first row gives its published figure (``anchor.solve_rate``), then the last row's
    per-device FLOP rate at that rate (reading ``vn``) over the first's published one; every
    system at ``scenario`` of ``hw.scenarios()``."""
    from scalestudy.perf import anchor

    def at(c: Case, v: Variant) -> tuple[HardwareSpec, float]:
        hw = specs[(c.system, v.framework, v.fp8_speedup)]
        return dict(hw.scenarios())[scenario], specs[(c.system, v.framework)].peak("bf16")

    (h0, peak0), (hn, peakn) = at(first, v0), at(last, vn)
    b0 = stepmodel.predict_step_time(v0.point, h0)
    val0 = predicted_value(metric, v0.convention, v0.point, b0, peak0)
    # the anchor's measured step: the model's step scaled as its figure is to the published
    t0 = b0.step_time_s * (first.published / val0 if metric == "iteration_s"
                           else val0 / first.published)
    rate = anchor.solve_rate(v0.point, h0, t0)
    bn = stepmodel.predict_step_time(vn.point, hn.with_assumption("software_rate", rate))
    xn = flops_rate(metric, predicted_value(metric, vn.convention, vn.point, bn, peakn), vn,
                    peakn)
    return xn / flops_rate(metric, first.published, v0, peak0), rate


def rate_plausible(hw: HardwareSpec, rate: float) -> bool:
    """Whether an anchored software ``rate`` lies inside ``hw``'s stated range for it."""
    a = hw.assumptions.get("software_rate")
    return a is None or a.low <= rate <= a.high


def series_rows(all_cases: list[Case], specs) -> list[dict]:
    """Every published series (rows sharing a ``series`` id, read in one metric,
    ``SERIES_METRICS``) anchored at its smallest N (``anchored_efficiency``), against the
    published efficiency ``X(N)/X(N₀)`` at its largest N. What the tables leave unsaid is read
    alike at both ends (``reading_key``), and a reading whose anchored rate falls outside the
    framework's stated ``software_rate`` range is dropped (``rate_plausible``; all are kept
    when none is inside): the central value is the reading whose efficiency is the median, the
    band the envelope over the readings and over the central reading's scenarios (the rate
    re-solved in each). ``error_points``: central minus published, in percentage points."""
    groups: dict = {}
    for c in all_cases:
        if c.series and not c.skip:
            groups.setdefault((c.table, c.series), []).append(c)
    out = []
    for (table, series), cs in sorted(groups.items()):
        metric = next(m for m in SERIES_METRICS if any(c.metric == m for c in cs))
        cs = sorted((c for c in cs if c.metric == metric), key=lambda c: c.point.n)
        if len(cs) < 2:
            continue
        first, last = cs[0], cs[-1]
        unsaid = set(first.ranged) | set(last.ranged)
        ends = {reading_key(v, unsaid): v for v in last.variants}
        pairs = [(v, ends[reading_key(v, unsaid)]) for v in first.variants
                 if reading_key(v, unsaid) in ends]
        if not pairs:  # no reading admissible at both ends: each end's central one
            pairs = [(central_reading(first, specs)[1], central_reading(last, specs)[1])]
        effs = sorted(((anchored_efficiency(metric, first, last, v0, vn, specs), v0, vn)
                       for v0, vn in pairs), key=lambda x: x[0][0])
        # the anchor measures the software's rate: a reading that needs one outside the
        # framework's stated range cannot be what ran (kept only if every reading does)
        plausible = [x for x in effs if rate_plausible(
            specs[(first.system, x[1].framework)], x[0][1])]
        effs = plausible or effs
        (e, rate), v0, vn = effs[(len(effs) - 1) // 2]
        band = [x[0][0] for x in effs] + [
            anchored_efficiency(metric, first, last, v0, vn, specs, sc)[0]
            for sc, _ in specs[(first.system, v0.framework, v0.fp8_speedup)].scenarios()]
        peak = specs[(first.system, v0.framework)].peak("bf16")
        pub = (flops_rate(metric, last.published, vn, peak)
               / flops_rate(metric, first.published, v0, peak))
        out.append({"table": table, "series": series, "scaling": first.scaling,
                    "metric": metric, "n0": first.point.n, "n": last.point.n,
                    "points": len(cs), "readings": len(effs), "rate": rate,
                    "published_efficiency": pub, "predicted_efficiency": e,
                    "predicted_low": min(band), "predicted_high": max(band),
                    "error_points": 100 * (e - pub)})
    return out


def series_table(names: list[str] | None = None, overrides: dict | None = None):
    """``series_rows`` of the named tables (default: all) and the Frontier study's weak and
    strong series (``frontier.anchored``), as a DataFrame."""
    import pandas as pd

    specs = systems(overrides)
    names = names or table_names()
    rows = series_rows(cases(names), specs)
    if FRONTIER in names:
        rows += [{"table": FRONTIER, **r} for r in
                 frontier.anchored(specs[("frontier", "megatron-deepspeed")])]
    return pd.DataFrame(rows)
