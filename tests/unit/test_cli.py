"""The console command explains itself: ``scalestudy --help`` has one plain line per
subcommand, each subcommand's ``--help`` says what it does and shows an example, ``--version``
is the installed package's, and a misspelt study key or value gets a "did you mean"."""

from __future__ import annotations

import importlib.metadata

import pytest

from scalestudy import cli
from scalestudy.commands.dispatch import build_parser


def _help(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert e.value.code == 0, err
    return out


def _subcommands() -> list[str]:
    parser = build_parser(cli.GROUPS, cli.DESCRIPTION, cli.EPILOG)
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return list(sub.choices)


def test_every_subcommand_has_one_plain_line(capsys):
    names = _subcommands()
    assert set(names) == set(cli.COMMANDS)
    out = _help(capsys, ["--help"])
    for name in names:
        lines = [ln for ln in out.splitlines() if ln.split()[:1] == [name]]
        assert len(lines) == 1, (name, out)
        assert lines[0].split(None, 1)[1] == cli.COMMANDS[name].SUMMARY
    assert "``" not in out and "see scalestudy" not in out
    assert max(map(len, out.splitlines())) <= 100


@pytest.mark.parametrize("name", _subcommands())
def test_each_subcommand_says_what_it_does_with_an_example(name, capsys):
    out = _help(capsys, [name, "--help"])
    assert out.startswith(f"usage: scalestudy {name} "), out
    description = out.split("\n\n")[1]
    assert len(description.split()) >= 8, out  # a sentence, not a pointer elsewhere
    example = out.rsplit("example", 1)[1]
    assert f"  scalestudy {name} " in example, out
    assert "``" not in out and "see scalestudy" not in out


def test_version_is_the_installed_package(capsys):
    out = _help(capsys, ["--version"])
    assert out.strip() == f"scalestudy {importlib.metadata.version('scalestudy')}"


def test_a_misspelt_key_gets_the_nearest_one(tmp_path, capsys):
    study = tmp_path / "study.yaml"
    study.write_text("name: s\nmodels:\n  m: {layers: 2, hidden: 64, heads: 4, seq_len: 32, "
                     "vocab: 128}\nseries:\n  - {name: w, mode: weak, model: m, gpu: [1, 2], "
                     "micro_batch: 2}\n")
    assert cli.main(["plan", str(study)]) == 2
    err = capsys.readouterr().err
    assert "series[0]: unknown key 'gpu'; did you mean 'gpus'? allowed keys:" in err, err
    study.write_text(study.read_text().replace("gpu:", "gpus:").replace("weak", "waek"))
    assert cli.main(["plan", str(study)]) == 2
    err = capsys.readouterr().err
    assert "'waek' is not allowed; expected one of weak, strong; did you mean 'weak'?" in err, err


def test_every_command_has_the_same_shape():
    """One command layer: each command module says what it is and holds an add_arguments and
    a run; the registry names each once."""
    for name, c in cli.COMMANDS.items():
        assert c.NAME == name and c.__name__.startswith("scalestudy.commands."), name
        assert callable(c.add_arguments) and callable(c.run), name
        assert not hasattr(c, "main"), f"{name}: the dispatcher is the one main"
    assert len({c.__name__ for c in cli.COMMANDS.values()}) == len(cli.COMMANDS)


def test_arguments_after_the_separator_go_only_to_a_command_that_takes_them(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "study.yaml", "--", "-n"])
    assert e.value.code == 2 and "takes no arguments after --" in capsys.readouterr().err


def test_the_registry_imports_no_heavy_module():
    """``scalestudy plan`` starts in well under a second: reading the registry imports neither
    torch, pandas nor matplotlib (each command imports them in its run)."""
    import subprocess
    import sys

    code = ("import sys, scalestudy.cli; print(sorted(m for m in ('torch', 'pandas', "
            "'matplotlib', 'numpy') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


def test_one_wrapper_turns_errors_into_exit_statuses(capsys):
    """A bad input or a failed write ends a command with one line and status 2, Ctrl-C with
    130; a command whose traceback is its evidence (a torchrun rank) lets it through."""
    from types import SimpleNamespace

    from scalestudy.commands.dispatch import guarded
    from scalestudy.config.study_yaml import StudyError

    def raising(exc):
        def run(args):
            raise exc
        return SimpleNamespace(run=run)

    disk = OSError(28, "No space left on device")
    disk.filename = "/r/s/runs.csv"
    assert guarded(raising(StudyError("s.yaml: series[0]: unknown key 'gpu'")), None) == 2
    assert guarded(raising(disk), None) == 2
    assert guarded(raising(KeyboardInterrupt()), None) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "scalestudy: error: s.yaml: series[0]: unknown key 'gpu'"
    assert err[1].startswith("scalestudy: error: /r/s/runs.csv: no space left on device")
    assert err[2].startswith("scalestudy: interrupted") and len(err) == 3
    rank = raising(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    rank.TRACEBACK = True
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        guarded(rank, None)
    assert cli.COMMANDS["train"].TRACEBACK and cli.COMMANDS["torchrun"].TRACEBACK
