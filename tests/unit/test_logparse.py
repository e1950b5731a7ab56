"""The log parsers for trainers that cannot write steps.jsonl: Megatron-LM's and torchtitan's
standard step lines and the study's own expressions (scalestudy.run.logparse).

Neither trainer can run here (no GPU, neither is installed), so each preset is tested on log
lines from the trainers' own issue trackers where one was found, else on lines rebuilt from
the trainer's format strings at a tagged version; the source of every line is stated."""

from __future__ import annotations

import pytest

from scalestudy.run import logparse as lp

# --- Megatron-LM -----------------------------------------------------------------------------

# Real, core_v0.6-era format (timestamp, --log-throughput, lr .6E, an MoE run):
# NVIDIA/Megatron-LM issue #756 (2024-04-06), https://github.com/NVIDIA/Megatron-LM/issues/756
MEGATRON_756 = (
    " [2024-04-06 02:59:36] iteration       43/     100 | consumed samples:         5504 | "
    "elapsed time per iteration (ms): 5444.9 | throughput per GPU (TFLOP/s/GPU): 239.8 | "
    "learning rate: 8.600000E-06 | global batch size:   128 | lm loss: 1.825991E+00 | "
    "load_balancing_loss: 1.019746E+00 | loss scale: 1.0 | grad norm: 1.426 | num zeros: 0.0 | "
    "number of skipped iterations:   0 | number of nan iterations:   0 |")
# Real, the older format (no timestamp, lr .3E), from a Megatron fork printing the same
# strings: epfLLM/Megatron-LLM issue #11, https://github.com/epfLLM/Megatron-LLM/issues/11
MEGATRON_EPFL = (
    " iteration      201/  250000 | consumed samples:       205824 | elapsed time per "
    "iteration (ms): 139113.4 | learning rate: 1.507E-05 | global batch size:  1024 | lm loss: "
    "2.373574E+00 | loss scale: 1.0 | grad norm: 0.811 | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |")
# Rebuilt from the format strings of training_log (values invented):
# 23.04 megatron/training.py (commit 2360d732);
MEGATRON_2304 = (
    " iteration      100/    5000 | consumed samples:       102400 | elapsed time per "
    "iteration (ms): 1234.5 | learning rate: 1.500E-04 | global batch size:  1024 | lm loss: "
    "7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |")
# core_v0.16.0 megatron/training/training.py (commit 3bec9aa9): timestamp with microseconds;
MEGATRON_016 = (
    " [2024-04-06 02:59:36.123456] iteration      100/    5000 | consumed samples:       102400 "
    "| elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 389.2 | "
    "learning rate: 1.500000E-04 | global batch size:  1024 | lm loss: 7.123456E+00 | loss "
    "scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number of nan "
    "iterations:   0 |")
# Megatron-DeepSpeed main megatron/training.py (commit f4157bea), its extra fields.
MEGATRON_DEEPSPEED = (
    " iteration      100/    5000 | consumed samples:       102400 | consumed tokens:    "
    "419430400 | elapsed time per iteration (ms): 1234.5 | learning rate: 1.500E-04 | global "
    "batch size:  1024 | lm loss: 7.123456E+00 | loss scale: 1.0 | grad norm: 1.234 | actual "
    "seqlen:  4096 | number of skipped iterations:   0 | number of nan iterations:   0 | samples "
    "per second: 829.500 | tokens per gpu per second (tgs): 3397.600 | TFLOPs: 155.43 |")


@pytest.mark.parametrize("line, step, ms, loss, samples", [
    (MEGATRON_756, 43, 5444.9, 1.825991, 128),
    (MEGATRON_EPFL, 201, 139113.4, 2.373574, 1024),
    (MEGATRON_2304, 100, 1234.5, 7.123456, 1024),
    (MEGATRON_016, 100, 1234.5, 7.123456, 1024),
    (MEGATRON_DEEPSPEED, 100, 1234.5, 7.123456, 1024),
], ids=["issue756", "epfl", "23.04", "core_v0.16", "megatron-deepspeed"])
def test_megatron_lines(line, step, ms, loss, samples):
    [found] = lp.read_lines([line], lp.MEGATRON)
    assert found["step"] == step and found["step_time_ms"] == ms
    assert found["loss"] == pytest.approx(loss) and found["samples"] == samples


def test_megatron_other_lines_are_not_steps():
    lines = ["> building GPT model ...", " > number of parameters on (tensor, pipeline) model "
             "parallel rank (0, 0): 8030261248", "[after training is done] datetime: 2024-04-06",
             " validation loss at iteration 100 | lm loss value: 7.1E+00 | lm loss PPL: 1.2E+03 |"]
    assert lp.read_lines(lines, lp.MEGATRON) == []


