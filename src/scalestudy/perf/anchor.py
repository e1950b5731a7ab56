"""Anchored prediction of a scaling series: measured points carry what no preset knows, the
model carries how the step changes with N.

A series is a list of points of one study (or one published table) at growing N. The model
cannot know how fast a framework's kernels run on a machine (its release, fusion, attention
kernel: ``Framework.software_rate``), but it does know how the pipeline bubble, the
communication and the memory-bound work change from one N to the next. So the rate is solved
on the measured points (the *anchors*: the smallest N of a series, or a study's N ≤ k), and
the same model, at that rate, predicts the rest:

- ``solve_rate``: the ``software_rate`` at which the model's step time equals a measured one
  (the step is a decreasing function of the rate: its computing phases divide by it, its
  communication does not);
- ``anchored_rate``: over several anchors, the geometric mean of their rates;
- ``predict_series``: every point's step and per-device throughput at the anchored rate, and
  the efficiency ``E(N) = X(N) / X(N₀)`` against the series' smallest N, with its band: the
  envelope over ``hw.scenarios()``, the rate re-solved under each scenario so that every
  scenario passes through the anchors.

Pure: no files, no figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scalestudy.config.point import Point
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import Measured
from scalestudy.perf.stepmodel import predict_step_time

#: The rates ``solve_rate`` searches (dimensionless, relative to the software the shared
#: constants were set on): a measured step outside what they give is reported at the bound.
RATE_BOUNDS = (1e-3, 1e3)


def step_at_rate(point: Point, hw: HardwareSpec, rate: float,
                 measured: Measured | None = None) -> float:
    """The model's step time (s) of ``point`` with the framework's compute rate ``rate``."""
    return predict_step_time(point, hw.with_assumption("software_rate", rate),
                             measured).step_time_s


def solve_rate(point: Point, hw: HardwareSpec, step_s: float,
               measured: Measured | None = None, tol: float = 1e-6) -> float:
    """The ``software_rate`` at which the model's step of ``point`` is ``step_s`` seconds.
    The step is nearly ``A / rate + B`` (computing phases over the rate, communication not),
    so a secant in ``1/rate`` converges in a few steps; clamped to ``RATE_BOUNDS`` (a
    measured step shorter than the communication alone gives the upper bound)."""
    if not step_s > 0:
        raise ValueError(f"step_s={step_s}: a measured step time must be > 0 seconds")
    lo, hi = RATE_BOUNDS

    def f(x: float) -> float:
        return step_at_rate(point, hw, 1.0 / x, measured) - step_s

    x0, x1 = 1.0, 0.5
    f0, f1 = f(x0), f(x1)
    for _ in range(40):
        if abs(f1) <= tol * step_s or f1 == f0:
            break
        x2 = min(max(x1 - f1 * (x1 - x0) / (f1 - f0), 1.0 / hi), 1.0 / lo)
        x0, f0, x1 = x1, f1, x2
        f1 = f(x1)
    return 1.0 / x1


def anchored_rate(anchors: list[tuple[Point, float]], hw: HardwareSpec,
                  measured: Measured | None = None) -> float:
    """The compute rate of a series from its measured ``(point, step_s)`` anchors: the
    geometric mean of each anchor's ``solve_rate``."""
    if not anchors:
        raise ValueError("a series needs at least one measured point to anchor on")
    logs = [math.log(solve_rate(p, hw, t, measured)) for p, t in anchors]
    return math.exp(sum(logs) / len(logs))


def per_device_rate(point: Point, step_s: float) -> float:
    """Per-device throughput (tokens/s per device): tokens per step / (step · N)."""
    return point.tokens_per_step / (step_s * point.n)


