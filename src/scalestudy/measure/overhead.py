"""Framework overhead per micro-batch and per layer (``microbench overhead``), measured on a
degenerate GPT whose arithmetic is negligible."""

from __future__ import annotations

import time

from scalestudy.config.parts import Model


def bench_overhead(layers=(1, 4), samples: int = 15, warmup: int = 3,
                   layouts=("plain", "tp")) -> list[dict]:
    """Per-operation framework overhead, measured on a degenerate GPT (hidden 8, seq 8,
    vocab 16, one sequence: its arithmetic is negligible, so the time is dispatch, autograd
    and optimizer bookkeeping). ``layouts``: ``plain`` tensors, and ``tp``: the model under
    ``scalestudy.parallel.tensor_parallelize`` on a one-rank mesh, i.e. DTensor's per-op
    dispatch without any communication (the collectives are modelled apart). The optimizer
    phase is gradient clipping + AdamW step + zero_grad, as the trainer does. Rows ``layout,
    phase (fwd_bwd | optimizer), layers, sample, seconds``; a linear fit over ``layers``
    gives a fixed and a per-layer cost per layout."""
    import tempfile

    import torch.distributed as dist

    from scalestudy.models.gpt import GPT

    rows = []
    own_group = "tp" in layouts and not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        if own_group:  # a one-rank group through a file store: no port, no peer
            dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1),
                                    rank=0, world_size=1)
        try:
            for layout in layouts:
                for L in layers:
                    rows += _overhead_samples(GPT, Model(vocab=16, seq_len=8, layers=L,
                                                         hidden=8, heads=2),
                                              layout, samples, warmup)
        finally:
            if own_group:
                dist.destroy_process_group()
    return rows


def _overhead_samples(GPT, cfg, layout: str, samples: int, warmup: int) -> list[dict]:
    import torch

    from scalestudy.distributed.clipping import clip_grad_norm_
    from scalestudy.distributed.tensor_parallel import tensor_parallelize

    torch.manual_seed(0)
    model = GPT(cfg)
    if layout == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        tensor_parallelize(model, init_device_mesh("cpu", (1,)), False, cfg.tied_embeddings)
    elif layout != "plain":
        raise ValueError(f"overhead layout {layout!r} is not supported; use plain or tp")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    x = torch.randint(cfg.vocab, (1, cfg.seq_len + 1))
    rows = []
    for i in range(warmup + samples):
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab).float(),
                                                 x[:, 1:].reshape(-1))
        loss.backward()
        t1 = time.perf_counter()
        clip_grad_norm_(params, 1.0, torch.device("cpu"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if i >= warmup:
            base = {"layout": layout, "layers": cfg.layers, "sample": i - warmup}
            rows.append(base | {"phase": "fwd_bwd", "seconds": t1 - t0})
            rows.append(base | {"phase": "optimizer", "seconds": t2 - t1})
    return rows
