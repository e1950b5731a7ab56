"""Planner: weak/strong derivation, point ids, and rejected points with their reasons."""

import copy
import re

import pytest

from scalestudy.config.identity import ID_HASH_CHARS, config_hash
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.studyspec import Series
from scalestudy.plan.planner import expand_series, plan_points, plan_table

BASE = {
    "name": "t",
    "models": {"m": {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128}},
    "platform": {"devices_per_node": 4, "max_nodes": 2},
    "series": [],
}


OK = {"name": "ok", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 3}


def study(*series, **top):
    raw = copy.deepcopy(BASE)
    raw["series"] = list(series)
    raw.update(top)
    return validate(raw)


def by_n(points):
    return {p.n: p for p in points}


def test_weak_keeps_tokens_per_device_fixed():
    pts = by_n(plan_points(study({"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2, 4, 8],
                                  "micro_batch": 2, "grad_accum": 3})))
    for n, p in pts.items():
        assert p.feasible, p.reason
        assert (p.dp, p.grad_accum, p.global_batch) == (n, 3, 6 * n)
        assert p.tokens_per_step == 6 * n * 32
        assert p.tokens_per_device_step == 6 * 32
    assert pts[8].nodes == 2 and pts[8].procs_per_node == 4
    assert {p.baseline_n for p in pts.values()} == {1}


def test_strong_keeps_tokens_per_step_fixed():
    pts = by_n(plan_points(study({"name": "s", "mode": "strong", "model": "m", "gpus": [1, 2, 4],
                                  "micro_batch": 2, "global_batch": 16, "tp": 1})))
    assert {n: p.grad_accum for n, p in pts.items()} == {1: 8, 2: 4, 4: 2}
    assert {p.tokens_per_step for p in pts.values()} == {16 * 32}


def test_weak_with_model_parallel_shape_fixed():
    pts = by_n(plan_points(study({"name": "w", "mode": "weak", "model": "m", "gpus": [2, 4, 8],
                                  "tp": 2, "micro_batch": 1})))
    assert {n: p.dp for n, p in pts.items()} == {2: 1, 4: 2, 8: 4}
    assert {p.tokens_per_device_step for p in pts.values()} == {32 / 2}


@pytest.mark.parametrize("series, reason", [
    ({"gpus": [1, 3], "tp": 2}, "N=3 is not divisible by tp*pp=2"),
    ({"gpus": [1, 8], "tp": 8}, "tp=8 exceeds devices_per_node=4"),
    ({"gpus": [1, 3], "tp": 3}, "tp=3 does not divide heads=4"),
    ({"gpus": [3, 6], "pp": 3}, "layers=4 do not split into pp*virtual_stages=3"),
    ({"gpus": [1, 16]}, "needs 4 nodes, platform.max_nodes=2"),
    ({"gpus": [1, 6]}, "N=6 does not fill whole nodes of devices_per_node=4"),
    ({"gpus": [2, 4], "pp": 2, "grad_accum": 1}, "needs at least pp=2 micro-batches"),
])
def test_weak_rejections(series, reason):
    s = {"name": "w", "mode": "weak", "model": "m", "micro_batch": 1, **series}
    bad = [p for p in plan_points(study(s, OK)) if not p.feasible]
    assert bad and all(p.series == "w" for p in bad)
    assert any(reason in p.reason for p in bad), [p.reason for p in bad]


@pytest.mark.parametrize("series, reason", [
    ({"gpus": [1, 2], "global_batch": 6}, "global_batch=6 is not divisible by micro_batch*dp=2*2=4"),
    ({"gpus": [1, 8], "global_batch": 8}, "global_batch=8 is smaller than micro_batch*dp=2*8=16"),
])
def test_strong_rejections(series, reason):
    s = {"name": "s", "mode": "strong", "model": "m", "micro_batch": 2, **series}
    bad = [p for p in plan_points(study(s, OK)) if not p.feasible]
    assert len(bad) == 1 and reason in bad[0].reason, bad[0].reason


