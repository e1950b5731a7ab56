"""A finished study copied into the experiment trackers users already read: MLflow, Weights &
Biases and TensorBoard (the study's ``export:`` section, ``scalestudy.config.export``;
docs/exporting.md). The study's shape is read once (:mod:`.shape`); each tool's module writes
it. Every export is keyed by point id and idempotent: a run already there with the same
content is left alone, a changed one is written again, a new one added.
"""

from __future__ import annotations

from dataclasses import dataclass


class ExportError(RuntimeError):
    """An export that could not be done; ``str()`` is one line naming the tool and the fix."""


#: The package each tool needs and the extra that installs it.
PACKAGES = {"mlflow": "mlflow", "wandb": "wandb", "tensorboard": "tensorboard"}


def require(tool: str) -> None:
    """ExportError naming the extra when ``tool``'s package cannot be imported."""
    try:
        __import__(PACKAGES[tool])  # (a tracker's package, never one of ours)
    except ImportError:
        raise ExportError(f"export.{tool}: the {PACKAGES[tool]} package is not installed; "
                          f"pip install 'scalestudy[{tool}]' (or remove export.{tool} from "
                          "the study)") from None


@dataclass
class ToolOutcome:
    """What one tool's export did: runs created, written again (changed) and left as they
    were; ``where``: the experiment, project or folder."""

    tool: str
    where: str
    created: int = 0
    updated: int = 0
    unchanged: int = 0

    def line(self) -> str:
        return (f"export.{self.tool}: {self.created} runs created, {self.updated} updated, "
                f"{self.unchanged} unchanged ({self.where})")
