"""A DeepSpeed ZeRO stage 1 training script (the Frontier study's optimizer sharding), run as a
command workload on CPU processes: DeepSpeed's own engine (``deepspeed.initialize``), its CPU
accelerator (``DS_ACCELERATOR=cpu``) and gloo. The model is the point's (scalestudy's Llama
from ``$SCALESTUDY_POINT_JSON``), the data scalestudy's synthetic token stream; the metrics go
through ``StepLogger`` into ``steps.jsonl``.

    torchrun --nproc-per-node 2 tests/ds_train.py   # under scalestudy: $SCALESTUDY_POINT_JSON
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scalestudy.config.point import Point  # noqa: E402
from scalestudy.models import build_model  # noqa: E402
from scalestudy.train.data import SyntheticTokens  # noqa: E402
from scalestudy.train.metrics import StepLogger  # noqa: E402


def main() -> None:
    point = Point.from_json(json.loads(open(os.environ["SCALESTUDY_POINT_JSON"]).read()))
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(point.train.seed)
    model = build_model(point.model)
    config = {"train_micro_batch_size_per_gpu": point.micro_batch,
              "gradient_accumulation_steps": point.grad_accum,
              "train_batch_size": point.global_batch,
              "zero_optimization": {"stage": 1}, "gradient_clipping": 1.0,
              "steps_per_print": 10**9}
    optimizer = torch.optim.AdamW(model.parameters(), lr=point.train.lr,
                                  weight_decay=point.train.weight_decay)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    data = SyntheticTokens(point.model.vocab, point.seq_len, seed=point.train.seed)
    log = StepLogger(tokens_per_step=point.tokens_per_step)
    for step in range(point.train.steps):
        with log.step() as s:
            total = 0.0
            for micro in range(point.grad_accum):
                start = (micro * world + rank) * point.micro_batch
                rows = data.rows(step, start, point.micro_batch)
                logits = engine(rows[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten())
                engine.backward(loss)
                engine.step()  # DeepSpeed steps the optimizer at the accumulation boundary
                total += loss.item() / point.grad_accum
            s.loss = total
    log.close()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
