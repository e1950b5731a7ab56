"""Parity worker, run under torchrun: trains many layouts one after another in one process
group and compares each with a single-process reference (the plain model, GPT or Llama, +
AdamW + clip_grad_norm_).

    torchrun --nproc-per-node N tests/parity_worker.py OUT_JSON [LAYOUT_NAME ...]

Every layout uses the whole world (pp*dp*tp == N) and the same global batch of GLOBAL_BATCH
rows per step, so they all reproduce the same reference trajectory. Rank 0 writes OUT_JSON:
``{"world": N, "results": [{"name", "world", "collectives", "losses", "ref_losses",
"max_loss_diff", "max_param_diff", "seconds", "error"}]}`` (``collectives``: the first
step's, by op, for a layout of tensor parallelism alone, ``tp_only``; else null).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Train
from scalestudy.distributed.engine import Engine
from scalestudy.distributed.mesh import is_dtensor
from scalestudy.models import build_model
from scalestudy.record.io import write_json
from scalestudy.train.data import SyntheticTokens

CFG = Model(vocab=64, seq_len=16, layers=2, hidden=32, heads=4, mlp="gelu",
            tied_embeddings=False, bias=True)
CFG4 = dataclasses.replace(CFG, layers=4)  # for 4 pipeline stages
STEPS = 5
GLOBAL_BATCH = 8
# the training settings of every layout and of the reference (AdamW betas: the declared
# defaults, the engine taking them from the point)
OPT = Train(seed=0, lr=3e-3, weight_decay=0.01,
            grad_clip=float(os.environ.get("PARITY_GRAD_CLIP", "1.0")) or None)
TRAIN = {k: getattr(OPT, k) for k in ("seed", "lr", "weight_decay", "adam_beta1", "adam_beta2",
                                      "grad_clip")}


def L(model: Model, **kw) -> Point:
    """A point of ``model`` with the fewest micro-batches the schedule allows (grad_accum=1
    without PP, = pp with PP unless given): DTensor dispatch makes each micro-batch costly on
    CPU. Every layout trains the same global batch of GLOBAL_BATCH rows."""
    kw.setdefault("grad_accum", kw.get("pp", 1))
    kw["micro_batch"] = GLOBAL_BATCH // (kw.get("dp", 1) * kw["grad_accum"])
    return Point.for_layout(model, device="cpu", steps=STEPS, warmup_steps=0, **TRAIN, **kw)


TIED_SWIGLU = dataclasses.replace(CFG, tied_embeddings=True, mlp="swiglu")
# Llama-style: RMSNorm, RoPE, grouped-query attention (2 query heads per key/value head),
# SwiGLU, no biases, untied head
LLAMA = Model(arch="llama", vocab=64, seq_len=16, layers=2, hidden=32, heads=4, kv_heads=2)
LLAMA4 = dataclasses.replace(LLAMA, layers=4)
# uneven pipeline stages (parallel.pp_partition): 3 and 5 layers
CFG3 = dataclasses.replace(CFG, layers=3)
CFG5 = dataclasses.replace(CFG, layers=5)
LLAMA3 = dataclasses.replace(LLAMA, layers=3)

# name -> point. World size = pp*dp*tp.
LAYOUTS: dict[str, Point] = {
    # world 2
    "dp2-ddp-ga2": L(CFG, dp=2, grad_accum=2),
    "dp2-zero1": L(CFG, dp=2, dp_mode="zero1"),
    "dp2-fsdp-ga2": L(CFG, dp=2, dp_mode="fsdp", grad_accum=2),
    "dp2-fsdp_grad_op": L(CFG, dp=2, dp_mode="fsdp_grad_op"),
    "dp2-ddp-tied-swiglu-acfull": L(TIED_SWIGLU, dp=2, activation_checkpointing="full"),
    "dp2-fsdp-bf16": L(CFG, dp=2, dp_mode="fsdp", precision="bf16"),
    "tp2": L(CFG, tp=2),
    "tp2-sp-ga2": L(CFG, tp=2, sequence_parallel=True, grad_accum=2),
    "tp2-tied-swiglu-acsel": L(TIED_SWIGLU, tp=2, activation_checkpointing="selective"),
    "llama-tp2": L(LLAMA, tp=2),
    "pp2-gpipe": L(CFG, pp=2, pp_schedule="gpipe"),
    "pp2-1f1b-ga4": L(CFG, pp=2, pp_schedule="1f1b", grad_accum=4),
    "pp2v2-interleaved1f1b": L(CFG4, pp=2, pp_schedule="interleaved1f1b", virtual_stages=2),
    "pp2-1f1b-bf16-acsel": L(CFG, pp=2, precision="bf16", activation_checkpointing="selective"),
    "llama-tp2-sp": L(LLAMA, tp=2, sequence_parallel=True),
    "llama-dp2-fsdp-acfull": L(LLAMA, dp=2, dp_mode="fsdp", activation_checkpointing="full"),
    "llama-pp2-1f1b": L(LLAMA, pp=2),
    "llama3-pp2-1f1b-uneven": L(LLAMA3, pp=2, pp_partition=(1, 2)),
    "pp2v2-interleaved-uneven": L(CFG5, pp=2, pp_schedule="interleaved1f1b", virtual_stages=2,
                                  pp_partition=(2, 1, 1, 1)),
    # world 4
    "dp2xtp2-ddp": L(CFG, dp=2, tp=2),
    "dp2xtp2-zero1-sp": L(CFG, dp=2, tp=2, dp_mode="zero1", sequence_parallel=True),
    "dp2xtp2-fsdp": L(CFG, dp=2, tp=2, dp_mode="fsdp"),
    "tp2xpp2-1f1b": L(CFG, tp=2, pp=2, pp_schedule="1f1b"),
    "tp2xpp2v2-interleaved-sp": L(CFG4, tp=2, pp=2, pp_schedule="interleaved1f1b",
                                  virtual_stages=2, sequence_parallel=True),
    "dp2xpp2-gpipe-ddp": L(CFG, dp=2, pp=2, pp_schedule="gpipe"),
    "dp2xpp2-1f1b-zero1": L(CFG, dp=2, pp=2, dp_mode="zero1"),
    "dp2xpp2-1f1b-fsdp_grad_op": L(CFG, dp=2, pp=2, dp_mode="fsdp_grad_op"),
    "dp4-fsdp": L(CFG, dp=4, dp_mode="fsdp"),
    "tp4": L(CFG, tp=4),
    "pp4-1f1b": L(CFG4, pp=4, pp_schedule="1f1b"),
    "dp2xpp2-gpipe-parameters": L(CFG3, dp=2, pp=2, pp_schedule="gpipe",
                                  pp_partition="parameters"),
    "llama-dp2xtp2-zero1-acattn": L(LLAMA, dp=2, tp=2, dp_mode="zero1",
                                    activation_checkpointing="selective_attention"),
    "llama-dp2xpp2v2-ddp-interleaved": L(LLAMA4, dp=2, pp=2, pp_schedule="interleaved1f1b",
                                         virtual_stages=2),
    # world 8
    "dp2xtp2xpp2-zero1-1f1b": L(CFG, dp=2, tp=2, pp=2, dp_mode="zero1"),
    "dp2xtp2xpp2-fsdp-interleaved": L(CFG4, dp=2, tp=2, pp=2, dp_mode="fsdp",
                                      pp_schedule="interleaved1f1b", virtual_stages=2),
    "dp2xtp2xpp2-ddp-gpipe-sp-acfull": L(CFG, dp=2, tp=2, pp=2, pp_schedule="gpipe",
                                         sequence_parallel=True,
                                         activation_checkpointing="full"),
    "llama-dp2xtp2xpp2-fsdp-sp-acsel": L(LLAMA, dp=2, tp=2, pp=2, dp_mode="fsdp",
                                         sequence_parallel=True,
                                         activation_checkpointing="selective"),
}


def reference(cfg: Model) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single process: the mean loss over the global batch, AdamW, global-norm clipping."""
    torch.manual_seed(OPT.seed)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=OPT.lr, betas=OPT.betas,
                            weight_decay=OPT.weight_decay, foreach=True)
    data = SyntheticTokens(cfg.vocab, cfg.seq_len, seed=OPT.seed)
    losses = []
    for step in range(STEPS):
        tok = data.rows(step, 0, GLOBAL_BATCH)
        logits = model(tok[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tok[:, 1:].flatten())
        loss.backward()
        if OPT.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), OPT.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return losses, state


