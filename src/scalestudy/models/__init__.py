"""The models the built-in trainer trains, each readable in one sitting: ``gpt`` (GPT-2 /
Megatron style) and ``llama`` (RMSNorm, RoPE, grouped-query attention, SwiGLU). ``build_model``
turns a :class:`scalestudy.config.parts.Model` into its ``nn.Module`` by ``model.arch``
(published shapes: ``scalestudy.config.presets``)."""

from __future__ import annotations

from torch import nn

from scalestudy.config.parts import Model


def build_model(spec: Model) -> nn.Module:
    """The decoder ``spec`` describes (on the current default device)."""
    from scalestudy.config.vocab import Arch

    if spec.arch == Arch.LLAMA:
        from scalestudy.models.llama import Llama

        return Llama(spec)
    from scalestudy.models.gpt import GPT

    return GPT(spec)


def num_params(model: nn.Module) -> int:
    """Unique parameters of a module (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
