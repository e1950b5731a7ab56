"""A run's records checked against its point (``point.json``): the tokens of every step, the
summary's tokens and steps, the world size and the layout a record states. Pure: the records
are read by ``scalestudy.record.run_records``, which calls these (:func:`point_facts`, then
:func:`step_vs_point`, :func:`summary_vs_point`, :func:`env_vs_point`)."""

from __future__ import annotations

from dataclasses import dataclass

from scalestudy.record.loss import NONFINITE_KEY, diverged
from scalestudy.record.bounded_read import is_int, is_number, positive, show

#: The layout sizes a record may state (``env.json``'s or ``summary.json``'s ``layout``).
LAYOUT_KEYS = ("dp", "tp", "pp", "cp")


@dataclass(frozen=True)
class PointFacts:
    """What a run's records must show, from its ``point.json`` (None: not known). Units:
    ``global_batch`` sequences, ``seq_len`` tokens, ``n`` ranks (the world size)."""

    steps: int | None = None
    global_batch: int | float | None = None
    seq_len: int | None = None
    n: int | None = None
    layout: tuple[tuple[str, int | float], ...] = ()

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens of one optimizer step, all ranks together: global batch x seq len."""
        if self.global_batch is None or self.seq_len is None:
            return None
        return self.global_batch * self.seq_len


def point_facts(point: dict | None) -> PointFacts | None:
    """The :class:`PointFacts` of a ``point.json`` object checked by :func:`check_point`
    (None: no point); a field of another type is left unknown."""
    if not point:
        return None
    model = point.get("model") if isinstance(point.get("model"), dict) else {}
    train = point.get("train") if isinstance(point.get("train"), dict) else {}

    def count(v):
        return v if positive(v) else None
    seq = model.get("seq_len", point.get("seq_len"))
    sizes = {k: point.get(k, 1 if k == "cp" else None) for k in LAYOUT_KEYS}  # (cp 1: absent)
    return PointFacts(
        steps=train.get("steps") if is_int(train.get("steps")) else None,
        global_batch=count(point.get("global_batch")),
        seq_len=seq if is_int(seq) and seq > 0 else None, n=count(point.get("n")),
        layout=tuple((k, v) for k, v in sizes.items() if positive(v)))


def _differs(have, want) -> bool:
    """A stated count that is not the point's (to a relative 1e-9: JSON floats)."""
    return not is_number(have) or abs(have - want) > 1e-9 * abs(want)


def _batch_words(facts: PointFacts) -> str:
    return f"global_batch {_count_or_shown(facts.global_batch)} x seq_len {facts.seq_len}"


def _count_or_shown(x) -> str:
    return str(int(x)) if is_number(x) and float(x).is_integer() else show(x)


def step_vs_point(rec: dict, facts: PointFacts, source: str = "steps.jsonl") -> str | None:
    """Why one ``steps.jsonl`` line is not a step of the point (None: it is one): its
    ``tokens`` are not global batch x seq len; its optional ``global_batch`` / ``seq_len``
    are not the point's; its per-rank ``rank_energy_j`` lists another number of ranks than
    the point's ``n``."""
    step, want = rec.get("step"), facts.tokens_per_step
    if want is not None and _differs(rec.get("tokens"), want):
        return (f"{source}: step {step} trained {_count_or_shown(rec.get('tokens'))} tokens, the point "
                f"trains {_count_or_shown(want)} per step ({_batch_words(facts)})")
    for key in ("global_batch", "seq_len"):
        want = getattr(facts, key)
        if key in rec and want is not None and _differs(rec[key], want):
            return (f"{source}: step {step} states {key} {show(rec[key])}, the point's is "
                    f"{_count_or_shown(want)}")
    ranks = rec.get("rank_energy_j")
    if facts.n is not None and isinstance(ranks, list) and len(ranks) != facts.n:
        return (f"{source}: step {step} has rank_energy_j of {len(ranks)} rank(s), the point "
                f"runs on n={_count_or_shown(facts.n)}")
    return None


def _layout_vs_point(rec: dict, facts: PointFacts, name: str) -> str | None:
    stated = rec.get("layout")
    if not isinstance(stated, dict):
        return None
    for key, want in facts.layout:
        if key in stated and _differs(stated[key], want):
            return (f"{name}: layout {key}={show(stated[key])}, the point's is {key}="
                    f"{_count_or_shown(want)} ({' '.join(f'{k}={_count_or_shown(v)}' for k, v in facts.layout)})")
    return None


def summary_vs_point(s: dict, facts: PointFacts, name: str = "summary.json") -> str | None:
    """Why a sound ``summary.json`` is not a good run of the point (None: it is): a loss that
    was not finite (``loss_nonfinite``: the run diverged), ``tokens_per_step`` not global
    batch x seq len, ``steps`` not ``train.steps``, a stated world size (``world_size``) or
    ``layout`` not the point's."""
    if s.get(NONFINITE_KEY) is not None:
        return diverged(s.get(f"{NONFINITE_KEY}_step"), s[NONFINITE_KEY])
    want = facts.tokens_per_step
    if want is not None and "tokens_per_step" in s and _differs(s["tokens_per_step"], want):
        return (f"{name}: tokens_per_step {_count_or_shown(s['tokens_per_step'])}, the point trains "
                f"{_count_or_shown(want)} ({_batch_words(facts)})")
    if facts.steps is not None and s.get("steps") is not None and s["steps"] != facts.steps:
        return f"{name}: {s['steps']} steps, the point trains {facts.steps} (train.steps)"
    if facts.n is not None and s.get("world_size") is not None and \
            _differs(s["world_size"], facts.n):
        return (f"{name}: world_size {show(s['world_size'])}, the point runs on "
                f"n={_count_or_shown(facts.n)}")
    return _layout_vs_point(s, facts, name)


def env_vs_point(e: dict, facts: PointFacts, name: str = "env.json") -> str | None:
    """Why a sound ``env.json`` is not the point's run (None: it is): its ``world_size``, its
    number of ``ranks`` or its ``layout`` is not the point's."""
    if facts.n is not None:
        if e.get("world_size") is not None and _differs(e["world_size"], facts.n):
            return (f"{name}: world_size {show(e['world_size'])}, the point runs on "
                    f"n={_count_or_shown(facts.n)} ranks")
        ranks = e.get("ranks")
        if isinstance(ranks, list) and len(ranks) != facts.n:
            return f"{name}: {len(ranks)} ranks recorded, the point runs on n={_count_or_shown(facts.n)}"
    return _layout_vs_point(e, facts, name)
