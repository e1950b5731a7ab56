"""The search engine behind one small adapter: an Optuna study (its TPE or random sampler,
its successive-halving pruner), kept in a journal file so that a search interrupted at any
point goes on where it stopped.

The search maximises tokens/s per device. A layout the constraints or the memory model refuse,
and a run that failed (out of memory, timeout, crash), are told as zero throughput: a layout
that cannot train delivers nothing, and the sampler learns to avoid its region (Optuna's
samplers ignore failed trials, so a failure told as such would teach it nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scalestudy.config.studyspec import Tune
from scalestudy.config.vocab import Sampler
from scalestudy.tune.space import TrialLayout

#: The user attribute naming a trial's layout (its series name) in the journal.
LAYOUT_ATTR = "layout"
#: The user attribute marking a warm-start trial (the model's prediction, enqueued).
WARM_ATTR = "warm_start"


@dataclass
class Trial:
    """One trial the engine handed out: its number, its layout (None when the sampled values
    contradict each other) and Optuna's own trial object."""

    number: int
    layout: TrialLayout | None
    handle: object  # optuna.trial.Trial
    warm_start: bool = False
    reported: dict | None = None  # {steps: tokens/s per device} reported before (a resumed trial)


class SearchEngine:
    """An Optuna study over the layout axes ``axes`` (name -> values), maximising tokens/s
    per device, in ``journal`` (created, or loaded when it exists)."""

    def __init__(self, tune: Tune, axes: dict[str, tuple], journal: Path, rungs: list[int],
                 name: str):
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.axes = {k: tuple(str(v) if isinstance(v, str) else v for v in vs)
                     for k, vs in axes.items()}
        if tune.sampler == Sampler.TPE:
            # the warm-start trials are the first observations: TPE models from there on
            sampler = optuna.samplers.TPESampler(seed=tune.seed, multivariate=True,
                                                 n_startup_trials=max(2, tune.warm_start))
        else:
            sampler = optuna.samplers.RandomSampler(seed=tune.seed)
        pruner = (optuna.pruners.SuccessiveHalvingPruner(
            min_resource=rungs[0], reduction_factor=tune.eta, min_early_stopping_rate=0)
            if len(rungs) > 1 else optuna.pruners.NopPruner())
        journal.parent.mkdir(parents=True, exist_ok=True)
        storage = JournalStorage(JournalFileBackend(str(journal)))
        self.study = optuna.create_study(storage=storage, study_name=name,
                                         direction="maximize", sampler=sampler, pruner=pruner,
                                         load_if_exists=True)

    def fresh(self) -> bool:
        """Whether the journal holds no trial yet (a new search)."""
        return not self.study.trials

    def enqueue(self, layout: TrialLayout) -> None:
        """Have the next trial measure ``layout`` (a warm start)."""
        self.study.enqueue_trial(layout.params(), user_attrs={WARM_ATTR: True},
                                 skip_if_exists=True)

    def ask(self) -> Trial:
        """The next trial: the sampler's values of every axis (an enqueued layout first)."""
        t = self.study.ask()
        params = {k: t.suggest_categorical(k, vs) for k, vs in self.axes.items()}
        return self._trial(t, params)

    def _trial(self, t, params: dict) -> Trial:
        lay = TrialLayout.from_params(params)
        t.set_user_attr(LAYOUT_ATTR, lay.name)
        return Trial(t.number, lay, t, bool(t.user_attrs.get(WARM_ATTR)))

    def unfinished(self) -> list[Trial]:
        """The trials a previous search asked for and never finished (it was interrupted), with
        the values each reported (``reported``): the search goes on with them."""
        import optuna

        out = []
        for fz in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            t = optuna.trial.Trial(self.study, fz._trial_id)
            out.append(Trial(fz.number, TrialLayout.from_params(fz.params), t,
                             bool(fz.user_attrs.get(WARM_ATTR)), dict(fz.intermediate_values)))
        return out

    def report(self, trial: Trial, steps: int, value: float) -> bool:
        """Report ``value`` at fidelity ``steps``; whether the trial goes on to the next rung
        (the pruner's decision)."""
        trial.handle.report(value, steps)
        return not trial.handle.should_prune()

    def tell(self, trial: Trial, value: float) -> None:
        """The trial's final value (tokens/s per device at full length; 0: it failed)."""
        self.study.tell(trial.handle, value)

    def prune(self, trial: Trial, steps: int | None = None, value: float | None = None) -> None:
        """End the trial as pruned; with ``steps`` and ``value``, having reported that rate at
        that fidelity first (a duplicate of a layout pruned there)."""
        import optuna

        if steps is not None:
            trial.handle.report(value, steps)
        self.study.tell(trial.handle, state=optuna.trial.TrialState.PRUNED)
