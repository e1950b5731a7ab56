"""scalestudy tune: feasible shapes ranked by predicted throughput, written as a study."""

import yaml

from scalestudy import cli
from scalestudy.perf import hardware
from scalestudy.plan import constraints, tune


def test_tune_tiny_writes_study(tmp_path):
    out = tmp_path / "study.yaml"
    assert cli.main(["tune", "--model", "tiny", "--n", "4", "--hardware", "cpu-local", "--top", "3",
                          "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert len(doc["series"]) == 3 and list(doc["models"]) == ["tiny"]
    for s in doc["series"]:
        assert s["gpus"] == [4] and 4 % (s["tp"] * s["pp"]) == 0
    # the written study is valid and plans to exactly the ranked, feasible points
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.study import load_study

    pts = plan_points(load_study(str(out)))
    assert len(pts) == 3 and all(p.feasible for p in pts)


def test_tune_frontier_study_validates(tmp_path):
    out = tmp_path / "study.yaml"
    assert cli.main(["tune", "--model", "gpt-175b", "--n", "1024", "--hardware", "frontier", "--top",
                          "4", "--out", str(out)]) == 0
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.study import load_study

    study = load_study(str(out))
    assert study.platform.hardware == "MI250X-GCD"
    pts = plan_points(study)
    assert len(pts) == 4 and all(p.feasible for p in pts)


def test_candidates_respect_constraints():
    hw = hardware.HardwareSpec.load("frontier")
    model, _ = tune.known_models()["gpt-22b"]
    n, gb = 64, 512
    seen = 0
    for p, ok, reason in tune.candidates(model, n, gb, hw):
        seen += 1
        assert p.dp * p.tp * p.pp == n
        assert p.tp <= 8 and model.heads % p.tp == 0
        assert model.layers % (p.pp * p.parallel.virtual_stages) == 0
        assert gb == p.dp * p.micro_batch * p.grad_accum
        if p.pp > 1:
            assert p.grad_accum >= p.pp
        assert ("does not fit" in reason) != ok
        # every feasibility rule, written once (plan.constraints), holds for every candidate
        assert constraints.violation(p) is None
        assert (constraints.violation(p, hw.memory_bytes) is None) == ok
    assert seen > 50


def test_ranked_best_first_and_feasible():
    hw = hardware.HardwareSpec.load("frontier")
    model, _ = tune.known_models()["gpt-175b"]
    best = tune.rank(model, 1024, 1280, hw, top=5)
    tps = [b["prediction"].tokens_per_s for b in best]
    assert tps == sorted(tps, reverse=True)
    assert all(b["memory_bytes"] <= 0.9 * hw.memory_bytes for b in best)
    # every top shape keeps TP inside a node and pipelines across nodes, as the Frontier
    # study's own 175B shape (tp 4, pp 16) does
    assert all(b["point"].tp <= 8 and b["point"].pp > 1 for b in best)
