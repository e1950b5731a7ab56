"""The study's ``export:`` section: where a finished study's results are copied for the
trackers users already read (``scalestudy.report.export``). Each tool's part is declared like
every other setting (:func:`scalestudy.config.settings.setting`); a part given (even empty:
``tensorboard: {}``) turns that export on, a part left out keeps it off. None of these
settings is part of a point (none changes what is measured or a point's id).

Pure: no tracker imports, no files.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Mapping

from scalestudy.config.checks import PointError, check_fields, coerce
from scalestudy.config.settings import Hash, setting


class WandbMode(StrEnum):
    """How a Weights & Biases run is written (``wandb.init(mode=...)``)."""

    OFFLINE = "offline"  # files under the run folder, sent later with `wandb sync`
    ONLINE = "online"  # sent to the W&B server as it is logged


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


#: The parts of ``export:`` by their key (the schema's ``x-settings: export.<key>``).
EXPORT_SECTIONS = {"export.mlflow": MLflowExport, "export.wandb": WandbExport,
                   "export.tensorboard": TensorBoardExport}
#: The schema's ``$defs`` enum lists of this section's words.
EXPORT_ENUMS = {"wandb_mode": tuple(WandbMode)}


@dataclass(frozen=True)
class Export:
    """``export:``: each tool's settings, None where the study leaves that tool out."""

    mlflow: MLflowExport | None = None
    wandb: WandbExport | None = None
    tensorboard: TensorBoardExport | None = None

    @classmethod
    def from_validated(cls, doc: Mapping | None) -> "Export":
        """The export section of a validated study (or ``study.json``); a part that is null
        or absent is off."""
        doc = doc or {}
        kinds = {f.name: EXPORT_SECTIONS[f"export.{f.name}"] for f in fields(cls)}
        try:
            return cls(**{k: None if doc.get(k) is None else kind(**doc[k])
                          for k, kind in kinds.items()})
        except TypeError as e:  # a key of another version's study.json
            raise PointError(f"export: {e}") from None

    @property
    def tools(self) -> tuple[str, ...]:
        """The tools turned on, in the order they are exported."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)