def test_megatron_log_interval_and_the_batch_check():
    """A line per --log-interval 10: each is the interval's average, one sample; the first
    interval holds the warm-up steps. The logged global batch must be the point's."""
    lines = [MEGATRON_2304.replace("iteration      100/    5000", f"iteration {it:8d}/      30")
             for it in (10, 20, 30)]
    steps, problem = lp.parse_log(lines, lp.MEGATRON, n=64, seq_len=4096,
                              tokens_per_step=1024 * 4096, warmup_steps=5, steps=30,
                              name="megatron")
    assert problem is None
    assert [(s["step"], s.get("interval"), s["warmup"]) for s in steps] == [
        (10, 10, True), (20, 10, False), (30, 10, False)]
    assert steps[1]["step_time_s"] == pytest.approx(1.2345) and steps[1]["tokens"] == 1024 * 4096
    _, problem = lp.parse_log([MEGATRON_EPFL.replace("/  250000", "/     201")], lp.MEGATRON, n=8,
                          seq_len=2048, tokens_per_step=8 * 2048, warmup_steps=0, steps=201,
                          name="megatron")
    assert "1024 sequences (2097152 tokens) per step at step 201" in problem
    assert "the point trains 16384 tokens per step" in problem


# --- torchtitan ------------------------------------------------------------------------------

# Real, v0.1.0-era format (no grad_norm, loss 7.4f), per-rank prefix of torchrun:
# pytorch/torchtitan PR #1287 (2025-06-16), https://github.com/pytorch/torchtitan/pull/1287
TITAN_1287 = ("[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384"
              "  memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%")
# Real, v0.2.2+ format (grad_norm, loss 8.5f): pytorch/torchtitan PR #2389 (2026-02-24),
# https://github.com/pytorch/torchtitan/pull/2389
TITAN_2389 = ("[titan] 2026-02-24 19:46:17,508 - root - INFO - step:  4  loss:  7.62585  "
              "grad_norm: 26.6250  memory: 66.91GiB(37.51%)  tps: 10,050  tflops: 314.71  "
              "mfu: 13.99%")
# Rebuilt from v0.2.0 torchtitan/components/metrics.py (commit 29624e37) and its colours
# (torchtitan/tools/utils.py Color; values invented): the raw message with escapes;
TITAN_020_COLOUR = ("\x1b[31mstep: 10  \x1b[32mloss:  9.1234  \x1b[38;2;180;60;0mgrad_norm:  "
                    "2.3456  \x1b[38;2;54;234;195mmemory: 61.53GiB(77.72%)  \x1b[34mtps: 7,012  "
                    "\x1b[36mtflops: 406.12  \x1b[35mmfu: 41.07%\x1b[39m")
# main after v0.2.2 (commit b5bcd76c): mfu N/A under FP8/MX;
TITAN_MAIN = ("[titan] 2026-03-01 10:00:00,000 - root - INFO - step: 12  loss:  7.12345  "
              "grad_norm:  1.2500  memory: 40.00GiB(50.00%)  tps: 12,345  tflops: 700.00  "
              "mfu: N/A")
# the validation line of v0.2.0 (same file), which is not a training step.
TITAN_VALIDATE = ("\x1b[33mvalidate step: 10  \x1b[32mloss:  9.1234  \x1b[38;2;54;234;195mmemory:"
                  " 61.53GiB(77.72%)  \x1b[34mtps: 7,012\x1b[39m")


@pytest.mark.parametrize("line, step, loss, tps, gib", [
    (TITAN_1287, 200, 6.1384, 5856, 49.66),
    (TITAN_2389, 4, 7.62585, 10050, 66.91),
    (TITAN_020_COLOUR, 10, 9.1234, 7012, 61.53),
    (TITAN_MAIN, 12, 7.12345, 12345, 40.0),
], ids=["pr1287-v0.1", "pr2389-v0.2.2", "v0.2.0-colour", "main-mfu-na"])
def test_torchtitan_lines(line, step, loss, tps, gib):
    [found] = lp.read_lines([line], lp.TORCHTITAN)
    assert found["step"] == step and found["loss"] == pytest.approx(loss)
    assert found["tokens_per_s_per_device"] == tps and found["peak_memory_gib"] == gib


def test_torchtitan_validation_and_other_lines_are_not_steps():
    lines = [TITAN_VALIDATE, "[titan] 2025-06-16 22:30:00,000 - root - INFO - Training starts "
             "at step 1", "[titan] ... - root - INFO - Model llama3 8B size: 8,030,261,248 total "
             "parameters"]
    assert lp.read_lines(lines, lp.TORCHTITAN) == []


