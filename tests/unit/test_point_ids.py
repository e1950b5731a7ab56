"""The point ids of every shipped study and of the tests' shared tiny study stay what they
were (``point_ids.json``): a change to how settings are declared, read or hashed must not rerun
a user's finished points. A deliberate change of what a point measures changes its id; then
``python tests/unit/test_point_ids.py`` writes the file again (review its diff)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINNED = Path(__file__).with_name("point_ids.json")


def current() -> dict[str, list[str]]:
    from scalestudy.config.study import load_study, validate
    from scalestudy.plan.planner import plan_points

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import TINY

    files = (sorted(ROOT.glob("workflow/config/*.yaml")) + sorted(ROOT.glob("examples/*/study.yaml"))
             + sorted(ROOT.glob("benchmarks/*.yaml")))
    out = {}
    for f in files:
        study = load_study(f, trust_site=True)
        if study.series:
            out[str(f.relative_to(ROOT))] = sorted(p.point_id for p in plan_points(study))
    out["tests/conftest.py:TINY"] = sorted(p.point_id for p in plan_points(validate(TINY)))
    return out


def test_every_shipped_studys_point_ids_are_unchanged():
    pinned, now = json.loads(PINNED.read_text()), current()
    assert set(now) == set(pinned), "a shipped study came or went: rewrite point_ids.json"
    for name, ids in pinned.items():
        assert now[name] == ids, f"{name}: point ids changed"


if __name__ == "__main__":
    PINNED.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