@dataclass(frozen=True)
class SeriesPoint:
    """One point of an anchored series prediction."""

    n: int  #: devices
    step_s: float  #: predicted step time at the anchored rate (s)
    tokens_per_s_per_device: float  #: predicted per-device throughput
    efficiency: float  #: predicted X(N) / X(N₀), N₀ the series' smallest N (fraction)
    efficiency_low: float  #: the band's lower end over the scenarios (fraction)
    efficiency_high: float  #: the band's upper end (fraction)
    rate: float  #: the anchored software rate (central scenario)
    anchored: bool  #: this point is one of the anchors


def predict_series(points: list[Point], anchors: list[tuple[Point, float]], hw: HardwareSpec,
                   measured: Measured | None = None, band: bool = True) -> list[SeriesPoint]:
    """The series ``points`` (sorted by N here) predicted at the rate anchored on ``anchors``
    (``(point, measured step s)``), with the efficiency against the smallest N and, with
    ``band``, its envelope over ``hw.scenarios()`` (the rate re-solved in each)."""
    pts = sorted(points, key=lambda p: p.n)
    scen = hw.scenarios() if band else [("central", hw)]
    effs, central = [], None
    for label, h in scen:
        rate = anchored_rate(anchors, h, measured)
        steps = [step_at_rate(p, h, rate, measured) for p in pts]
        x = [per_device_rate(p, t) for p, t in zip(pts, steps)]
        effs.append([xi / x[0] for xi in x])
        if label == "central":
            central = (rate, steps, x)
    rate, steps, x = central
    return [SeriesPoint(n=p.n, step_s=steps[i], tokens_per_s_per_device=x[i],
                        efficiency=effs[0][i], efficiency_low=min(e[i] for e in effs),
                        efficiency_high=max(e[i] for e in effs), rate=rate,
                        anchored=any(p is a for a, _ in anchors))
            for i, p in enumerate(pts)]


#: The groups of step terms a measured breakdown anchors the model on, one factor each
#: (``term_factors``): the compute rate, the framework's overhead, each kind of exposed
#: communication (the achieved bandwidth and overlap), the bubble, the optimizer, the waits.
TERM_GROUPS = {
    "compute": ("gemm_s", "attention_s", "elementwise_s", "grad_accum_s"),
    "overhead": ("overhead_s",), "tp": ("tp_comm_s",), "pp_p2p": ("pp_p2p_s",),
    "bubble": ("pp_bubble_s",), "dp": ("dp_comm_exposed_s",), "cp": ("cp_comm_s",),
    "optimizer": ("optimizer_s",), "sync_wait": ("sync_wait_s",), "core_wait": ("core_wait_s",),
}
#: Measured terms the model has no counterpart of: carried as their share of the anchors'
#: steps.
CARRIED = ("data_s", "unattributed_s")


def term_factors(anchors: list[tuple[dict, dict]]) -> dict[str, float]:
    """Per term group, measured over predicted seconds, the geometric mean over the
    ``(predicted terms, measured terms)`` anchors where both are > 0 (groups no anchor
    measures keep the model's own: 1)."""
    out = {}
    for group, terms in TERM_GROUPS.items():
        logs = [math.log(sum(m[t] for t in terms) / sum(p[t] for t in terms))
                for p, m in anchors
                if sum(p[t] for t in terms) > 0 and sum(m[t] for t in terms) > 0]
        out[group] = math.exp(sum(logs) / len(logs)) if logs else 1.0
    return out


def carried_share(anchors: list[tuple[dict, dict]]) -> float:
    """The anchors' mean share of their steps in the terms only a trace has (``CARRIED``)."""
    shares = [sum(m[t] for t in CARRIED) / sum(m.values()) for _, m in anchors if sum(m.values()) > 0]
    return sum(shares) / len(shares) if shares else 0.0


def step_on_terms(predicted: dict, factors: dict[str, float], carried: float) -> float:
    """A point's step (s) from the model's terms ``predicted`` anchored on the measured terms:
    each group scaled by its factor, the carried share added back."""
    core = sum(factors[g] * predicted[t] for g, terms in TERM_GROUPS.items() for t in terms)
    return core / (1.0 - carried)
