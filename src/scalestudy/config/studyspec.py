"""The typed study: what a validated study file says, built once after validation
(:meth:`Study.from_validated`; :func:`scalestudy.config.study.load_study` returns it) and read
by the planner, the CLI, the workflow's rules and the reports.

The model, training, parallel and platform settings are the point's own types
(:mod:`scalestudy.config.point`: units there), the site settings
:class:`scalestudy.config.site.Site`. Every field is a declared setting
(:mod:`scalestudy.config.settings`): the study schema, its defaults (filled before these are
built) and the settings reference are generated from these declarations. A series' ``None``
means "not given" (the study's setting applies). ``study.json`` is the JSON form
(:meth:`Study.to_json`: the keys of the validated document).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Mapping

from scalestudy.config.export import Export
from scalestudy.config.parts import (SERIES_SETTINGS, TUNED_SETTINGS, Model, Parallel, Platform, Profile, Train,
                                     Workload, json_value, section_of)
from scalestudy.config import limits, settings
from scalestudy.config.settings import Hash, coerce_value, setting
from scalestudy.config.vocab import (
    DType, FigureStyle, FlopsConvention, Reference, Sampler, ScalingMode,
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


#: The shape axes of a series a list sweeps (counts), also the shape of a tuned layout; the
#: swept settings are declared (``parts.SERIES_SETTINGS``).
SHAPE_AXES = ("tp", "pp", "cp", "micro_batch")


_SWEPT_COUNT = {"$ref": "#/$defs/int_or_list"}


@dataclass(frozen=True, kw_only=True)
class Series:
    """One series of sweep points: a model on a list of device counts, weak or strong. An axis
    given as a list (a tuple here) is swept: the planner makes one series per value. Besides
    these, a series may give any section's settings declared for it (``settings``)."""

    name: str = setting(hash=Hash.NEVER, required=True, ref="safe_name",
                        doc="the series' name (letters, digits, '_', '.', '-')")
    mode: ScalingMode = setting(hash=Hash.ALWAYS, required=True, ref="scaling_mode",
                                doc="weak: tokens per device per step fixed; strong: tokens "
                                    "per step fixed")
    model: str = setting(hash=Hash.ALWAYS, required=True, ref="safe_name",
                         doc="a key of 'models'")
    gpus: tuple[int, ...] = setting(hash=Hash.ALWAYS, required=True, minimum=1,
                                    maximum=limits.MAX_DEVICES, max_items=limits.MAX_GPUS_LIST,
                                    doc="world sizes N (devices, or processes on a CPU) to sweep")
    micro_batch: int | tuple[int, ...] = setting(
        hash=Hash.ALWAYS, required=True, schema=_SWEPT_COUNT,
        doc="sequences per micro-batch per data-parallel rank")
    tp: int | tuple[int, ...] = setting(1, hash=Hash.ALWAYS, schema=_SWEPT_COUNT,
                                        doc="tensor-parallel ranks")
    pp: int | tuple[int, ...] = setting(1, hash=Hash.ALWAYS, schema=_SWEPT_COUNT,
                                        doc="pipeline-parallel ranks")
    cp: int | tuple[int, ...] = setting(
        1, hash=Hash.ALWAYS, schema=_SWEPT_COUNT,
        doc="context parallelism: ranks sharing each sequence (torch's context_parallel ring "
            "attention; CUDA only)")
    grad_accum: int = setting(1, hash=Hash.ALWAYS, minimum=1,
                              doc="weak scaling: micro-batches per step per data-parallel rank "
                                  "(fixed)")
    global_batch: int | None = setting(None, hash=Hash.ALWAYS, minimum=1, optional=True,
                                       doc="strong scaling: sequences per optimizer step "
                                           "(fixed); required for mode strong")
    baseline: int | None = setting(None, hash=Hash.NEVER, minimum=1, optional=True,
                                   doc="N0 of the efficiency curve (default: the smallest "
                                       "feasible N)")
    # the settings of any section this series gives over the study's (parts.SERIES_SETTINGS:
    # name -> value; a tuple of values of a swept setting is a sweep)
    settings: Mapping[str, object] = setting(factory=dict, hash=Hash.ALWAYS, study=False,
                                             doc="the sections' settings this series gives")
    workload: Workload | None = setting(None, hash=Hash.ALWAYS, ref="workload", optional=True,
                                        doc="what this series runs (default: the study's "
                                            "workload)")

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "mode", ScalingMode(self.mode))
        set_(self, "gpus", tuple(self.gpus))
        for name in ("micro_batch", "tp", "pp", "cp"):
            set_(self, name, _counts(getattr(self, name)))
        unknown = set(self.settings) - set(SERIES_SETTINGS)
        if unknown:
            raise ValueError(f"series {self.name}: not a series setting: {sorted(unknown)}")
        set_(self, "settings", {k: coerce_value(section_of(k), k, v)
                                for k, v in self.settings.items()})

    def section(self, key: str, base):
        """``base`` (the study's section ``key``: ``parallel``, ``train``, ...) with this
        series' own settings of that section over it."""
        own = {k: v for k, v in self.settings.items() if SERIES_SETTINGS[k] == key}
        return replace(base, **own) if own else base

    def parallel(self, base: Parallel) -> Parallel:
        """``base`` (the study's parallel settings) with this series' own over it."""
        return self.section("parallel", base)

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Series":
        """The series of a validated ``series:`` entry."""
        own = SERIES_SETTINGS
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

    enabled: bool = setting(False, hash=Hash.NEVER, doc="measure them in the study's run")
    matmul_sizes: tuple[int, ...] = setting(
        (256, 512, 1024), hash=Hash.NEVER, unit="elements", minimum=1, maximum=65536,
        doc="n of the n x n x n matrix products")
    dtypes: tuple[DType, ...] = setting((DType.FP32,), hash=Hash.NEVER, ref="dtype",
                                        doc="element types of the matrix products")
    sizes: tuple[int, ...] = setting((4096, 65536, 1048576, 8388608), hash=Hash.NEVER,
                                     unit="bytes", minimum=1, maximum=2**34,
                                     doc="collective message sizes")
    group_sizes: tuple[int, ...] = setting((2,), hash=Hash.NEVER, unit="count", minimum=2,
                                           maximum=1024, doc="ranks per collective")

    def __post_init__(self):
        for f in fields(self):
            if f.name != "enabled":
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))
        object.__setattr__(self, "dtypes", _typed(self.dtypes, DType))