def test_pipeline_schedule_constraints():
    base = {"name": "p", "mode": "weak", "model": "m", "gpus": [2], "pp": 2, "micro_batch": 1,
            "grad_accum": 2}
    inter = plan_points(study(dict(base, pp_schedule="interleaved1f1b"), OK))[0]
    assert "needs virtual_stages >= 2" in inter.reason
    tied = copy.deepcopy(BASE["models"])
    tied["m"]["tied_embeddings"] = True
    p = plan_points(study(base, OK, models=tied))[0]
    assert "tied_embeddings=false" in p.reason


@pytest.mark.parametrize("grad_accum, reason", [
    # torch's interleaved 1F1B: at least pp micro-batches and a whole number of rounds,
    # grad_accum % (grad_accum // pp) == 0 (pp=2 here)
    (1, "pp_schedule=interleaved1f1b needs at least pp=2 micro-batches per step, got "
        "grad_accum=1"),
    (2, None), (3, None),  # 3 micro-batches: one round of 3 (3 // 2 = 1); the old rule
    (4, None), (6, None),  # (grad_accum % pp == 0) refused 3
    (5, "pp_schedule=interleaved1f1b needs grad_accum=5 to be a multiple of its rounds "
        "grad_accum//pp=2"),
])
def test_interleaved_schedule_follows_torchs_rule(grad_accum, reason):
    s = {"name": "i", "mode": "weak", "model": "m", "gpus": [2], "pp": 2, "micro_batch": 1,
         "grad_accum": grad_accum, "pp_schedule": "interleaved1f1b", "virtual_stages": 2}
    p = plan_points(study(s, OK))[0]
    assert (p.pp, p.parallel.virtual_stages, p.grad_accum) == (2, 2, grad_accum)
    if reason is None:
        assert p.feasible, p.reason
    else:
        assert not p.feasible and p.reason == reason, p.reason


def test_baseline_is_smallest_feasible_n_or_declared():
    pts = plan_points(study({"name": "w", "mode": "weak", "model": "m", "gpus": [3, 2, 4],
                             "tp": 2, "micro_batch": 1}))
    assert {p.baseline_n for p in pts} == {2}
    pts = plan_points(study({"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2, 4],
                             "baseline": 2, "micro_batch": 1}))
    assert {p.baseline_n for p in pts} == {2}


