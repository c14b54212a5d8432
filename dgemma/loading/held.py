"""Weights stored packed (GGUF blocks, AutoRound INT4) and made dense in torch when a forward reads them.

A weight read several times in one forward is made dense once: while a scope is open (`hold_in_forward`)
its first dense result is kept and handed out again, and dropped when the scope closes. Fused experts
whose `gate_up_proj` and `down_proj` are such weights (`make_experts`) run transformers' own experts
forward over them, exactly as over dense parameters. Where the experts share a `Scratch`, every layer's
are made dense into the same buffers (fresh pages would cost a fault each, every layer).
"""

from __future__ import annotations

import threading

import torch
from torch import nn


class Scratch(nn.Module):
    """The dense buffers the experts of every layer are made dense into, one per tensor shape and dtype
    (non-persistent buffers: the model holds and moves them, no checkpoint lists them). A forward of the
    experts holds `lock`, so two threads running the model never write one buffer at once."""

    def __init__(self):
        super().__init__()
        self.lock = threading.RLock()

    def buffer(self, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
        name = "x".join(map(str, shape)) + "_" + str(dtype).removeprefix("torch.")
        found = self._buffers.get(name)
        if found is None or found.device != torch.device(device):
            found = torch.zeros(shape, dtype=dtype, device=device)  # written now: held from here, as counted
            self.register_buffer(name, found, persistent=False)
        return found


class HeldWeight(nn.Module):
    """A packed weight of torch-order `shape`; subclasses say how it is made dense (`make`, into `out` when
    given) on the device of its first buffer."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape = tuple(shape)
        self.scopes, self.held = 0, None  # open scopes; the dense tensor kept while one is open
        self.scratch = None  # the Scratch a scope's dense tensor is written into, where shared
        self.compute_dtype = torch.float32  # what `.weight`-style readers get; the loader sets the model's

    def make(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError

    def device(self) -> torch.device:
        return next(self.buffers()).device

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        held = self.held
        if held is not None and held.dtype == dtype and held.device == self.device():
            return held
        into = None
        if self.scopes and self.scratch is not None:  # outside a scope a caller gets a tensor of its own
            into = self.scratch.buffer(self.shape, dtype, self.device())
        out = self.make(dtype, into)
        if self.scopes:
            self.held = out
        return out

    def open_scope(self) -> None:
        self.scopes += 1

    def close_scope(self) -> None:
        self.scopes = max(0, self.scopes - 1)
        if not self.scopes:
            self.held = None


class HeldLinear(nn.Module):
    """nn.Linear without bias whose weight is made dense, in the input's dtype, at each call."""

    def __init__(self, source: HeldWeight):
        super().__init__()
        self.source = source
        self.out_features, self.in_features = source.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.source.dense(x.dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight (made now), for code that reads a linear's `.weight`."""
        return self.source.dense(self.source.compute_dtype)


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


def make_experts(module: nn.Module, gate_up: HeldWeight, down: HeldWeight, scratch: Scratch | None = None) -> None:
    """Turn `module` (transformers' fused experts) into one that reads `gate_up` and `down`, each made dense
    once per forward of the module (into `scratch`'s buffers when given, made now: held from the load on)."""
    for name in ("gate_up_proj", "down_proj"):
        module._parameters.pop(name, None)
    cls = type(module)
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Dense{cls.__name__}", (DenseExperts, cls), {})
    module.__class__ = _CLASSES[cls]
    module.held_gate_up, module.held_down = gate_up, down
    if scratch is not None:
        for w in (gate_up, down):
            object.__setattr__(w, "scratch", scratch)  # a reference, not a submodule: the model owns it once
            scratch.buffer(w.shape, w.compute_dtype, w.device())
    hold_in_forward(module, [gate_up, down], None if scratch is None else scratch.lock)


def hold_in_forward(module: nn.Module, weights: list[HeldWeight], lock=None) -> None:
    """Keep each of `weights` dense once for the length of each `module` forward (a raised exception closes
    the scope too), holding `lock` meanwhile if given."""
    def opened(*_):
        if lock is not None:
            lock.acquire()
        for w in weights:
            w.open_scope()

    def closed(*_):
        for w in weights:
            w.close_scope()
        if lock is not None:
            lock.release()

    module.register_forward_pre_hook(opened)
    module.register_forward_hook(closed, always_call=True)