@dataclass(frozen=True)
class Predict:
    """The performance model inside the study (a CPU study's predict job). Its study form is
    ``before_run: null | {calibrate_on_max_n: N}`` (:data:`PREDICT_FORM`)."""

    before_run_max_n: int | None = setting(
        None, hash=Hash.NEVER, unit="devices", study=False,
        doc="points with N up to this calibrate the model that predicts the others before "
            "they run; None: no prediction before the run")


#: ``predict:`` as a study writes it.
PREDICT_FORM = {
    "type": "object", "additionalProperties": False, "properties": {"before_run": {
        "type": ["object", "null"], "additionalProperties": False, "default": None,
        "description": "predict the larger points before they run, from the model calibrated "
                       "on the smaller ones once they are measured "
                       "(predict/predicted_before_run.csv; the larger points wait for it)",
        "required": ["calibrate_on_max_n"],
        "properties": {"calibrate_on_max_n": {
            "type": "integer", "minimum": 1, "maximum": 1024,
            "description": "points with N up to this are measured first and calibrate the "
                           "model; the others are predicted before they run"}}}}}


@dataclass(frozen=True)
class Report:
    """How the study's figures and tables are exported."""

    figure_style: FigureStyle = setting(
        FigureStyle.DEFAULT, hash=Hash.NEVER, ref="figure_style",
        doc="figure width and fonts: default (screen, 6.4 in), single-column (3.5 in, 8 pt) or "
            "double-column (7 in, 8 pt) of a paper; TrueType fonts embedded in every PDF")

    def __post_init__(self):
        object.__setattr__(self, "figure_style", FigureStyle(self.figure_style))


def _space_from_validated(cls, doc: Mapping):
    """The space of a validated ``tune.space`` mapping (an axis left out: None)."""
    return cls(**{name: (None if doc.get(name) is None else
                         tuple(coerce_value(section_of(name), name, doc[name]))
                         if name in TUNED_SETTINGS else tuple(doc[name]))
                  for name in (*SHAPE_AXES, *TUNED_SETTINGS)})


#: The values each layout axis of a tuning search may take; ``None``: every value the trainer
#: has (``scalestudy.tune.space.axis_values``). The shape's axes (:data:`SHAPE_AXES`), then
#: one field per tuned setting of any section (``parts.TUNED_SETTINGS``), made from them.
TuneSpace = make_dataclass(
    "TuneSpace", [(name, "tuple | None", field(default=None))
                  for name in (*SHAPE_AXES, *TUNED_SETTINGS)],
    frozen=True, namespace={"from_validated": classmethod(_space_from_validated),
                            "__doc__": "The values each axis of a tuning search may take "
                                       "(None: every value the trainer has).",
                            "__module__": __name__})