def test_point_ids_readable_hashed_and_repeats():
    pts = plan_points(study({"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                             "micro_batch": 2}, repeats=3))
    assert len(pts) == 6
    ids = [p.point_id for p in pts]
    assert len(set(ids)) == 6
    assert ids[0].startswith("w_n1_dp1-tp1-pp1_mb2-ga1-gb2_") and ids[0].endswith("_r0")
    assert len({p.config_hash for p in pts}) == 2  # repeats share the config hash
    # the id carries a 12-hex-digit prefix of the full SHA-256 config hash (64 hex digits)
    assert ID_HASH_CHARS == 12
    for p in pts:
        assert re.fullmatch(r"[0-9a-f]{64}", p.config_hash), p.config_hash
        assert re.fullmatch(r"w_n\d+_dp\d+-tp1-pp1_mb2-ga1-gb\d+_[0-9a-f]{12}_r[0-2]", p.point_id)
        assert p.point_id == (f"w_n{p.n}_dp{p.dp}-tp1-pp1_mb2-ga1-gb{p.global_batch}_"
                              f"{p.config_hash[:12]}_r{p.repeat}")
    assert [p.repeat for p in pts] == [0, 1, 2, 0, 1, 2]


def test_hash_changes_with_measured_settings_only():
    s = {"name": "w", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 2}
    base = plan_points(study(s))[0]
    lr = plan_points(study(s, train={"lr": 0.01}))[0]
    longer = plan_points(study(s, platform={"devices_per_node": 4, "max_nodes": 2,
                                            "timeout_s": 5000}))[0]
    assert lr.config_hash != base.config_hash
    assert longer.config_hash == base.config_hash == config_hash(base)


def test_sweeping_axes_expands_series():
    subs = expand_series(Series(name="x", mode="weak", model="m", gpus=[2], micro_batch=1,
                                tp=[1, 2], pp=1, cp=1, grad_accum=1,
                                settings={"dp_mode": ["ddp", "fsdp"]}))
    assert [s.name for s in subs] == ["x-tp1-ddp", "x-tp1-fsdp", "x-tp2-ddp", "x-tp2-fsdp"]
    assert [(s.tp, s.settings["dp_mode"]) for s in subs[1:3]] == [(1, "fsdp"), (2, "ddp")]
    pts = plan_points(study({"name": "x", "mode": "weak", "model": "m", "gpus": [2],
                             "tp": [1, 2], "micro_batch": 1}))
    assert {(p.series, p.tp, p.dp) for p in pts} == {("x-tp1", 1, 2), ("x-tp2", 2, 1)}


def test_duplicate_series_rejected():
    s = {"name": "a", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2}
    with pytest.raises(StudyError, match="duplicates series 'a'"):
        plan_points(study(s, dict(s, name="b")))


def test_no_feasible_point_is_an_error():
    with pytest.raises(StudyError, match="no feasible point"):
        plan_points(study({"name": "a", "mode": "weak", "model": "m", "gpus": [3],
                           "tp": 2, "micro_batch": 1}))


def test_plan_table_has_every_point():
    pts = plan_points(study({"name": "a", "mode": "weak", "model": "m", "gpus": [2, 3],
                             "tp": 2, "micro_batch": 1}))
    assert [p.feasible for p in pts] == [True, False]
    lines = plan_table(pts).splitlines()
    assert len(lines) == 1 + len(pts)
    assert lines[0].split("\t")[0] == "point_id"
    assert all(len(ln.split("\t")) == len(lines[0].split("\t")) for ln in lines)


def test_zero1_with_tp_rejects_tied_embeddings():
    tied = copy.deepcopy(BASE["models"])
    tied["m"]["tied_embeddings"] = True
    s = {"name": "z", "mode": "weak", "model": "m", "gpus": [2, 4], "tp": 2, "micro_batch": 1,
         "dp_mode": "zero1"}
    pts = plan_points(study(s, models=tied))
    assert [p.feasible for p in pts] == [True, False]  # dp=1 is fine, dp=2 is not
    assert "tied_embeddings=false" in pts[1].reason


# --- the layouts published runs used: uneven pipeline stages, context parallelism ----------

#: The memory of an "80GB" card as its driver reports it (nvidia-smi: A100-SXM4-80GB 81920
#: MiB, H100 80GB HBM3 81559 MiB), in GB (1e9 bytes).
MEMORY_GB = {"A100-SXM4": 81920 * 2**20 / 1e9, "H100-SXM5": 81559 * 2**20 / 1e9}


def _published_study(name, model, series, parallel, hardware):
    return validate({
        "name": name, "models": {"m": model},
        "platform": {"device": "cuda", "hardware": hardware, "devices_per_node": 8,
                     "max_nodes": 4096, "memory_per_device_gb": MEMORY_GB[hardware]},
        "train": {"precision": "bf16"}, "parallel": parallel,
        "series": [dict(series, name=name, model="m")],
    })


def test_bloom_70_layers_on_12_stages_plan_with_their_partition():
    """BLOOM-176B (arXiv:2211.05100 §3.4; bigscience tr11-176B-ml): 384 A100 80GB, TP 4,
    PP 12, DP 8, ZeRO-1, micro-batch 2, global batch 2048, full checkpointing; Megatron-
    DeepSpeed's partition puts the embedding with 5 blocks on the first and the last rank."""
    # BLOOM ties its embeddings across the first and the last stage (Megatron-DeepSpeed
    # all-reduces their gradients); the builtin trainer cannot, and the memory is the same
    # (the last stage holds its own copy either way)
    model = {"layers": 70, "hidden": 14336, "heads": 112, "seq_len": 2048, "vocab": 250880,
             "tied_embeddings": False, "attention": "math"}
    series = {"mode": "strong", "gpus": [384], "tp": 4, "pp": 12, "micro_batch": 2,
              "global_batch": 2048}
    par = {"dp_mode": "zero1", "activation_checkpointing": "full"}
    uniform = plan_points_any(_published_study("bloom", model, series, par, "A100-SXM4"))
    assert not uniform[0].feasible and "do not split into pp*virtual_stages=12" in \
        uniform[0].reason
    for part in ("parameters", [5] + [6] * 10 + [5]):
        (p,) = plan_points(_published_study("bloom", model, series,
                                            dict(par, pp_partition=part), "A100-SXM4"))
        assert p.feasible, p.reason
        assert p.dp == 8 and p.grad_accum == 128


def test_llama3_405b_126_layers_on_16_stages_plan_with_their_partition():
    """Llama 3 405B (arXiv:2407.21783 Table 4: TP 8, CP 1, PP 16, DP 64, sequence 8192,
    32 sequences per DP rank; §3.3.2: one layer fewer on the first and the last stage, no
    activation checkpointing at 8K, FSDP without resharding after the forward pass)."""
    model = {"arch": "llama", "layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8,
             "ffn_hidden": 53248, "seq_len": 8192, "vocab": 128256}
    series = {"mode": "weak", "gpus": [8192], "tp": 8, "pp": 16, "micro_batch": 1,
              "grad_accum": 32}
    par = {"dp_mode": "fsdp_grad_op", "sequence_parallel": True,
           "pp_partition": [7] + [8] * 14 + [7]}
    (p,) = plan_points(_published_study("llama3", model, series, par, "H100-SXM5"))
    assert p.feasible, p.reason
    assert p.parallel.pp_partition == (7,) + (8,) * 14 + (7,)
    # the 131,072-token phase: CP 16 (DP 8), one sequence per micro-batch
    long = dict(model, seq_len=131072)
    cp = {"mode": "weak", "gpus": [16384], "tp": 8, "pp": 16, "cp": 16, "micro_batch": 1,
          "grad_accum": 16}
    (q,) = plan_points(_published_study("llama3-128k", long, cp, par, "H100-SXM5"))
    assert q.feasible, q.reason
    assert (q.dp, q.cp) == (8, 16) and "-cp16" in q.point_id
    # without context parallelism the long sequences do not fit
    (r,) = plan_points_any(_published_study("llama3-128k", long, dict(cp, cp=1, gpus=[1024]),
                                            par, "H100-SXM5"))
    assert not r.feasible and "does not fit" in r.reason


def test_cp_series_sweep_like_tp():
    s = study({"name": "c", "mode": "weak", "model": "m", "gpus": [4, 8], "micro_batch": 1,
               "cp": [1, 2]}, platform={"device": "cuda", "devices_per_node": 4,
                                        "max_nodes": 2})
    pts = plan_points(s)
    assert sorted({p.series for p in pts}) == ["c-cp1", "c-cp2"]
    two = [p for p in pts if p.series == "c-cp2"]
    assert [(p.n, p.dp, p.cp) for p in two] == [(4, 2, 2), (8, 4, 2)]
    assert all(p.feasible for p in pts)
    # cp=1 keeps the id and hash a point had before cp existed
    (one,) = [p for p in pts if p.series == "c-cp1" and p.n == 4]
    assert "_dp4-tp1-pp1_mb" in one.point_id
    table = plan_table(pts).splitlines()
    assert "cp" in table[0].split("\t")
    # on CPU: refused with torch's reason
    cpu = plan_points_any(study({"name": "c", "mode": "weak", "model": "m", "gpus": [2],
                                 "micro_batch": 1, "cp": 2}, platform={"device": "cpu"}))
    assert not cpu[0].feasible and "needs device cuda" in cpu[0].reason
    odd = plan_points_any(study({"name": "c", "mode": "weak", "model": "m", "gpus": [2],
                                 "micro_batch": 1, "cp": 2},
                                models={"m": dict(BASE["models"]["m"], seq_len=30)},
                                platform={"device": "cuda"}))
    assert "2*cp=4 to divide seq_len=30" in odd[0].reason


def plan_points_any(s):
    """The points of a one-series study even when none is feasible."""
    from scalestudy.plan.planner import series_points

    try:
        return plan_points(s)
    except StudyError:
        return series_points(s, s.series[0])
