"""The models the built-in trainer trains, each readable in one sitting. ``build_model``
turns a :class:`scalestudy.config.point.Model` into its ``nn.Module``."""

from __future__ import annotations

from torch import nn

from scalestudy.config.point import Model


def build_model(spec: Model) -> nn.Module:
    """The decoder ``spec`` describes (on the current default device)."""
    from scalestudy.models.gpt import GPT

    return GPT(spec)


def num_params(model: nn.Module) -> int:
    """Unique parameters of a module (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
