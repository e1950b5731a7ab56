"""The study's ``export:`` section: where a finished study's results are copied for the
trackers users already read (``scalestudy.report.export``). Each tool's part is declared like
every other setting (:func:`scalestudy.config.settings.setting`); a part given (even empty:
``tensorboard: {}``) turns that export on, a part left out keeps it off. None of these
settings is part of a point (none changes what is measured or a point's id).

Pure: no tracker imports, no files.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping

from scalestudy.config.checks import PointError, check_fields, coerce
from scalestudy.config.settings import Hash, setting
from scalestudy.config.vocab import WandbMode


@dataclass(frozen=True)
class MLflowExport:
    """An MLflow experiment: the study; a run per point (and one for the study's curves)."""

    tracking_uri: str | None = setting(
        None, hash=Hash.NEVER,
        doc="where the runs go: http(s)://host:port of a tracking server, or a store URI "
            "(sqlite:///path/mlflow.db); null: $MLFLOW_TRACKING_URI, else a SQLite store "
            "export/mlflow.db in the study's results folder")
    experiment: str | None = setting(None, hash=Hash.NEVER,
                                     doc="the experiment's name; null: the study's name")

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class WandbExport:
    """A Weights & Biases project: a run per point (grouped by the study), one for its curves."""

    project: str | None = setting(None, hash=Hash.NEVER,
                                  doc="the W&B project; null: the study's name")
    entity: str | None = setting(None, hash=Hash.NEVER,
                                 doc="the W&B team or user; null: the logged-in user's default")
    mode: WandbMode = setting(
        WandbMode.OFFLINE, ref="wandb_mode", hash=Hash.NEVER,
        doc="offline: runs written to files, sent later with `wandb sync` (compute nodes "
            "without network); online: sent as they are logged (needs `wandb login`)")
    dir: str | None = setting(None, hash=Hash.NEVER,
                              doc="the folder wandb writes its run folders under; null: "
                                  "export/ in the study's results folder")

    def __post_init__(self):
        coerce(self, "mode", WandbMode)
        check_fields(self)


@dataclass(frozen=True)
class TensorBoardExport:
    """TensorBoard event files: a run folder per point and one for the study's curves."""

    log_dir: str | None = setting(None, hash=Hash.NEVER,
                                  doc="the log folder (`tensorboard --logdir` it); null: "
                                      "export/tensorboard in the study's results folder")

    def __post_init__(self):
        check_fields(self)


#: The parts of ``export:`` by their key.
EXPORT_SECTIONS = {"export.mlflow": MLflowExport, "export.wandb": WandbExport,
                   "export.tensorboard": TensorBoardExport}


@dataclass(frozen=True)
class Export:
    """``export:``: copies of the finished study for experiment trackers (docs/exporting.md): a
    part given, even empty (``{}``), turns that export on; none changes a point or its id."""

    mlflow: MLflowExport | None = setting(
        None, hash=Hash.NEVER,
        doc="an MLflow experiment: a run per point and one for the study's curves "
            "(pip install 'scalestudy[mlflow]')")
    wandb: WandbExport | None = setting(
        None, hash=Hash.NEVER,
        doc="a Weights & Biases project: a run per point, grouped by the study, and one for its "
            "curves (pip install 'scalestudy[wandb]')")
    tensorboard: TensorBoardExport | None = setting(
        None, hash=Hash.NEVER,
        doc="TensorBoard event files: a run folder per point and one for the study's curves "
            "(pip install 'scalestudy[tensorboard]')")

    def __post_init__(self):
        for f in fields(self):  # a part as the study file gives it (a mapping) is made here
            value, kind = getattr(self, f.name), EXPORT_SECTIONS[f"export.{f.name}"]
            if isinstance(value, Mapping):
                try:
                    object.__setattr__(self, f.name, kind(**value))
                except TypeError as e:  # a key of another version's study.json
                    raise PointError(f"export.{f.name}: {e}") from None

    @classmethod
    def from_validated(cls, doc: Mapping | None) -> "Export":
        """The export section of a validated study (or ``study.json``); a part that is null
        or absent is off."""
        return cls(**{f.name: (doc or {}).get(f.name) for f in fields(cls)})

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools turned on, in the order they are exported."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)
