"""The layouts a tuning search may measure (``tune.space`` of a study), and each one as a
series of the pipeline: one strong-scaling point of the tuned model on ``tune.gpus`` devices,
planned by the planner itself (``plan.planner.series_points``), so that the constraints and the
memory model refuse a layout before anything runs, and a layout measured once keeps its point
id."""

from __future__ import annotations

import itertools
from dataclasses import fields, make_dataclass, replace

from scalestudy.config import settings
from scalestudy.config.parts import TUNED_SETTINGS, section_of
from scalestudy.config.point import Point
from scalestudy.config.settings import coerce_value
from scalestudy.config.studyspec import SHAPE_AXES, Series, Study, Tune
from scalestudy.config.vocab import DPMode, PPSchedule, ScalingMode
from scalestudy.plan.planner import series_points

#: What an axis left out of ``tune.space`` takes besides the divisors of N (tp, pp): the
#: shape's here, the tuned settings' their own (``Setting.tune``, of every section).
DEFAULT_AXES = {"cp": (1,), "micro_batch": (1, 2, 4, 8), **TUNED_SETTINGS}
#: The tuned settings a layout's name spells its own way (:meth:`_Layout.name`); any other
#: tuned setting follows as ``-<label><value>``.
_NAMED = ("pp_schedule", "virtual_stages", "dp_mode", "activation_checkpointing")


def _value(name: str, raw):
    """A tuned setting's value from the search engine's parameter (a word or a number)."""
    t = settings.value_type(section_of(name), name)
    return t(raw) if t in (int, float) else coerce_value(section_of(name), name, raw)


class _Layout:
    """The methods of :class:`TrialLayout` (its fields are made from the declarations)."""

    @property
    def name(self) -> str:
        """The layout as a series name (also the search's trial label): readable, unique."""
        sched = "" if self.pp == 1 else f"-{self.pp_schedule}" + (
            f"v{self.virtual_stages}" if self.virtual_stages > 1 else "")
        more = "".join(f"-{_label(k)}{getattr(self, k)}" for k in TUNED_SETTINGS
                       if k not in _NAMED)
        return (f"tp{self.tp}-pp{self.pp}" + (f"-cp{self.cp}" if self.cp > 1 else "")
                + f"-mb{self.micro_batch}{sched}-{self.dp_mode}-ac{self.activation_checkpointing}"
                + more)

    def params(self) -> dict:
        """The layout as the search engine's parameters (words and counts)."""
        return {f.name: (str(v) if isinstance(v, str) else v)
                for f in fields(self) for v in [getattr(self, f.name)]}

    @classmethod
    def from_params(cls, params: dict) -> "TrialLayout":
        shape = {k: int(params[k]) for k in SHAPE_AXES}
        return cls(**shape, **{k: _value(k, params[k]) for k in TUNED_SETTINGS})

    def canonical(self, n: int) -> "TrialLayout | None":
        """The layout that runs the same thing, with the axes that do not apply set to one
        value (no pipeline: 1f1b, one stage; no interleaving: one stage; one data-parallel
        rank: ddp); None when the values contradict each other (interleaving with one stage
        per rank) or the shape does not divide N."""
        if n % (self.tp * self.pp * self.cp):
            return None
        dp = n // (self.tp * self.pp * self.cp)
        interleaved = self.pp_schedule == PPSchedule.INTERLEAVED_1F1B
        if self.pp > 1 and interleaved != (self.virtual_stages > 1):
            return None
        out = self
        if self.pp == 1:
            out = replace(out, pp_schedule=PPSchedule.ONE_F_ONE_B, virtual_stages=1)
        if dp == 1:
            out = replace(out, dp_mode=DPMode.DDP)
        return out

    def series(self, tune: Tune, model: str | None = None) -> Series:
        """The layout as a one-point strong-scaling series of the study."""
        return Series(name=self.name, mode=ScalingMode.STRONG, model=model or tune.model,
                      gpus=(tune.gpus,), micro_batch=self.micro_batch, tp=self.tp, pp=self.pp,
                      cp=self.cp, grad_accum=1, global_batch=tune.global_batch,
                      settings={k: getattr(self, k) for k in TUNED_SETTINGS})


def _label(name: str) -> str:
    label = settings.meta(section_of(name), name).label
    return name if label is None else label


#: One parallel layout of the tuned model on N devices: the shape (:data:`SHAPE_AXES`:
#: counts), then one field per tuned setting of any section (``parts.TUNED_SETTINGS``), made
#: from those declarations.
TrialLayout = make_dataclass(
    "TrialLayout", [(k, "int") for k in SHAPE_AXES] + [(k, "object") for k in TUNED_SETTINGS],
    bases=(_Layout,), frozen=True, order=True,
    namespace={"__doc__": "One layout of the tuned model on N devices (the shape, then one "
                          "field per tuned setting).", "__module__": __name__})


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def axis_values(tune: Tune) -> dict[str, tuple]:
    """Every axis of the search with its values: the study's ``tune.space``, and for an axis
    left out every value the trainer has (tp and pp: the divisors of N; the rest
    :data:`DEFAULT_AXES`)."""
    out = {}
    for f in fields(TrialLayout):
        given = getattr(tune.space, f.name)
        out[f.name] = tuple(given if given is not None else
                            _divisors(tune.gpus) if f.name in ("tp", "pp") else
                            DEFAULT_AXES[f.name])
    return out


def layouts(tune: Tune) -> list[TrialLayout]:
    """The distinct layouts of the space (canonical, sorted): every combination of the axes'
    values that divides N and does not contradict itself."""
    axes = axis_values(tune)
    found = set()
    for combo in itertools.product(*axes.values()):
        lay = TrialLayout(**dict(zip(axes, combo))).canonical(tune.gpus)
        if lay is not None:
            found.add(lay)
    return sorted(found, key=lambda x: x.name)


def planned(study: Study, lays: list[TrialLayout]) -> dict[TrialLayout, Point]:
    """Each layout as the planner plans it in ``study`` (no repeat, no id): ``feasible`` and,
    when not, the constraint or the memory model's ``reason``."""
    return {lay: series_points(study, lay.series(study.tune))[0] for lay in lays}


def rung_study(study: Study, lays: list[TrialLayout], steps: int) -> Study:
    """The study that measures ``lays`` at ``steps`` optimizer steps: the tuning study's
    model, training, parallel, platform and workload, one series per layout, named
    ``<study>-s<steps>`` (its results folder). Warm-up steps are kept, capped so that at least
    two steps are timed."""
    train = replace(study.train, steps=steps,
                    warmup_steps=min(study.train.warmup_steps, max(0, steps - 2)))
    name = f"{study.name[:56]}-s{steps}"
    return replace(study, name=name, series=tuple(lay.series(study.tune) for lay in lays),
                   train=train, predict=replace(study.predict, before_run_max_n=None),
                   microbench=replace(study.microbench, enabled=False), tune=None,
                   description=f"trials of `scalestudy tune --measure` on {study.name} "
                               f"at {steps} steps")


def rungs(tune: Tune, full_steps: int) -> list[int]:
    """The fidelity rungs (optimizer steps per run): ``min_steps``, ``eta`` times as many, ...,
    then ``full_steps`` (the study's ``train.steps``); one rung when there is no
    ``min_steps`` or it is not below ``full_steps``."""
    if tune.min_steps is None or tune.min_steps >= full_steps:
        return [full_steps]
    out, s = [], tune.min_steps
    while s < full_steps:
        out.append(s)
        s *= tune.eta
    return out + [full_steps]
