"""The package's imports follow its stages (docs/architecture.md, "Stages"): every import of a
scalestudy module, at the top of a file or inside a function, points from a stage to one it
may use, and no module imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import scalestudy

PACKAGE = Path(scalestudy.__file__).parent

# stage -> the stages it may import (besides itself). The study side: config <- plan <- run and
# the trainer (models, distributed, train), measure on top; the record side: record <- analysis
# <- report; perf (the performance model: pure, no figures, no report formats, no trainer)
# over config and record, under plan, analysis and report; the CLI over all of them.
STAGES: dict[str, set[str]] = {
    "paths": set(),
    "number_format": set(),
    "reference_data": set(),
    "process_exit": set(),  # ending a finished rank or launcher without teardown
    "config": {"number_format", "paths"},
    "record": {"config", "number_format", "paths"},
    "perf": {"config", "number_format", "record", "reference_data"},
    "plan": {"config", "number_format", "perf", "record", "reference_data"},
    "models": {"config", "number_format"},
    # the trainer depends on the study's config (shapes, layout rules) and writes records;
    # the performance model and the planner stay beside it
    "distributed": {"config", "models", "number_format"},
    "train": {"config", "distributed", "models", "number_format", "process_exit", "record"},
    "run": {"config", "number_format", "paths", "perf", "plan", "process_exit", "record"},
    "measure": {"config", "distributed", "models", "number_format", "perf", "plan", "record", "run", "train"},
    # the model judged against published tables and series, and its one fitted constant
    "validation": {"config", "number_format", "perf", "record", "reference_data"},
    "analysis": {"config", "number_format", "perf", "record"},
    "report": {"analysis", "config", "number_format", "paths", "perf", "plan", "record", "reference_data",
               "validation"},
    # the layout search: plans layouts, runs them as points, reads their records, reports
    "tune": {"analysis", "config", "number_format", "paths", "perf", "plan", "record", "report", "run"},
}
# the command lines (argument parsing, exit codes) of every stage
STAGES["commands"] = set(STAGES)
STAGES["cli"] = {"commands"}  # the registry of the commands
STAGES["__main__"] = {"cli"}  # python -m scalestudy COMMAND
# a package's __main__ (python -m scalestudy.train: what torchrun starts) hands its
# arguments to one command: the only import up the stages, and all such a module holds
ENTRY = {"commands", "process_exit"}


def module_name(path: Path) -> str:
    parts = ["scalestudy", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path, known: set[str]) -> set[str]:
    """The scalestudy modules a file imports, anywhere in it (a ``from pkg import name``
    counts as ``pkg.name`` when that is a module, else as ``pkg``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                    else node.module for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            assert "hooks" in path.name, f"{path}: importlib hides an import from this test"
    return {m for m in out if m.split(".")[0] == "scalestudy"}


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scalestudy"


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imported(p, set(mods)) - {m} for m, p in mods.items()}


def test_every_stage_is_declared():
    found = {stage(m) for m in modules()} - {"scalestudy"}
    assert found == set(STAGES), "declare a new stage (or drop a gone one) in STAGES"


def test_stage_order_is_acyclic():
    done: set[str] = set()

    def visit(s: str, path: tuple[str, ...]) -> None:
        assert s not in path, f"stage circle: {' -> '.join(path + (s,))}"
        if s not in done:
            for t in STAGES[s]:
                visit(t, path + (s,))
            done.add(s)

    for s in STAGES:
        visit(s, ())


def test_imports_follow_the_stages():
    wrong = sorted(f"{m} -> {t}" for m, targets in graph().items() for t in targets
                   if stage(t) not in STAGES.get(stage(m), set()) | {stage(m)}
                   | (ENTRY if m.endswith(".__main__") else set())
                   and stage(t) != "scalestudy")
    assert not wrong, "imports against the stage order:\n" + "\n".join(wrong)


def test_no_import_circle():
    g = graph()
    state: dict[str, int] = {}
    circles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                stack = path + [m]
                circles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t in g and t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_aggregate_runs_no_performance_model():
    """``scalestudy aggregate`` writes the measured tables: following its imports reaches no
    module of the performance model (``perf``) nor its validation; FLOPs conventions, parameter
    counts and device peaks are facts of ``config``."""
    g = graph()
    seen, todo = set(), ["scalestudy.commands.aggregate"]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo += sorted(g.get(m, ()))
    assert not sorted(m for m in seen if stage(m) in ("perf", "validation"))


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and getattr(node.test.left, "id", "") == "__name__")


def test_commands_are_the_only_entry_points():
    """Argument parsing, ``main`` and ``if __name__ == "__main__"`` live in
    ``scalestudy/commands/`` and the registry ``cli.py`` (the console script); a package's
    ``__main__.py`` only hands its arguments to a command (no function, no class, no logic)."""
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        tree = ast.parse(path.read_text())
        if rel.parts[0] == "commands":
            continue
        names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                 for a in n.names} | {n.module for n in ast.walk(tree)
                                      if isinstance(n, ast.ImportFrom)}
        assert "argparse" not in names, f"{rel}: argument parsing belongs in commands/"
        assert not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and n.name == "main" for n in ast.walk(tree)), \
            f"{rel}: a main(argv) belongs in commands/"
        if rel.name == "__main__.py":
            assert not any(isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.If, ast.For,
                                          ast.While, ast.Try, ast.With)) for n in tree.body), \
                f"{rel}: a __main__ only hands its arguments to a command"
            continue
        guards = [n for n in tree.body if _is_main_guard(n)]
        assert not guards or rel == Path("cli.py"), \
            f"{rel}: `python -m` of a stage module: make it a command (scalestudy COMMAND)"
