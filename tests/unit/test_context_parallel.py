"""Context parallelism (cp) and uneven pipeline stages in the step model (hand computations),
and the engine's cp path on torch's fake process group.

torch's ``context_parallel`` cannot train on CPU (torch 2.13, gloo): its ring attention has
sharding rules for the CUDA SDPA kernels only, so the CPU kernel fails with
"aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy
registered" (the math kernel: "aten.add.Tensor got mixed torch.Tensor and DTensor"). The
engine test below asserts exactly that failure, which also proves the step goes through
torch's context parallelism; parity of cp layouts needs a CUDA machine.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scalestudy.config.point import Point  # noqa: E402
from scalestudy.config.parts import Model  # noqa: E402
from scalestudy.measure.memory import memory_point  # noqa: E402
from scalestudy.config import flops  # noqa: E402
from scalestudy.config import partition  # noqa: E402
from scalestudy.perf import rates, stepmodel, terms_comm as comm  # noqa: E402
from scalestudy.config import layout_rules  # noqa: E402
from scalestudy.plan import constraints  # noqa: E402
from test_parallel_layout import fake_world  # noqa: E402,F401 (the fake process group fixture)
from test_stepmodel_terms import hw_  # noqa: E402 (the declared test system)

MODEL = dict(vocab=1000, seq_len=128, layers=8, hidden=256, heads=8)


def point(dp=1, tp=1, pp=1, cp=1, mb=2, m=1, model=MODEL, **kw):
    p = memory_point(dict(model), mb, "none", dp=dp, tp=tp, pp=pp, grad_accum=m, **kw)
    return p.replace(cp=cp, n=p.n * cp, platform=dataclasses.replace(p.platform, device="cuda"))


def test_cp_exchange_by_hand():
    hw = hw_()
    m = Model(**MODEL)
    nbytes = 2 * 2 * 128 * 256 / 2 * 4  # K and V of b=2 rows of s=128 tokens, kv_dim/tp, fp32
    want = (2 * rates.collective_time("all_gather", nbytes, 4, hw.intra)
            + rates.collective_time("reduce_scatter", nbytes, 4, hw.intra))
    assert comm.cp_exchange_seconds(m, 128, 2, 2, 4, 4, hw) == pytest.approx(want)
    assert nbytes == 262144
    # all_gather on the intra link: alpha + (p-1)/p n / bw
    assert rates.collective_time("all_gather", nbytes, 4, hw.intra) == pytest.approx(
        1e-5 + 0.75 * nbytes / hw.intra.bw(4, True))
    # cp*tp beyond a node: the inter-node link
    far = comm.cp_exchange_seconds(m, 128, 2, 4, 4, 4, hw)
    assert far == pytest.approx(3 * (1e-4 + 0.75 * (nbytes / 2) / hw.inter.bw(4, True)))
    assert comm.cp_exchange_seconds(m, 128, 2, 1, 1, 4, hw) == 0.0


def test_cp_divides_the_compute_keeps_the_flops_and_adds_the_exchange():
    hw = hw_()
    base = point(dp=1, mb=2, m=2)
    two = point(dp=1, cp=2, mb=2, m=2)
    assert two.n == 2 and two.dp == 1 and two.global_batch == base.global_batch
    b1, b2 = stepmodel.predict_step_time(base, hw), stepmodel.predict_step_time(two, hw)
    assert b2.model_flops_per_step == b1.model_flops_per_step  # FLOPs unchanged by cp
    assert b2.gemm_s == pytest.approx(b1.gemm_s / 2)
    assert b2.attention_s == pytest.approx(b1.attention_s / 2)
    t_cp = comm.cp_exchange_seconds(Model(**MODEL), 128, 2, 1, 2, 4, hw)
    assert b2.cp_comm_s == pytest.approx(2 * 8 * t_cp)  # m micro-batches x 8 layers
    assert b1.cp_comm_s == 0.0
    assert sum(b2.terms().values()) == pytest.approx(b2.step_time_s)


def test_uneven_stages_make_the_heavier_one_the_bottleneck():
    hw = hw_()
    even = point(pp=2, m=4)

    def split(counts):
        return even.replace(parallel=dataclasses.replace(even.parallel, pp_partition=counts))

    assert partition.rank_layers(split((3, 5))) == [3, 5]
    e, u, w = (stepmodel.predict_step_time(p, hw) for p in (even, split((3, 5)), split((2, 6))))
    assert u.bottleneck_stage == w.bottleneck_stage == 1
    # one layer more on the bottleneck stage costs the same m layer-slots each time
    assert u.gemm_s - e.gemm_s == pytest.approx(w.gemm_s - u.gemm_s)
    assert u.gemm_s > e.gemm_s and u.step_time_s > e.step_time_s
    # the lighter first stage: a stage with fewer layers is never the bottleneck
    light = stepmodel.predict_step_time(split((5, 3)), hw)
    assert light.bottleneck_stage == 0


def test_cp_rules():
    p = point(cp=2)
    assert layout_rules.context(p) is None
    cpu = p.replace(platform=dataclasses.replace(p.platform, device="cpu"))
    assert "needs device cuda" in layout_rules.context(cpu)
    assert "aten._scaled_dot_product_flash_attention_for_cpu" in layout_rules.context(cpu)
    odd = point(cp=3)
    assert layout_rules.context(odd) == (
        "cp=3 needs 2*cp=6 to divide seq_len=128 (the load-balanced chunks of every sequence)")
    math_ = point(cp=2, model=dict(MODEL, attention="math"))
    assert "attention fused" in layout_rules.context(math_)
    assert layout_rules.mesh(point(cp=2).replace(n=3)) == "N=3 is not divisible by cp*tp*pp=2"


# --- the engine on torch's fake process group ------------------------------------------------

TINY = Model(vocab=64, seq_len=16, layers=2, hidden=32, heads=4)


@pytest.mark.parametrize("arch,layout", [
    ("gpt", dict(dp=2, cp=2)), ("llama", dict(cp=2, tp=2)),
    ("gpt", dict(cp=2, pp=2, grad_accum=2)), ("llama", dict(dp=2, cp=2, dp_mode="fsdp")),
])
def test_engine_builds_cp_layouts_and_reaches_torchs_ring_attention(fake_world, arch, layout):
    """PyTorch's constructors take the (pp, dp, cp, tp) mesh, the dp x cp gradient group and
    the schedules; the step enters ``context_parallel`` and stops where torch 2.13 stops on
    CPU (the CPU SDPA kernel has no sharding rule)."""
    from scalestudy.distributed.engine import Engine, position_buffers

    model = dataclasses.replace(TINY, arch=arch, kv_heads=2 if arch == "llama" else None)
    p = Point.for_layout(model, micro_batch=2, device="cuda", steps=2, warmup_steps=0,
                         **layout)
    assert constraints.violation(p) is None
    fake_world(p.n)
    eng = Engine(p, torch.device("cpu"))
    assert eng.mesh.mesh_dim_names == ("pp", "dp", "cp", "tp")
    assert eng.cp_mesh.size() == 2 and eng.grad_mesh.size() == int(p.dp) * 2
    bufs = [b for m in eng.chunks for b in position_buffers(m)]
    assert bufs and all(b.shape[0] == model.seq_len for b in bufs)
    before = [b.clone() for b in bufs]
    tokens = torch.randint(0, model.vocab, (p.rows_per_rank, model.seq_len + 1))
    with pytest.raises(NotImplementedError, match="_scaled_dot_product_flash_attention_for_cpu"):
        eng.train_step(tokens)
    # the position buffers are restored whole after the step
    assert all(torch.equal(a, b) for a, b in zip(before, bufs))
    eng.close()


def test_position_buffers_index_the_sequence():
    from scalestudy.distributed.engine import position_buffers
    from scalestudy.models import build_model

    gpt = build_model(TINY)
    (pos,) = position_buffers(gpt)
    assert torch.equal(pos, torch.arange(TINY.seq_len))
    llama = build_model(dataclasses.replace(TINY, arch="llama"))
    (rope,) = position_buffers(llama)
    assert rope.shape[0] == TINY.seq_len
    assert "positions" not in gpt.state_dict()  # not persistent: checkpoints are unchanged
    assert flops.param_count(TINY) == sum(q.numel() for q in gpt.parameters())


def test_cp_and_partition_round_trip_through_point_json():
    import json

    p = Point.for_layout(TINY, dp=2, cp=2, pp=2, grad_accum=2, device="cuda",
                         pp_partition=(1, 1))
    doc = json.loads(p.json_text())
    assert doc["cp"] == 2 and doc["parallel"]["pp_partition"] == [1, 1]
    back = Point.from_json(doc)
    assert back == p and back.parallel.pp_partition == (1, 1)
    assert (p.n, p.dp, p.dp_cp) == (8, 2, 4)
    # a point.json written before cp and pp_partition existed reads as cp 1, uniform
    old = {k: v for k, v in doc.items() if k != "cp"}
    old["parallel"] = {k: v for k, v in doc["parallel"].items() if k != "pp_partition"}
    old["n"], old["dp"] = 4, 2
    legacy = Point.from_json(old)
    assert legacy.cp == 1 and legacy.parallel.pp_partition == "uniform"
