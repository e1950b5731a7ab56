"""The typed study: what a validated study file says, built once after validation
(:meth:`Study.from_validated`; :func:`scalestudy.config.study.load_study` returns it) and read
by the planner, the CLI, the workflow's rules and the reports.

The model, training, parallel and platform settings are the point's own types
(:mod:`scalestudy.config.point`: units there), the site settings
:class:`scalestudy.config.site.Site`. Defaults are the schema's
(``workflow/schemas/study.schema.yaml``), filled before these are built, so the fields here
have none; a series' ``None`` means "not given" (the study's setting applies). ``study.json``
is the JSON form (:meth:`Study.to_json`: the keys of the validated document).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from scalestudy.config.export import Export
from scalestudy.config.parts import Model, Parallel, Platform, Profile, Train, Workload, json_value
from scalestudy.config import settings
from scalestudy.config.settings import coerce_value, series_settable
from scalestudy.config.vocab import (
    Checkpointing, DPMode, DType, FigureStyle, FlopsConvention, PPSchedule,
    Reference, Sampler, ScalingMode,
)


def _typed(value, enum):
    """``value`` (a word, a list of words, or None) as ``enum`` members; a list as a tuple."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(enum(v) for v in value)
    return enum(value)


def _counts(value):
    """A count, or a list of counts to sweep (a tuple)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Series:
    """One series of sweep points: a model on a list of device counts, weak or strong. An axis
    given as a list (a tuple here) is swept: the planner makes one series per value."""

    name: str  # the series' name: letters, digits, '_', '.', '-'
    mode: ScalingMode  # weak: tokens per device per step fixed; strong: tokens per step fixed
    model: str  # the name of one of the study's models
    gpus: tuple[int, ...]  # world sizes N to sweep (devices; processes on a CPU)
    micro_batch: int | tuple[int, ...]  # sequences per micro-batch per data-parallel rank
    tp: int | tuple[int, ...]  # tensor-parallel ranks (count)
    pp: int | tuple[int, ...]  # pipeline-parallel ranks (count)
    cp: int | tuple[int, ...]  # context-parallel ranks sharing each sequence (count)
    grad_accum: int  # weak: micro-batches per optimizer step per data-parallel rank
    global_batch: int | None = None  # strong: sequences per optimizer step (fixed)
    baseline: int | None = None  # N0 of the efficiency curve (devices); None: smallest feasible
    # the parallel settings this series gives over the study's (settings.series_settable:
    # name -> value; a tuple of values of a swept setting is a sweep)
    settings: Mapping[str, object] = field(default_factory=dict)
    workload: Workload | None = None  # what this series runs; None: the study's workload

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "mode", ScalingMode(self.mode))
        set_(self, "gpus", tuple(self.gpus))
        for name in ("micro_batch", "tp", "pp", "cp"):
            set_(self, name, _counts(getattr(self, name)))
        unknown = set(self.settings) - set(series_settable(Parallel))
        if unknown:
            raise ValueError(f"series {self.name}: not a series setting: {sorted(unknown)}")
        set_(self, "settings", {k: coerce_value(Parallel, k, v) for k, v in self.settings.items()})

    def parallel(self, base: Parallel) -> Parallel:
        """``base`` (the study's parallel settings) with this series' own over it."""
        return replace(base, **self.settings)

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Series":
        """The series of a validated ``series:`` entry."""
        own = series_settable(Parallel)
        kw = {k: v for k, v in doc.items() if k != "workload" and k not in own}
        if "workload" in doc:
            kw["workload"] = Workload.from_study(doc["workload"])
        return cls(**kw, settings={k: doc[k] for k in own if k in doc})

    def to_json(self) -> dict:
        """The ``series:`` entry (the keys given or defaulted; no None)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "settings":
                out.update({k: json_value(v) for k, v in value.items()})
            elif value is not None:
                out[f.name] = (value.to_study() if isinstance(value, Workload)
                               else json_value(value))
        return out


@dataclass(frozen=True)
class Microbench:
    """Building-block measurements (matmul, collectives) that feed the performance model."""

    enabled: bool  # measure them in the study's run
    matmul_sizes: tuple[int, ...]  # n of the n x n x n matrix products (elements)
    dtypes: tuple[DType, ...]  # element types of the matrix products
    sizes: tuple[int, ...]  # collective message sizes (bytes)
    group_sizes: tuple[int, ...]  # ranks per collective (count)

    def __post_init__(self):
        for f in fields(self):
            if f.name != "enabled":
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        object.__setattr__(self, "dtypes", _typed(self.dtypes, DType))


@dataclass(frozen=True)
class Predict:
    """The performance model inside the study (a CPU study's predict job)."""

    before_run_max_n: int | None  # points with N (devices) up to this calibrate the model that
    # predicts the others before they run; None: no prediction before the run


@dataclass(frozen=True)
class Report:
    """How the study's figures and tables are exported."""

    figure_style: FigureStyle  # figure width and fonts (default, single- or double-column)

    def __post_init__(self):
        object.__setattr__(self, "figure_style", FigureStyle(self.figure_style))


@dataclass(frozen=True)
class TuneSpace:
    """The values each layout axis of a tuning search may take; ``None``: every value the
    trainer has (``scalestudy.tune.space.axis_values``). Besides the shape, one field per
    tuned setting (``settings.tuned(Parallel)``; a test holds them equal)."""

    tp: tuple[int, ...] | None  # tensor-parallel ranks (count)
    pp: tuple[int, ...] | None  # pipeline-parallel ranks (count)
    cp: tuple[int, ...] | None  # context-parallel ranks (count)
    micro_batch: tuple[int, ...] | None  # sequences per micro-batch per data-parallel rank
    virtual_stages: tuple[int, ...] | None  # interleaved stages per pipeline rank (count)
    pp_schedule: tuple[PPSchedule, ...] | None
    dp_mode: tuple[DPMode, ...] | None
    activation_checkpointing: tuple[Checkpointing, ...] | None

    @classmethod
    def from_validated(cls, doc: Mapping) -> "TuneSpace":
        tuned = settings.tuned(Parallel)
        return cls(**{f.name: (None if doc.get(f.name) is None else
                               tuple(coerce_value(Parallel, f.name, doc[f.name]))
                               if f.name in tuned else tuple(doc[f.name]))
                      for f in fields(cls)})


@dataclass(frozen=True)
class Tune:
    """``tune:``: a search of one model's layout on ``gpus`` devices by measuring it."""

    model: str  # the name of one of the study's models
    gpus: int  # devices N (processes on a CPU)
    global_batch: int  # sequences per optimizer step (fixed across the layouts)
    space: TuneSpace  # the values each layout axis may take
    trials: int  # budget: layouts measured (count)
    device_hours: float | None  # budget: device-hours of the trials' runs; None: no limit
    parallel: int  # trials run at once (count)
    min_steps: int | None  # steps of the first fidelity rung; None: every trial full length
    eta: int  # successive halving's reduction factor (dimensionless)
    sampler: Sampler  # tpe or random
    seed: int  # the sampler's seed
    warm_start: int  # the model's best predicted layouts measured first (count)
    memory_left_gb: float | None = None  # memory a layout must leave free per device (GB)

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Tune":
        kw = {f.name: doc.get(f.name) for f in fields(cls) if f.name != "space"}
        return cls(**{**kw, "sampler": Sampler(doc["sampler"])},
                   space=TuneSpace.from_validated(doc["space"]))


@dataclass(frozen=True)
class Study:
    """A validated study file (module docstring)."""

    name: str  # the study's folder under results/
    description: str  # free text atop the report
    models: Mapping[str, Model]  # the models by name (Model.name is the key)
    series: tuple[Series, ...]  # the sweeps, in file order
    repeats: int  # separate measurements (jobs) of every point
    retries: int  # extra attempts of a point that crashed or timed out
    flops_convention: FlopsConvention  # how model FLOPs are counted (MFU)
    workload: Workload  # what every series runs unless it names its own
    references: tuple[Reference, ...]  # published results overlaid on the figures
    train: Train  # the optimisation run of every point
    parallel: Parallel  # the parallel options every series starts from
    platform: Platform  # where the points run; its site: config.site.Site
    report: Report  # figure style
    microbench: Microbench  # building-block measurements
    predict: Predict  # the performance model's prediction before the run
    profile: Profile = Profile()  # profiler traces of every point after its timed window
    tune: Tune | None = None  # a layout search by measurement (None: none)
    export: Export = Export()  # copies for experiment trackers (config.export; none: off)

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Study":
        """The study of a validated document (``scalestudy.config.study.validate``: schema,
        defaults and semantic checks passed; or a ``study.json`` this version wrote)."""
        before = doc["predict"]["before_run"]
        return cls(
            name=doc["name"], description=doc["description"],
            models={name: Model(name=name, **m) for name, m in doc["models"].items()},
            series=tuple(Series.from_validated(s) for s in doc["series"]),
            repeats=doc["repeats"], retries=doc["retries"],
            flops_convention=FlopsConvention(doc["flops_convention"]),
            workload=Workload.from_study(doc["workload"]),
            references=tuple(Reference(r) for r in doc["references"]),
            train=Train(**doc["train"]), parallel=Parallel(**doc["parallel"]),
            platform=Platform(**doc["platform"]), report=Report(**doc["report"]),
            microbench=Microbench(**doc["microbench"]),
            predict=Predict(before_run_max_n=before["calibrate_on_max_n"] if before else None),
            profile=Profile(**doc.get("profile", {})),
            tune=Tune.from_validated(doc["tune"]) if doc.get("tune") else None,
            export=Export.from_validated(doc.get("export")))

    def to_json(self) -> dict:
        """``study.json``: the validated document's keys and values."""
        out = {f.name: json_value(getattr(self, f.name)) for f in fields(self)}
        out["models"] = {name: {k: v for k, v in json_value(m).items() if k != "name"}
                         for name, m in self.models.items()}
        out["series"] = [s.to_json() for s in self.series]
        out["workload"] = self.workload.to_study()
        n = self.predict.before_run_max_n
        out["predict"] = {"before_run": None if n is None else {"calibrate_on_max_n": n}}
        if self.tune is None:
            out.pop("tune")
        return out