def test_torchtitan_tps_becomes_a_step_time_and_ranks_collapse():
    """tps is tokens per second per device: step time = tokens per step / (tps × N). Every
    rank logs the step: the slowest rank's line is kept."""
    n, tokens = 8, 8 * 8192
    lines = [TITAN_2389.replace("step:  4", f"step:  {s}").replace("tps: 10,050", f"tps: {tps:,}")
             for s, tps in ((1, 4096), (2, 8192), (2, 8000), (3, 8192))]
    steps, problem = lp.parse_log(lines, lp.TORCHTITAN, n=n, seq_len=8192, tokens_per_step=tokens,
                              warmup_steps=1, steps=3, name="torchtitan")
    assert problem is None
    assert [s["step"] for s in steps] == [1, 2, 3] and [s["warmup"] for s in steps] == [True, False, False]
    assert steps[1]["step_time_s"] == pytest.approx(tokens / (8000 * n))  # the slower rank
    assert steps[2]["peak_memory_bytes"] == int(66.91 * 2**30)


# --- the study's own expressions -------------------------------------------------------------

CUSTOM = {"step": r"it (\d+)", "step_time_s": r"([\d.]+) s/it", "loss": r"loss=([\d.]+)",
          "samples": r"bs=(\d+)"}


def test_custom_expressions():
    lines = ["epoch 0", "it 1 | 0.50 s/it | loss=3.0 | bs=4", "it 2 | 0.25 s/it | loss=2.5 | bs=4",
             "it 3 | 0.20 s/it | loss=2.0 | bs=4", "done"]
    steps, problem = lp.parse_log(lines, CUSTOM, n=2, seq_len=16, tokens_per_step=64,
                              warmup_steps=1, steps=3)
    assert problem is None
    assert [(s["step"], s["step_time_s"], s["loss"], s["warmup"]) for s in steps] == [
        (1, 0.5, 3.0, True), (2, 0.25, 2.5, False), (3, 0.2, 2.0, False)]
    # throughput of all ranks, no step numbers: lines are numbered, tokens are the point's
    steps, problem = lp.parse_log(["12,800 tok/s", "25,600 tok/s"], {"tokens_per_s": r"([\d,]+) tok/s"},
                              n=2, seq_len=16, tokens_per_step=256, warmup_steps=1, steps=2)
    assert problem is None and steps[1] == {"step": 2, "step_time_s": 0.01, "loss": None,
                                            "tokens": 256, "warmup": False}


@pytest.mark.parametrize("lines, message", [
    ([], "no line of stdout.log matches the log metrics line"),
    (["it 1 | 0.50 s/it"], "no steady-state step in the log"),
    (["it 1 | 0 s/it", "it 2 | 0 s/it"], "step 1: step time 0.0 s is not a positive number"),
])
def test_missing_or_unusable_metrics_are_a_problem(lines, message):
    _, problem = lp.parse_log(lines, CUSTOM, n=1, seq_len=16, tokens_per_step=64, warmup_steps=1,
                          steps=len(lines) or 1)
    assert problem and problem.startswith(message), problem


def test_unknown_quantity_is_refused():
    with pytest.raises(ValueError, match="unknown quantity 'speed'"):
        lp.read_lines(["x"], {"speed": "(1)"})


# --- what the log says about the run, checked against the point (every preset) ----------------

# Real, recorded on this project's CI host: torchtitan 0.2.2 from PyPI on 2 CPU processes
# (tests/titan_cpu.py, llama3 debugmodel), its start-up line and a step line with the colours
# it prints, where it has no memory statistics.
TITAN_022_INIT = ("[titan] 2026-12-01 19:44:32,031 - root - INFO - Trainer is initialized with "
                  "local batch size 2, global batch size 4, gradient accumulation steps 1, "
                  "sequence length 64, total steps 4 (warmup 1)")
TITAN_022_STEP = ("[titan] 2026-12-01 19:44:36,013 - root - INFO - \x1b[31mstep:  {step}  "
                  "\x1b[32mloss:  8.02153  \x1b[38;2;180;60;0mgrad_norm:  1.1120  "
                  "\x1b[38;2;54;234;195mmemory: -0.00GiB(-100.00%)  \x1b[34mtps: 105  "
                  "\x1b[36mtflops: 0.00  \x1b[35mmfu: 0.00%\x1b[39m")