@dataclass(frozen=True, kw_only=True)
class Tune:
    """``tune:``: a search of one model's layout on ``gpus`` devices by measuring it
    (Optuna; docs/tuning.md). Every trial is a point of the pipeline, under
    ``results/<name>/tune/``."""

    model: str = setting(hash=Hash.NEVER, required=True, ref="safe_name",
                         doc="a key of 'models'")
    gpus: int = setting(hash=Hash.NEVER, required=True, unit="devices", minimum=1,
                        maximum=limits.MAX_DEVICES, doc="devices N (processes on a CPU)")
    global_batch: int = setting(hash=Hash.NEVER, required=True, unit="sequences", minimum=1,
                                doc="sequences per optimizer step (fixed)")
    space: TuneSpace = setting(
        factory=TuneSpace, hash=Hash.NEVER, ref="tune_space",
        doc="the values each layout axis may take; an axis left out takes every value the "
            "trainer has (tp, pp: the divisors of gpus; micro_batch: 1, 2, 4, 8; cp: 1; each "
            "setting's as it says)")
    trials: int = setting(12, hash=Hash.NEVER, unit="count", minimum=1, maximum=10000,
                          doc="budget: layouts measured (a layout already measured costs "
                              "nothing)")
    device_hours: float | None = setting(
        None, hash=Hash.NEVER, unit="device-hours", above=0,
        doc="budget: device-hours of the trials' runs (wall time x N); null: no limit")
    parallel: int = setting(1, hash=Hash.NEVER, unit="count", minimum=1, maximum=1024,
                            doc="trials run at once (one Snakemake batch; the profile says how "
                                "many run side by side)")
    min_steps: int | None = setting(
        None, hash=Hash.NEVER, unit="count", minimum=2,
        doc="fidelity: a trial first runs this many steps, and only the best 1/eta of a rung go "
            "on to eta times as many, up to train.steps (successive halving); null: every "
            "trial runs train.steps")
    eta: int = setting(3, hash=Hash.NEVER, minimum=2, maximum=16,
                       doc="successive halving's reduction factor")
    sampler: Sampler = setting(Sampler.TPE, hash=Hash.NEVER, ref="sampler",
                               doc="tpe (Bayesian) or random")
    seed: int = setting(0, hash=Hash.NEVER, minimum=0, doc="the sampler's seed")
    warm_start: int = setting(2, hash=Hash.NEVER, unit="count", minimum=0, maximum=100,
                              doc="the performance model's best predicted layouts, measured "
                                  "first")
    memory_left_gb: float | None = setting(
        None, hash=Hash.NEVER, unit="GB", minimum=0,
        doc="the memory a layout must leave free on each device (capacity minus its measured "
            "peak); a layout that leaves less is told zero throughput (state short_of_memory); "
            "null: no condition")

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Tune":
        kw = {f.name: doc.get(f.name) for f in fields(cls) if f.name != "space"}
        return cls(**{**kw, "sampler": Sampler(doc["sampler"])},
                   space=TuneSpace.from_validated(doc["space"]))


