"""One command line for every entry point: the parser of ``scalestudy`` and its subcommands,
and the one wrapper that turns an error into an exit status.

A command is a module of ``scalestudy/commands/`` with:

- ``NAME``: the subcommand (``scalestudy NAME``); ``SUMMARY``: its one line in
  ``scalestudy --help``; ``DESCRIPTION``: what it does (a sentence or more); ``EXAMPLE``: one
  command line that uses it;
- ``add_arguments(parser)``: its arguments; ``REST`` (optional): what the arguments after
  ``--`` are, handed over unparsed as ``args.rest`` (a command without it refuses them);
- ``run(args) -> int``: the work, its exit status. Heavy imports (torch, pandas,
  matplotlib) go inside it: ``scalestudy plan`` starts in well under a second;
- ``TRACEBACK = True`` (optional): the command's exception is its run's evidence (a torchrun
  rank, torchrun itself: the runner classifies the point from the traceback in the log, and
  torchrun's root-cause record carries it), so it propagates instead of becoming one line.

:func:`guarded` runs ``run``: a bad study file, point or record, a locked study or an OSError
(a full disk, an unwritable folder) ends with one line, ``scalestudy: error: ...``, and exit
status 2; Ctrl-C with one line and 130.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from types import ModuleType
from typing import Sequence

USAGE = "%(prog)s [-h] [--version] COMMAND ..."


def version() -> str:
    """The installed package's version (its metadata), as ``scalestudy --version`` prints it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("scalestudy")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def command_parser(command: ModuleType, sub=None) -> argparse.ArgumentParser:
    """The parser of one command: its ``--help`` says what it does (its summary, then its
    description) and ends with its example."""
    line = command.SUMMARY
    kw = dict(prog=f"scalestudy {command.NAME}",
              description=textwrap.fill(f"{line[0].upper()}{line[1:]}. {command.DESCRIPTION}", 79),
              epilog=f"example:\n  {command.EXAMPLE}",
              formatter_class=argparse.RawDescriptionHelpFormatter)
    p = sub.add_parser(command.NAME, **kw) if sub is not None else argparse.ArgumentParser(**kw)
    command.add_arguments(p)
    return p


def build_parser(groups: dict[str, Sequence[ModuleType]], description: str,
                 epilog: str) -> argparse.ArgumentParser:
    """``scalestudy``'s parser: one plain line per command, by group, then every command's."""
    ap = argparse.ArgumentParser(prog="scalestudy", usage=USAGE, description=description,
                                 epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"scalestudy {version()}")
    commands = [c for group in groups.values() for c in group]
    width = max(len(c.NAME) for c in commands)
    listing = "\n\n".join(f"{title}:\n" + "\n".join(f"  {c.NAME:<{width}}  {c.SUMMARY}" for c in group)
                          for title, group in groups.items())
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands",
                            help=argparse.SUPPRESS,  # the listing is the description
                            description=listing)
    for c in commands:
        command_parser(c, sub)
    return ap


def split_rest(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` up to the first ``--``, and what follows it (None without one)."""
    if "--" not in argv:
        return argv, None
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def parse(command: ModuleType, argv: list[str]) -> argparse.Namespace:
    """``command``'s arguments; those after ``--`` as ``args.rest`` where it takes them."""
    head, rest = split_rest(argv)
    p = command_parser(command)
    if rest is not None and not hasattr(command, "REST"):
        p.error("takes no arguments after --")
    args = p.parse_args(head)
    args.rest = rest or []
    return args


def guarded(command: ModuleType, args: argparse.Namespace) -> int:
    """``command.run(args)``'s exit status; a bad input, a damaged record, a locked study or an
    OSError ends it with one line on stderr and status 2, Ctrl-C with one line and 130."""
    from scalestudy.config.checks import PointError
    from scalestudy.config.study_yaml import StudyError
    from scalestudy.record.io import exit_on_os_error
    from scalestudy.record.bounded_read import RecordError, printable
    from scalestudy.run.guard import StudyLocked

    if getattr(command, "TRACEBACK", False):
        return command.run(args)
    try:
        return exit_on_os_error(lambda: command.run(args))
    except (StudyError, PointError, RecordError, StudyLocked) as e:
        one_line = printable(str(e).replace("\r", "\\r").replace("\n", "\\n"))
        print(f"scalestudy: error: {one_line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("scalestudy: interrupted; run the same command again to go on (a study reruns "
              "only its unfinished points)", file=sys.stderr)
        return 130


def run_command(command: ModuleType, argv: list[str]) -> int:
    """One command with its arguments (what ``python -m scalestudy.train`` runs)."""
    return guarded(command, parse(command, argv))


def command_line(groups: dict[str, Sequence[ModuleType]], description: str, epilog: str,
                 argv: list[str] | None = None) -> int:
    """``scalestudy COMMAND ARGS``: the named command of ``groups``, its arguments parsed and
    its errors turned into exit statuses. Only that command's parser is built: the others'
    modules stay unread beyond their arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    by_name = {c.NAME: c for group in groups.values() for c in group}
    if argv and argv[0] in by_name:
        return run_command(by_name[argv[0]], argv[1:])
    build_parser(groups, description, epilog).parse_args(argv)  # --help, --version, a typo
    return 2