@torch.no_grad()
def gathered_state_dict(eng: Engine) -> dict[str, torch.Tensor]:
    """Collective over the whole world: the engine's full unsharded fp32 parameters on CPU,
    keyed like the single-process model's ``state_dict``."""
    local: dict[str, torch.Tensor] = {}
    for name, p in eng.named_params:
        if is_dtensor(p):
            t = p.full_tensor()
        elif hasattr(p, "_st_info"):  # TP shard localised for DDP (zero1 with tp > 1)
            spec = p._st_info
            from torch.distributed.tensor import DTensor

            t = DTensor.from_local(p.detach(), spec.mesh, spec.placements, run_check=False,
                                   shape=spec.shape, stride=spec.stride).full_tensor()
        else:
            t = p
        local[name] = t.detach().float().cpu().clone()
    if eng.point.pp > 1:
        parts: list = [None] * eng.point.pp
        dist.all_gather_object(parts, local, group=eng.pp_mesh.get_group())
        for part in parts:
            local.update(part)
    if eng.point.model.tied_embeddings and "tok_embeddings.weight" in local:
        local["output.weight"] = local["tok_embeddings.weight"]
    return local


def tp_only(point: Point) -> bool:
    """Every collective of the layout's step is a tensor-parallel all-reduce or gather (no
    DP, PP or sequence parallelism; ``CommDebugMode`` fails GPT's sequence-parallel step)."""
    return (point.tp > 1 and point.dp == 1 and point.pp == 1
            and not point.parallel.sequence_parallel)