@dataclass(frozen=True, kw_only=True)
class Study:
    """A scaling study: models, defaults for training and parallelism, and series of sweep
    points (weak or strong scaling over a list of device counts). Names end up in paths and
    shell commands, so they are restricted to safe characters."""

    name: str = setting(hash=Hash.NEVER, required=True, ref="safe_name",
                        doc="the study's folder under results/")
    description: str = setting("", hash=Hash.NEVER, doc="free text atop the report")
    models: Mapping[str, Model] = setting(
        hash=Hash.ALWAYS, required=True,
        schema={"type": "object", "minProperties": 1,
                "propertyNames": {"$ref": "#/$defs/safe_name"},
                "additionalProperties": {"$ref": "#/$defs/model"}},
        doc="the models by name")
    series: tuple[Series, ...] = setting(
        (), hash=Hash.ALWAYS, schema={"type": "array", "items": {"$ref": "#/$defs/series"}},
        doc="the sweeps; may be empty only in a study with a tune: section")
    repeats: int = setting(1, hash=Hash.NEVER, unit="count", minimum=1,
                           maximum=limits.MAX_REPEATS,
                           doc="separate measurements (jobs) of every point")
    retries: int = setting(0, hash=Hash.NEVER, unit="count", minimum=0,
                           maximum=limits.MAX_RETRIES,
                           doc="extra attempts for a point that crashed or timed out")
    flops_convention: FlopsConvention = setting(
        FlopsConvention.MEGATRON, hash=Hash.NEVER, ref="flops_convention",
        doc="how model FLOPs are counted (MFU)")
    workload: Workload = setting(
        factory=Workload, hash=Hash.ALWAYS, ref="workload",
        doc="what every series runs unless it names its own: builtin (scalestudy's trainer) "
            "or a command")
    references: tuple[Reference, ...] = setting(
        (), hash=Hash.NEVER,
        schema={"type": "array", "items": {"$ref": "#/$defs/reference"}, "uniqueItems": True},
        doc="published results overlaid on the figures")
    train: Train = setting(factory=Train, hash=Hash.ALWAYS,
                           doc="the optimisation run of every point")
    parallel: Parallel = setting(factory=Parallel, hash=Hash.ALWAYS, ref="parallel",
                                 doc="the parallel options every series starts from")
    platform: Platform = setting(factory=Platform, hash=Hash.ALWAYS,
                                 doc="where the points run")
    report: Report = setting(factory=Report, hash=Hash.NEVER,
                             doc="how the study's figures and tables are exported")
    microbench: Microbench = setting(
        factory=Microbench, hash=Hash.NEVER,
        doc="building-block measurements (matmul, collectives) that feed the performance model")
    predict: Predict = setting(
        factory=Predict, hash=Hash.NEVER, schema=PREDICT_FORM,
        doc="the performance model inside the study (a CPU study's predict job)")
    profile: Profile = setting(
        factory=Profile, hash=Hash.ALWAYS,
        doc="torch.profiler traces of every point's steps after its timed window, read into "
            "the measured breakdown of the step (breakdown.csv, efficiency_loss.csv; "
            "docs/breakdown.md)")
    tune: Tune | None = setting(
        None, hash=Hash.NEVER,
        doc="scalestudy tune STUDY --measure: search the layout of one model on N devices by "
            "measuring it (Optuna; docs/tuning.md). Every trial is a point of the pipeline, "
            "under results/<name>/tune/")
    export: Export = setting(factory=Export, hash=Hash.NEVER,
                             doc="copies of the finished study for experiment trackers "
                                 "(docs/exporting.md)")

    @classmethod
    def from_validated(cls, doc: Mapping) -> "Study":
        """The study of a validated document (``scalestudy.config.study.validate``: schema,
        defaults and semantic checks passed; or a ``study.json`` this version wrote)."""
        kw = {}
        for f, s in settings.declared(cls):
            value, kind = doc.get(f.name), settings.value_type(cls, f.name)
            if value is None and not settings.nullable(cls, f.name):
                continue  # (a study.json written before the section existed: its default)
            if f.name in _FROM_STUDY:
                kw[f.name] = _FROM_STUDY[f.name](value)
            elif value is not None and dataclasses.is_dataclass(kind):  # a section
                kw[f.name] = kind(**value)
            else:
                kw[f.name] = coerce_value(cls, f.name, value)
        return cls(**kw)

    def to_json(self) -> dict:
        """``study.json``: the validated document's keys and values."""
        out = {f.name: json_value(getattr(self, f.name)) for f in fields(self)}
        for f in fields(self):  # a section with a study form of its own
            if hasattr(getattr(self, f.name), "to_study"):
                out[f.name] = getattr(self, f.name).to_study()
        out["models"] = {name: {k: v for k, v in json_value(m).items() if k != "name"}
                         for name, m in self.models.items()}
        out["series"] = [s.to_json() for s in self.series]
        n = self.predict.before_run_max_n
        out["predict"] = {"before_run": None if n is None else {"calibrate_on_max_n": n}}
        if self.tune is None:
            out.pop("tune")
        return out


def _predict(doc: Mapping) -> Predict:
    before = doc["before_run"]
    return Predict(before_run_max_n=before["calibrate_on_max_n"] if before else None)


#: The study's fields whose study form is not their sections' fields (the others: a section
#: from its mapping, a value as its declared type).
_FROM_STUDY = {
    "models": lambda doc: {name: Model(name=name, **m) for name, m in doc.items()},
    "series": lambda doc: tuple(Series.from_validated(s) for s in doc),
    "workload": Workload.from_study,
    "predict": _predict,
    "tune": lambda doc: Tune.from_validated(doc) if doc else None,
}
