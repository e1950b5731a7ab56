"""Random mutations of the default study thrown at ``scalestudy plan``.

Seeded and bounded: ``CASES`` mutants of ``workflow/config/default.yaml``, made by editing its
text (bytes flipped, inserted, deleted, duplicated; YAML syntax such as anchors, aliases,
tags, flow brackets, tabs dropped in) or its parsed value (a field replaced by a value of the
wrong type, NaN, a huge or whole-float number, a name with a newline, a key removed, a
non-text key added, a series duplicated). Each must end either with exit status 2 and ONE
line ``scalestudy: error: ...``, or with a plan whose points are sound; never a traceback,
never a file written, never more than ``CASE_LIMIT_S`` seconds of this process's CPU time.

The first cases are known expensive inputs (``HOSTILE``). The cap is CPU time
(``time.process_time``), not wall time: other processes on a shared host do not count, so their
load cannot flake it. A mutant takes a few ms to ~0.1 s, the slowest hostile case (10,000
mappings in a list that jsonschema checks for uniqueness) ~0.5 s; 10 s is a margin of 20x over
the worst case and 100x over a mutant, so a slow machine does not flake it, and a blow-up (an
alias bomb took ~40 s before, 10,000 mappings minutes, 2**52 checkpointed layers for ever)
does not pass.
"""

from __future__ import annotations

import copy
import io
import math
import random
import subprocess
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from scalestudy import cli
from scalestudy.config.point import Point
from scalestudy.config.study import load_study
from scalestudy.plan.planner import plan_points

REPO = Path(__file__).resolve().parents[2]
DEFAULT = (REPO / "workflow" / "config" / "default.yaml").read_text()
SEED = 20261201
CASES = 600
CASE_LIMIT_S = 10.0

SNIPPETS = ["&a ", "*a", "!!python/object/apply:os.system ['id']", "!!binary aGk=", "? [a, b]\n: 1\n",
            "[[[[[[[[", "]]]]", "{", "}", ": ", "- ", "\t", ".nan", ".inf", "-.inf", "1e400",
            "2.0", "~", "yes", "<<: *a\n", "---\n", "...\n", "'", '"', "\\", "%YAML 1.1\n",
            "\x00", "\xff", "\u2028", "\ufeff", "#", "|\n  x\n", ">\n", "0x1F", "0o17",
            "1_000", "2024-01-01", "9" * 40, "-1", "1.0e+300", "null", "on:", "1: x\n"]
VALUES = [None, True, False, 0, -1, 2.0, 1.5, math.nan, math.inf, -math.inf, 10**30, 2**53 + 1,
          "", "x\n", "a b;rm -rf /", "../x", "..", "weak", "strong", "cpu", "cuda", [], [0],
          [1.0], [2, 2], list(range(1, 65)), {}, {"x": 1}, {1: 2}, {None: 1}, "ddp",
          "interleaved1f1b", "selective", 4096, 1024, 10**6, "\x00", "é", "x" * 5000,
          [[[[[[[[[[1]]]]]]]]]], {"env": {"LD_PRELOAD": "/x.so"}}, "--no-python", 64, 3]


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _set(root, path, value):
    node = root
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def mutate_value(rng: random.Random) -> str:
    raw = yaml.safe_load(DEFAULT)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(raw) if p]
        path = rng.choice(paths)
        op = rng.random()
        parent = raw
        for key in path[:-1]:
            parent = parent[key]
        if op < 0.55:
            _set(raw, path, copy.deepcopy(rng.choice(VALUES)))
        elif op < 0.7 and isinstance(parent, dict):
            del parent[path[-1]]
        elif op < 0.85 and isinstance(parent, dict):
            parent[rng.choice(["extra", 1, None, True, "name", "x\n", "gpus", "tp", "env"])] = \
                copy.deepcopy(rng.choice(VALUES))
        elif isinstance(raw.get("series"), list) and raw["series"]:
            raw["series"].append(copy.deepcopy(rng.choice(raw["series"])))
    try:
        return yaml.safe_dump(raw, allow_unicode=rng.random() < 0.5, default_flow_style=None)
    except (yaml.YAMLError, TypeError, ValueError):
        return DEFAULT


def mutate_text(rng: random.Random) -> bytes:
    data = bytearray(DEFAULT.encode())
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(data) + 1)
        op = rng.random()
        if op < 0.25:
            data[pos:pos] = rng.choice(SNIPPETS).encode("utf-8", "surrogatepass")
        elif op < 0.4 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.55:
            data[pos:pos + rng.randint(1, 40)] = b""
        elif op < 0.7:
            chunk = data[pos:pos + rng.randint(1, 200)]
            data[pos:pos] = chunk * rng.randint(1, 5)
        elif op < 0.8:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.9:
            del data[pos:]
        else:
            line = rng.choice(DEFAULT.splitlines()).encode()
            data[pos:pos] = b"\n" + line + b"\n"
    return bytes(data)


