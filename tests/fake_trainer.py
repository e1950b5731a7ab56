"""A stand-in for a foreign trainer, for the runner's command-workload tests (no torch import:
cheap under torchrun). Rank 0 reports ``--steps`` steps of ``--global-batch`` sequences:

    fake_trainer.py MODE --steps S --global-batch B --seq-len L

MODE ``megatron``: prints Megatron-LM's training_log line per iteration (core_v0.6 format,
as in NVIDIA/Megatron-LM issue #756); ``steps``: writes steps.jsonl through
scalestudy.train.metrics.StepLogger; ``nothing``: reports nothing; ``argv``: writes its argv
to argv.json in $SCALESTUDY_POINT_DIR.
"""

import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("mode")
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--global-batch", type=int, required=True)
ap.add_argument("--seq-len", type=int, required=True)
a, rest = ap.parse_known_args()
rank = int(os.environ.get("RANK", 0))
out = os.environ["SCALESTUDY_POINT_DIR"]

if a.mode == "megatron" and rank == 0:
    for it in range(1, a.steps + 1):
        ms = 20.0 + (5.0 if it == 1 else 0.0) + it % 3
        print(f" [2024-04-06 02:59:36] iteration {it:8d}/{a.steps:8d} | consumed samples: "
              f"{it * a.global_batch:12d} | elapsed time per iteration (ms): {ms:.1f} | "
              f"throughput per GPU (TFLOP/s/GPU): 1.0 | learning rate: 8.600000E-06 | "
              f"global batch size: {a.global_batch:5d} | lm loss: {6.0 - 0.1 * it:.6E} | "
              "loss scale: 1.0 | grad norm: 1.426 | number of skipped iterations:   0 | "
              "number of nan iterations:   0 |", flush=True)
elif a.mode == "steps":
    from scalestudy.train.metrics import StepLogger

    log = StepLogger(tokens_per_step=a.global_batch * a.seq_len)
    for i in range(a.steps):
        with log.step() as s:
            time.sleep(0.001)
            s.loss = 5.0 - 0.1 * i
    if rank == 0:
        log.close()
elif a.mode == "argv" and rank == 0:
    with open(os.path.join(out, "argv.json"), "w") as f:
        json.dump(sys.argv[1:], f)
