"""Bad input: every study file in ``tests/bad_studies/`` is refused by ``scalestudy plan`` and
``scalestudy run`` with ONE line naming the field and the fix (its first line states the
expected fragment: ``# expect: ...``), exit status 2, and no result files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy import cli

CASES = sorted((Path(__file__).parents[1] / "bad_studies").glob("*.yaml"))


def _expected(path: Path) -> str:
    first = path.read_bytes().split(b"\n", 1)[0].decode()  # the rest may be binary
    assert first.startswith("# expect: "), f"{path.name}: first line must be '# expect: ...'"
    return first.removeprefix("# expect: ").strip()


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_bad_study_is_refused_with_one_clear_line(path, command, tmp_path, capsys,
                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may appear in the working directory either
    results = tmp_path / "results"
    argv = ([command, str(path), "--write", "--results", str(results)] if command == "plan"
            else [command, str(path), "--results", str(results), "--no-report"])
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("scalestudy: error: "), err
    assert _expected(path) in lines[0], f"expected {_expected(path)!r} in {lines[0]!r}"
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # no results folder, no plan.tsv, nothing


@pytest.mark.parametrize("name", ["yaml_syntax", "n_not_divisible_by_tp"])
def test_the_installed_command_exits_2(name, tmp_path):
    path = Path(__file__).parents[1] / "bad_studies" / f"{name}.yaml"
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "run", str(path), "--results",
                        str(tmp_path / "results")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and _expected(path) in r.stderr
    assert not (tmp_path / "results").exists()