def _hostile() -> list[bytes]:
    """Known expensive inputs, under the same per-case cap: an alias bomb, deep nesting,
    10,000 mappings in a list jsonschema checks for uniqueness (pairwise: minutes), 100,000
    device counts, a 200 x 40 x 40 x 40 sweep, 270,000 values, 2**52 layers checkpointed
    selectively (the memory model counted them one by one), a million pipeline stages."""
    head = DEFAULT.split("series:")[0]
    one = "  - {name: w, mode: weak, model: tiny, micro_batch: 4, gpus: [1]}\n"
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8))
    return [
        (head + "description: *i\n").replace("name: default", bomb + "name: default"),
        head + "series: " + "[" * 100_000 + "]" * 100_000 + "\n",
        head + "references: [" + ", ".join(f"{{a: {i}}}" for i in range(10_000)) + "]\n"
        "series:\n" + one,
        head + "series:\n  - {name: w, mode: weak, model: tiny, micro_batch: 4, gpus: ["
        + ",".join(map(str, range(1, 100_001))) + "]}\n",
        head.replace("devices_per_node: 8", "devices_per_node: 1024\n  max_nodes: 131072")
        + "series:\n  - {name: w, mode: weak, model: tiny, gpus: [" + ",".join(
            map(str, range(1, 201))) + "], tp: [" + ",".join(map(str, range(1, 41)))
        + "], pp: [" + ",".join(map(str, range(1, 41))) + "], micro_batch: ["
        + ",".join(map(str, range(1, 41))) + "]}\n",
        head + "".join(f"x{i}: [" + ",".join(["1"] * 9000) + "]\n" for i in range(30)),
        # the memory model: 2**52 layers checkpointed selectively; a million pipeline stages
        head.replace("layers: 2", "layers: 4503599627370496")
        + "parallel: {activation_checkpointing: selective}\nseries:\n" + one,
        head.replace("devices_per_node: 8", "devices_per_node: 1024\n  max_nodes: 131072")
        .replace("layers: 2", "layers: 1048576")
        + "series:\n  - {name: w, mode: weak, model: tiny, micro_batch: 1, gpus: [1048576], "
        "pp: 1048576}\n",
    ]


HOSTILE = [t.encode() for t in _hostile()]


def case(i: int) -> bytes:
    if i < len(HOSTILE):
        return HOSTILE[i]
    rng = random.Random(SEED * 1000 + i)
    return mutate_text(rng) if rng.random() < 0.5 else mutate_value(rng).encode()


def _plan(path: Path, results: Path) -> tuple[int, str, str, str | None]:
    out, err = io.StringIO(), io.StringIO()
    crash = None
    with redirect_stdout(out), redirect_stderr(err):
        try:
            rc = cli.main(["plan", str(path), "--results", str(results)])
        except SystemExit as e:  # argparse
            rc = e.code
        except BaseException:  # noqa: BLE001 - the point of the test
            rc, crash = -1, traceback.format_exc()
    return rc, out.getvalue(), err.getvalue(), crash


def test_mutants_of_the_default_study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    stats = {"refused": 0, "planned": 0}
    slowest = (0.0, -1)
    for i in range(CASES):
        path = tmp_path / f"case{i}.yaml"
        path.write_bytes(case(i))
        t0 = time.process_time()  # CPU seconds of this process (module doc)
        rc, out, err, crash = _plan(path, work / "results")
        elapsed = time.process_time() - t0
        slowest = max(slowest, (elapsed, i))
        where = f"case {i} (seed {SEED}): {path.read_bytes()[:300]!r}"
        assert crash is None, f"{where}\n{crash}"
        assert elapsed < CASE_LIMIT_S, f"{where}: {elapsed:.1f} s of CPU"
        assert list(work.iterdir()) == [], where  # nothing written, refused or not
        if rc == 2:
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("scalestudy: error: "), \
                f"{where}: {err!r}"
            assert out == "" and "Traceback" not in err, where
            stats["refused"] += 1
        else:
            assert rc == 0 and err == "", f"{where}: rc={rc} {err!r}"
            assert "runs planned" in out.splitlines()[-1], where
            for p in plan_points(load_study(path)):  # sound points: they read back as written
                assert Point.from_json(p.to_json()) == p
                assert p.feasible in (True, False) and "\n" not in p.point_id
            stats["planned"] += 1
        path.unlink()
    print(f"\n{CASES} mutants: {stats}; slowest case {slowest[1]}: {slowest[0] * 1e3:.0f} ms")
    assert stats["refused"] > CASES // 4 and stats["planned"] > 10  # both kinds exercised


@pytest.mark.parametrize("i", [1, 2, 3, 5, 8])
def test_mutants_through_the_installed_command(tmp_path, i):
    """A few cases through ``python -m scalestudy.cli`` itself: what a user sees."""
    path = tmp_path / "case.yaml"
    path.write_bytes(case(i))
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "plan", str(path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "Traceback" not in r.stderr
    assert (r.returncode, r.stderr.count("\n")) in ((0, 0), (2, 1)), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case.yaml"]
