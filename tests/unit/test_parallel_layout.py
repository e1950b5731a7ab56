"""One set of rules: the planner's verdict on a layout equals what the engine accepts, with the
same reason text; the layer split; the engine on one process (no DP wrapper, gradient
accumulation, checkpointing) against the single-process reference.

The engine is built for real on torch's fake process group (``FakeStore``: any world size in
one process, collectives are no-ops), so "accepts" means PyTorch's own constructors (DeviceMesh,
parallelize_module, fully_shard, DDP, ZeroRedundancyOptimizer, PipelineStage and the schedules)
take the layout, not only that a rule function says so.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalestudy.config.point import Point  # noqa: E402
from scalestudy.config.parts import Model, Parallel  # noqa: E402
from scalestudy.config.checks import PointError  # noqa: E402
from scalestudy.config.study import validate  # noqa: E402
from scalestudy.config.vocab import DPMode, PPSchedule  # noqa: E402
from scalestudy.distributed.engine import Engine  # noqa: E402
from scalestudy.distributed.pipeline import split_layers  # noqa: E402
from scalestudy.config import partition  # noqa: E402
from scalestudy.config import layout_rules  # noqa: E402
from scalestudy.plan import constraints  # noqa: E402
from scalestudy.plan.planner import plan_points  # noqa: E402
from scalestudy.train.data import SyntheticTokens  # noqa: E402


def test_unknown_vocabulary_is_refused_by_the_typed_point():
    with pytest.raises(PointError, match="dp_mode"):
        Parallel(dp_mode="zero2")
    with pytest.raises(PointError, match="pp_schedule"):
        Parallel(pp_schedule="zb")


def _pp_point(layers: int, pp: int, partition="uniform", v: int = 1, **kw) -> Point:
    model = Model(vocab=16, seq_len=8, hidden=8, heads=2, layers=layers)
    schedule = "interleaved1f1b" if v > 1 else "1f1b"
    return Point.for_layout(model, pp=pp, grad_accum=pp, pp_partition=partition,
                            virtual_stages=v, pp_schedule=schedule, device="cpu", **kw)


def test_split_layers_covers_all_by_the_partition():
    assert split_layers(_pp_point(4, 2)) == [[0, 1], [2, 3]]
    assert sum(split_layers(_pp_point(6, 3)), []) == list(range(6))
    assert split_layers(_pp_point(5, 2, (1, 4))) == [[0], [1, 2, 3, 4]]
    # by parameters: the embeddings and the head weigh on the first and the last stage
    assert partition.stage_layers(_pp_point(5, 2, "parameters")) in ((2, 3), (3, 2))
    assert sum(split_layers(_pp_point(7, 2, "parameters", v=2)), []) == list(range(7))
    with pytest.raises(ValueError, match="equal stages"):
        split_layers(_pp_point(5, 2))


def test_published_partitions_by_parameters():
    """BLOOM-176B (bigscience tr11-176B-ml README: [embed | 5], 6 x 10, [5 | embed]) and
    Llama 3 405B (Dubey et al. 2024 §3.3.2: one layer fewer on the first and the last
    stage)."""
    bloom = Model(name="bloom", layers=70, hidden=14336, heads=112, seq_len=2048, vocab=250880,
                  tied_embeddings=True)
    p = Point.for_layout(bloom, dp=8, tp=4, pp=12, grad_accum=12, pp_partition="parameters",
                         device="cuda")
    assert partition.stage_layers(p) == (5,) + (6,) * 10 + (5,)
    llama = Model(name="l405", arch="llama", layers=126, hidden=16384, heads=128, kv_heads=8,
                  ffn_hidden=53248, seq_len=8192, vocab=128256)
    p = Point.for_layout(llama, dp=64, tp=8, pp=16, grad_accum=32, pp_partition="parameters",
                         device="cuda")
    assert partition.stage_layers(p) == (7,) + (8,) * 14 + (7,)
    assert partition.rank_layers(p)[0] == 7
    assert layout_rules.stages(p) is None


def test_balanced_partition_minimises_the_heaviest_part():
    import itertools as it

    rng = random.Random(1)
    for _ in range(200):
        w = [rng.randint(1, 9) for _ in range(rng.randint(2, 9))]
        k = rng.randint(1, len(w))
        got = partition.balanced(w, k)
        assert len(got) == k and sum(got) == len(w) and min(got) >= 1
        heaviest = max(sum(w[a:b]) for a, b in zip(_cuts(got), _cuts(got)[1:]))
        best = min(max(sum(w[a:b]) for a, b in zip((0, *c), (*c, len(w))))
                   for c in it.combinations(range(1, len(w)), k - 1))
        assert heaviest == best, (w, k, got)


def _cuts(counts):
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def test_partition_errors_name_the_field():
    with pytest.raises(PointError, match=r"parallel\.pp_partition"):
        Parallel(pp_partition=(3, 0))
    with pytest.raises(PointError, match=r"parallel\.pp_partition: 'even'"):
        Parallel(pp_partition="even")
    assert "pp_partition has 3 stages" in constraints.violation(_pp_point(4, 2, (1, 1, 2)))
    assert "holds 5 layers" in constraints.violation(_pp_point(4, 2, (2, 3)))
    assert "fewer than" in constraints.violation(_pp_point(3, 4, "parameters"))


# --- the planner and the engine agree -------------------------------------------------------

TINY = {"vocab": 16, "seq_len": 8, "hidden": 8}


def _study(layers, heads, tied, tp, pp, v, ga, dp, dp_mode, schedule) -> dict:
    """A one-point weak-scaling study of that layout (N = dp·tp·pp)."""
    return validate({
        "name": "grid",
        "models": {"m": {**TINY, "layers": layers, "heads": heads, "tied_embeddings": tied}},
        "platform": {"device": "cpu", "devices_per_node": 8},
        "parallel": {"dp_mode": dp_mode, "pp_schedule": schedule, "virtual_stages": v},
        "series": [{"name": "s", "mode": "weak", "model": "m", "gpus": [dp * tp * pp], "tp": tp,
                    "pp": pp, "micro_batch": 1, "grad_accum": ga}],
    })


def _grid(k: int, seed: int = 0) -> list[tuple]:
    """``k`` layouts drawn (seeded) from the grid of layers, heads, tied, tp, pp, v, ga, dp,
    dp modes and schedules, plus the edge cases each rule is about."""
    axes = ([2, 3, 4], [2, 4], [False, True], [1, 2], [1, 2, 4], [1, 2], [1, 2, 3, 4], [1, 2],
            list(DPMode), list(PPSchedule))
    grid = list(itertools.product(*axes))
    edges = [
        (4, 4, False, 2, 2, 2, 4, 2, DPMode.ZERO1, PPSchedule.INTERLEAVED_1F1B),  # 3-D, 8 ranks
        (4, 4, False, 1, 2, 2, 3, 1, DPMode.DDP, PPSchedule.INTERLEAVED_1F1B),  # torch: 1 round
        (4, 4, False, 1, 4, 1, 4, 1, DPMode.DDP, PPSchedule.ONE_F_ONE_B),
        (4, 4, False, 1, 2, 1, 1, 1, DPMode.DDP, PPSchedule.ONE_F_ONE_B),  # too few micro-batches
        (4, 4, False, 1, 2, 1, 1, 2, DPMode.FSDP, PPSchedule.GPIPE),  # gpipe takes one
        (3, 4, False, 1, 2, 1, 2, 1, DPMode.DDP, PPSchedule.GPIPE),  # uneven split
        (2, 4, True, 2, 1, 1, 1, 2, DPMode.ZERO1, PPSchedule.ONE_F_ONE_B),  # zero1+tp+tied
        (2, 2, False, 4, 1, 1, 1, 1, DPMode.DDP, PPSchedule.ONE_F_ONE_B),  # tp > heads
    ]
    return edges + random.Random(seed).sample(grid, k)


GRID = _grid(150)


@pytest.fixture
def fake_world():
    """``init(world)``: a fresh fake process group of ``world`` ranks (this process is 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def init(world: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)

    yield init
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("layout", GRID, ids=lambda t: "-".join(map(str, t)))
def test_planner_verdict_equals_what_the_engine_accepts(layout, fake_world):
    (point,) = plan_points_or_none(_study(*layout))
    if point.feasible:
        fake_world(point.n)
        engine = Engine(point, torch.device("cpu"))  # raises if PyTorch refuses the layout
        assert len(engine.chunks) == point.parallel.virtual_stages
        engine.close()
    else:
        with pytest.raises(layout_rules.Infeasible) as refused:
            Engine(point, torch.device("cpu"))
        assert str(refused.value) == point.reason


def plan_points_or_none(study: dict) -> list[Point]:
    """The planner's points; a study with no feasible point is refused as a whole, so plan it
    with the verdict of that one point instead (the same rule sentence)."""
    from scalestudy.config.study_yaml import StudyError

    try:
        return plan_points(study)
    except StudyError:
        from scalestudy.plan.planner import series_points

        return series_points(study, study.series[0])


def test_the_grid_has_both_verdicts():
    verdicts = {plan_points_or_none(_study(*t))[0].feasible for t in GRID}
    assert verdicts == {True, False}


# --- one process against the reference ------------------------------------------------------

@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ac", ["none", "full", "selective", "selective_attention"])
def test_single_process_engine_matches_reference(single_process_group, ac):
    from parity_worker import (CFG, GLOBAL_BATCH, OPT, STEPS, TRAIN, gathered_state_dict,
                               reference)
    ref_losses, ref_state = reference(CFG)
    point = Point.for_layout(CFG, micro_batch=2, grad_accum=GLOBAL_BATCH // 2,
                             activation_checkpointing=ac, device="cpu", **TRAIN)
    eng = Engine(point, torch.device("cpu"))
    data = SyntheticTokens(CFG.vocab, CFG.seq_len, seed=OPT.seed)
    losses = [eng.train_step(data.rows(s, 0, GLOBAL_BATCH)) for s in range(STEPS)]
    assert all(isinstance(x, torch.Tensor) and x.dim() == 0 and not x.requires_grad
               for x in losses)
    assert max(abs(float(a) - b) for a, b in zip(losses, ref_losses)) < 1e-5
    state = gathered_state_dict(eng)
    assert set(state) == set(ref_state)
    assert max((state[k] - ref_state[k]).abs().max().item() for k in state) < 2e-4
    eng.close()


def test_math_attention_kernel_trains_the_same_model():
    from parity_worker import CFG, reference

    losses, _ = reference(CFG)
    math_losses, _ = reference(dataclasses.replace(CFG, attention="math"))
    assert max(abs(a - b) for a, b in zip(losses, math_losses)) < 1e-4


def test_the_ddp_bucket_setting_reaches_distributed_data_parallel(single_process_group):
    from scalestudy.distributed.data_parallel import distributed_data_parallel

    group = dist.group.WORLD
    sized = distributed_data_parallel(torch.nn.Linear(8, 8), group, torch.device("cpu"),
                                      bucket_cap_mb=1.5)
    default = distributed_data_parallel(torch.nn.Linear(8, 8), group, torch.device("cpu"))
    assert sized.bucket_bytes_cap == int(1.5 * 1024 * 1024)
    assert default.bucket_bytes_cap == 25 * 1024 * 1024  # torch's own
