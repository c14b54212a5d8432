"""Weights stored packed (GGUF blocks, AutoRound INT4) and made dense in torch when a forward reads them.

A weight read several times in one forward is made dense once: while a scope is open (`hold_in_forward`)
its first dense result is kept and handed out again, and dropped when the scope closes. Fused experts
whose `gate_up_proj` and `down_proj` are such weights (`DenseExperts`) run transformers' own experts
forward over them, exactly as over dense parameters.
"""

from __future__ import annotations

import torch
from torch import nn


class HeldWeight(nn.Module):
    """A packed weight; subclasses say how it is made dense (`make`) in a dtype on its own device."""

    def __init__(self):
        super().__init__()
        self.scopes, self.held = 0, None  # open scopes; the dense tensor kept while one is open
        self.compute_dtype = torch.float32  # what `.weight`-style readers get; the loader sets the model's

    def make(self, dtype: torch.dtype) -> torch.Tensor:
        raise NotImplementedError

    def device(self) -> torch.device:
        return next(self.buffers()).device

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        held = self.held
        if held is not None and held.dtype == dtype and held.device == self.device():
            return held
        out = self.make(dtype)
        if self.scopes:
            self.held = out
        return out

    def open_scope(self) -> None:
        self.scopes += 1

    def close_scope(self) -> None:
        self.scopes = max(0, self.scopes - 1)
        if not self.scopes:
            self.held = None


class DenseExperts:
    """Mixed into transformers' fused experts: `gate_up_proj` and `down_proj` are made dense when the experts
    implementation reads them (`held_gate_up`, `held_down`: HeldWeights)."""

    @property
    def gate_up_proj(self) -> torch.Tensor:
        return self.held_gate_up.dense(self.held_gate_up.compute_dtype)

    @property
    def down_proj(self) -> torch.Tensor:
        return self.held_down.dense(self.held_down.compute_dtype)


_CLASSES: dict = {}


def mixed(cls, mixin):
    key = (cls, mixin)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"{mixin.__name__.removesuffix('Experts').removesuffix('Embedding')}{cls.__name__}",
                             (mixin, cls), {})
    return _CLASSES[key]


def make_experts(module: nn.Module, gate_up: HeldWeight, down: HeldWeight, mixin=DenseExperts) -> None:
    """Turn `module` (transformers' fused experts) into one that reads `gate_up` and `down`, each made dense
    once per forward of the module."""
    for name in ("gate_up_proj", "down_proj"):
        module._parameters.pop(name, None)
    module.__class__ = mixed(type(module), mixin)
    module.held_gate_up, module.held_down = gate_up, down
    hold_in_forward(module, [gate_up, down])


def hold_in_forward(module: nn.Module, weights: list[HeldWeight]) -> None:
    """Keep each of `weights` dense once for the length of each `module` forward (a raised exception closes
    the scope too)."""
    def opened(*_):
        for w in weights:
            w.open_scope()

    def closed(*_):
        for w in weights:
            w.close_scope()

    module.register_forward_pre_hook(opened)
    module.register_forward_hook(closed, always_call=True)
