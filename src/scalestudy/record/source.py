"""Which study file made a results folder: ``study.json``'s ``source``, the resolved path of
the study file its launcher ran (``plan.planner.write_plan`` records it).

Two study files with the same ``name:`` would share ``RESULTS/<name>/``: the second would
replace the first one's tables and ``scalestudy status`` of the first would show the second's
points. :func:`refuse_other_source` stops the second one with one line, in every launcher
(``run.guard.claim_study``) and in ``scalestudy status``. The same study file moved (or
copied) elsewhere is still the same study when it resolves to the recorded study: it is
accepted, and the next plan records its new path. An edited file at another path is refused;
removing ``study.json`` (the plan writes it again) gives the folder to it. A folder whose
``study.json`` has no ``source`` (written before it was recorded) is not checked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from scalestudy.record.io import read_record
from scalestudy.record.bounded_read import RecordError

#: The key of ``study.json`` that names the study file (its resolved path).
SOURCE_KEY = "source"


def source_path(study_file: str | os.PathLike) -> str:
    """The study file as ``study.json`` records it: its resolved, absolute path."""
    return str(Path(study_file).resolve())


def with_source(study_json: dict, study_file: str | os.PathLike) -> dict:
    """``study.json``'s object with the study file it came from."""
    return {**study_json, SOURCE_KEY: source_path(study_file)}


def _same_study(record: dict, study_json: dict) -> bool:
    """Whether ``record`` (a ``study.json``) holds ``study_json`` (as written: JSON)."""
    mine = json.loads(json.dumps(study_json, default=str))
    return {k: v for k, v in record.items() if k != SOURCE_KEY} == mine


def refuse_other_source(study_dir: str | os.PathLike, study_file: str | os.PathLike,
                        study_json: dict | None = None) -> None:
    """RecordError (one line, with the fix) when ``study_dir`` was made from a study file other
    than ``study_file`` and ``study_json`` (the study of ``study_file``, resolved: when given,
    an equal study moved is accepted) differs from the recorded one."""
    record = read_record(Path(study_dir) / "study.json")
    made_by = record.get(SOURCE_KEY) if isinstance(record, dict) else None
    mine = source_path(study_file)
    if not isinstance(made_by, str) or not made_by or made_by == mine:
        return
    if study_json is not None and _same_study(record, study_json):
        return
    raise RecordError(f"{study_dir} was made by {made_by}; this study file {mine} has the same "
                      "name: rename one (its name:) or use --results OTHER (if it is that study "
                      f"moved, remove {Path(study_dir) / 'study.json'} and run again)")
