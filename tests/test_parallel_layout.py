"""Layout parsing, the engine's layout checks, the layer split, and the engine on one process
(in-process gloo group of size 1: no DP wrapper, gradient accumulation, checkpointing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scalestudy.train.data import SyntheticTokens  # noqa: E402
from scalestudy.models.gpt import GPTConfig  # noqa: E402
from scalestudy.distributed.engine import Engine, Layout, build_mesh, check_layout, split_layers  # noqa: E402

POINT = {
    "n": 8, "dp": 2, "tp": 2, "pp": 2, "micro_batch": 2, "grad_accum": 4,
    "parallel": {"dp_mode": "zero1", "pp_schedule": "interleaved1f1b", "virtual_stages": 2,
                 "sequence_parallel": True, "activation_checkpointing": "selective"},
    "train": {"precision": "bf16", "steps": 3},
}


def test_from_point_reads_top_level_parallel_and_train():
    lay = Layout.from_point(POINT)
    assert (lay.dp, lay.tp, lay.pp, lay.micro_batch, lay.grad_accum) == (2, 2, 2, 2, 4)
    assert lay.dp_mode == "zero1" and lay.pp_schedule == "interleaved1f1b"
    assert lay.virtual_stages == 2 and lay.sequence_parallel
    assert lay.activation_checkpointing == "selective" and lay.precision == "bf16"
    assert lay.world == 8 and lay.stages == 4 and not lay.compile


def test_layout_rejects_unknown_values():
    with pytest.raises(ValueError, match="dp_mode"):
        Layout(dp_mode="zero2")
    with pytest.raises(ValueError, match="micro_batch"):
        Layout(micro_batch=0)


CFG = GPTConfig(vocab=64, seq_len=16, layers=4, hidden=32, heads=4)


@pytest.mark.parametrize("cfg,layout,match", [
    (CFG, Layout(tp=3), "must divide model.heads"),
    (GPTConfig(vocab=63, seq_len=16, layers=4, hidden=32, heads=4), Layout(tp=2),
     "must divide model.vocab"),
    (GPTConfig(vocab=64, seq_len=15, layers=4, hidden=32, heads=4),
     Layout(tp=2, sequence_parallel=True), "seq_len"),
    (GPTConfig(vocab=64, seq_len=16, layers=4, hidden=32, heads=4, tied_embeddings=True),
     Layout(pp=2, grad_accum=2), "tied_embeddings"),
    (CFG, Layout(pp=4, virtual_stages=2, pp_schedule="interleaved1f1b", grad_accum=4),
     "every stage needs at least one layer"),
    (CFG, Layout(pp=2, grad_accum=1), "grad_accum"),
    (GPTConfig(vocab=64, seq_len=16, layers=4, hidden=32, heads=4, tied_embeddings=True),
     Layout(dp=2, tp=2, dp_mode="zero1"), "zero1 with tp > 1"),
    (CFG, Layout(pp=2, grad_accum=2, virtual_stages=2, pp_schedule="1f1b"), "virtual_stages"),
    (CFG, Layout(virtual_stages=2), "needs pp > 1"),
    (CFG, Layout(pp=2, grad_accum=5, virtual_stages=2, pp_schedule="interleaved1f1b"),
     "multiple of"),
])
def test_check_layout_rejects(cfg, layout, match):
    with pytest.raises(ValueError, match=match):
        check_layout(cfg, layout)


def test_check_layout_accepts_gpipe_with_few_microbatches():
    check_layout(CFG, Layout(pp=2, grad_accum=1, pp_schedule="gpipe"))


def test_split_layers_is_even_and_covers_all():
    assert split_layers(4, 2) == [[0, 1], [2, 3]]
    assert split_layers(5, 2) == [[0, 1, 2], [3, 4]]
    assert sum(split_layers(7, 3), []) == list(range(7))


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ac", ["none", "full", "selective"])
def test_single_process_engine_matches_reference(single_process_group, ac):
    from parity_worker import CFG as WCFG, GLOBAL_BATCH, OPT, STEPS, reference
    ref_losses, ref_state = reference(WCFG)
    layout = Layout(micro_batch=2, grad_accum=GLOBAL_BATCH // 2, activation_checkpointing=ac)
    eng = Engine(WCFG, layout, build_mesh(layout, "cpu"), torch.device("cpu"), **OPT)
    data = SyntheticTokens(WCFG.vocab, WCFG.seq_len, seed=OPT["seed"])
    losses = [eng.train_step(data.rows(s, 0, GLOBAL_BATCH)) for s in range(STEPS)]
    assert all(isinstance(l, torch.Tensor) and l.dim() == 0 and not l.requires_grad
               for l in losses)
    assert max(abs(float(a) - b) for a, b in zip(losses, ref_losses)) < 1e-5
    state = eng.gathered_state_dict()
    assert set(state) == set(ref_state)
    assert max((state[k] - ref_state[k]).abs().max().item() for k in state) < 2e-4
    eng.close()