def run_layout(point: Point) -> tuple[list[float] | None, dict, dict | None]:
    """(losses, full state, the first step's collectives by op when ``tp_only``: counted by
    PyTorch's ``CommDebugMode``)."""
    from torch.distributed.tensor.debug import CommDebugMode

    eng = Engine(point, torch.device("cpu"))
    data = SyntheticTokens(point.model.vocab, point.seq_len, seed=OPT.seed)
    rows = point.rows_per_rank
    losses, comms = [], None
    for step in range(STEPS):
        batch = data.rows(step, eng.dp_rank * rows, rows)
        if step == 0 and tp_only(point):
            with CommDebugMode() as mode:
                loss = eng.train_step(batch)
            comms = {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}
        else:
            loss = eng.train_step(batch)
        losses.append(None if loss is None else float(loss))
    state = gathered_state_dict(eng)
    eng.close()
    return (losses if losses[0] is not None else None), state, comms


def main() -> None:
    out = sys.argv[1]
    names = sys.argv[2:]
    if os.environ.get("PARITY_STACKS_AFTER_S"):  # dump all stacks of a hung worker
        import faulthandler
        faulthandler.dump_traceback_later(float(os.environ["PARITY_STACKS_AFTER_S"]))
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.set_num_threads(1)
    if not names:
        names = [n for n, p in LAYOUTS.items() if p.n == world]
    refs: dict = {}
    results = []
    for name in names:
        layout = LAYOUTS[name]
        cfg = layout.model
        t0 = time.perf_counter()
        err, comms = None, None
        try:
            losses, state, comms = run_layout(layout)
        except Exception:  # record and move on; a hang is caught by the caller's timeout
            err = traceback.format_exc(limit=8)
            print(f"[parity] rank {rank} {name} failed:\n{err}", file=sys.stderr, flush=True)
            losses, state = None, {}
        seconds = time.perf_counter() - t0
        gathered: list = [None] * world
        dist.all_gather_object(gathered, (losses, err))
        # the engine returns this DP rank's mean; the global batch mean is their average
        # (equal rows per DP rank); ranks with a loss are the last pp stage, tp-replicated
        per_rank = [l for l, _ in gathered if l is not None]
        if rank == 0:
            if cfg not in refs:
                refs[cfg] = reference(cfg)
            ref_losses, ref_state = refs[cfg]
            errs = [e for _, e in gathered if e]
            got = None
            if per_rank:
                n_dp = len(per_rank) // layout.tp
                if n_dp != layout.dp:
                    errs.append(f"{len(per_rank)} ranks returned a loss, expected dp*tp")
                got = [sum(col) / len(col) for col in zip(*per_rank)]
            row = {"name": name, "world": world, "point": layout.to_json(), "seconds": seconds,
                   "collectives": comms, "ref_losses": ref_losses, "losses": got,
                   "error": errs[0] if errs else None, "max_loss_diff": None,
                   "max_param_diff": None}
            if not errs and got is not None:
                row["max_loss_diff"] = max(abs(a - b) for a, b in zip(got, ref_losses))
                missing = sorted(set(ref_state) ^ set(state))
                if missing:
                    row["error"] = f"state keys differ: {missing[:6]}"
                else:
                    diffs = {k: (state[k] - ref_state[k]).abs().max().item() for k in ref_state}
                    row["worst_param"] = max(diffs, key=diffs.get)
                    row["max_param_diff"] = diffs[row["worst_param"]]
            results.append(row)
            print(f"[parity] {name}: loss diff {row['max_loss_diff']} param diff "
                  f"{row['max_param_diff']} ({row.get('worst_param')}) {seconds:.1f}s"
                  + (f"\n{row['error']}" if row["error"] else ""), flush=True)
        dist.barrier()
    if rank == 0:
        write_json(out, {"world": world, "results": results})
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