TITAN_022 = [TITAN_022_INIT] + [TITAN_022_STEP.format(step=s) for s in (1, 2, 3, 4)]
# Megatron-LM's argument dump at start-up, rebuilt from _print_args of
# megatron/training/arguments.py (core_v0.12.0): '  {arg} {dots} {value}', 48 - len(arg) dots.
MEGATRON_ARGS = ["  " + k + " " + "." * (48 - len(k)) + " " + v
                 for k, v in (("global_batch_size", "8"), ("seq_length", "2048"),
                              ("train_iters", "2"), ("decoder_seq_length", "None"))]


def titan_facts(**kw):
    base = dict(n=2, seq_len=64, tokens_per_step=4 * 64, warmup_steps=1, steps=4,
                name="torchtitan")
    return lp.parse_log(TITAN_022, lp.TORCHTITAN, **{**base, **kw})


def test_torchtitan_022_recorded_lines_and_unmeasured_memory():
    steps, problem = titan_facts()
    assert problem is None and [s["step"] for s in steps] == [1, 2, 3, 4]
    assert steps[1]["step_time_s"] == pytest.approx(256 / (105 * 2))
    assert all("peak_memory_bytes" not in s for s in steps)  # -0.00 GiB is not 0 bytes
    found, facts = lp.read_log(TITAN_022, lp.TORCHTITAN)
    assert {(f["name"], f["value"]) for f in facts} == {
        ("global_batch", 4), ("seq_len", 64), ("total_steps", 4)}
    assert "no memory statistics" in lp.unmeasured(found)
    assert lp.unmeasured(lp.read_lines([TITAN_2389], lp.TORCHTITAN)) is None


@pytest.mark.parametrize("kw, says", [
    (dict(tokens_per_step=8 * 64), "says global batch 4"),
    (dict(seq_len=128, tokens_per_step=4 * 128), "says sequence length 64"),
    (dict(steps=5), "says step count 4"),
])
def test_torchtitan_log_that_is_not_the_point(kw, says):
    steps, problem = titan_facts(**kw)
    assert steps == [] and says in problem and "the command does not run the point" in problem


def test_a_log_that_stops_early_is_not_the_point():
    """8 of 10 steps logged (no start-up line to say 10): the last step is not the point's."""
    lines = [TITAN_022_STEP.format(step=s) for s in range(1, 9)]
    _, problem = lp.parse_log(lines, lp.TORCHTITAN, n=2, seq_len=64, tokens_per_step=256,
                          warmup_steps=2, steps=10, name="torchtitan")
    assert problem.startswith("the torchtitan log's last step is 8, the point trains 10 steps")


def test_megatron_arguments_and_the_iteration_total_are_checked():
    line = MEGATRON_EPFL.replace("/  250000", "/       2").replace("1024 |", "8 |")
    lines = MEGATRON_ARGS + [line.replace("iteration      201/", f"iteration {i:8d}/")
                             for i in (1, 2)]
    ok = dict(n=8, seq_len=2048, tokens_per_step=8 * 2048, warmup_steps=1, steps=2,
              name="megatron")
    steps, problem = lp.parse_log(lines, lp.MEGATRON, **ok)
    assert problem is None and len(steps) == 2
    _, facts = lp.read_log(lines, lp.MEGATRON)
    assert sorted((f["name"], f["value"]) for f in facts) == [
        ("global_batch", 8), ("seq_len", 2048), ("total_steps", 2), ("total_steps", 2),
        ("total_steps", 2)]  # decoder_seq_length is not seq_length
    _, problem = lp.parse_log(lines, lp.MEGATRON, **{**ok, "seq_len": 4096,
                                                  "tokens_per_step": 8 * 4096})
    assert "says sequence length 2048" in problem
    _, problem = lp.parse_log(lines, lp.MEGATRON, **{**ok, "steps": 3})
    assert "says step count 2" in problem and "(pass {steps})" in problem


def test_the_studys_own_expressions_may_name_the_facts():
    patterns = {**CUSTOM, "global_batch": r"batch=(\d+) seqs", "seq_len": r"seq=(\d+)"}
    lines = ["config: batch=4 seqs seq=16", "it 1 | 0.50 s/it | loss=3.0",
             "it 2 | 0.25 s/it | loss=2.5"]
    ok = dict(n=1, seq_len=16, tokens_per_step=64, warmup_steps=1, steps=2)
    assert lp.parse_log(lines, patterns, **ok)[1] is None
    _, problem = lp.parse_log(lines, patterns, **{**ok, "tokens_per_step": 128})
    assert problem.startswith("the log says global batch 4 ('config: batch=4 seqs seq=16'), "
                              "the point's is 8 sequences")
