"""Export one finished study to every tool its ``export:`` section turns on (or those asked
for), each on its own: a tool that fails (not installed, unreachable, a folder that cannot be
written) says so in one line and the others still run; the study's tables are only read.
"""

from __future__ import annotations

from pathlib import Path

from scalestudy.config.export import EXPORT_SECTIONS, Export
from scalestudy.record.io import os_error_line, write_json
from scalestudy.record.run_records import read_study
from scalestudy.record.bounded_read import RecordError, one_line
from scalestudy.report.export import ExportError, ToolOutcome, require
from scalestudy.report.export.shape import read_study_shape



def writer(tool: str):
    """The module that writes ``tool`` (its ``export(shape, settings) -> ToolOutcome``), imported
    on use (each imports its tracker's package)."""
    if tool == "mlflow":
        from scalestudy.report.export import to_mlflow as module
    elif tool == "wandb":
        from scalestudy.report.export import to_wandb as module
    else:
        from scalestudy.report.export import to_tensorboard as module
    return module

#: What a finished export writes in the study's folder: what each tool holds (the workflow's
#: export rule's output).
MANIFEST = Path("export") / "exported.json"


def study_export(folder: str | Path) -> Export:
    """The export settings of the study in ``folder`` (its ``study.json``); RecordError when
    there is none or it is damaged."""
    doc = read_study(folder)
    if doc is None:
        raise RecordError(f"{Path(folder) / 'study.json'}: missing; run the study first "
                          "(scalestudy run STUDY.yaml)")
    try:
        return Export.from_validated(doc.get("export"))
    except (TypeError, ValueError) as e:
        raise RecordError(f"study.json: export: {one_line(e)}") from None


def export_study(folder: str | Path, tools: tuple[str, ...] = ()
                 ) -> tuple[list[ToolOutcome], list[str]]:
    """Export the study in ``folder`` to ``tools`` (default: those its ``export:`` section
    turns on; a tool it leaves out runs with its defaults): what each did, and one line per
    tool that failed. Writes :data:`MANIFEST` when every tool succeeded."""
    folder = Path(folder)
    settings = study_export(folder)
    shape, done, failed = None, [], []
    for tool in tools or settings.tools:
        try:
            require(tool)
            shape = shape or read_study_shape(folder)
            chosen = getattr(settings, tool) or EXPORT_SECTIONS[f"export.{tool}"]()
            done.append(writer(tool).export(shape, chosen))
        except ExportError as e:
            failed.append(str(e))
        except RecordError as e:
            failed.append(f"export.{tool}: {one_line(e)}")
        except OSError as e:
            failed.append(f"export.{tool}: {os_error_line(e)}")
    if not failed:
        write_json(folder / MANIFEST, {o.tool: {"where": o.where, "created": o.created,
                                                "updated": o.updated,
                                                "unchanged": o.unchanged} for o in done})
    return done, failed
