"""Modules whose weights stay in their GGUF blocks: each forward dequantizes what it multiplies by.

The blocks live in one `GGUFWeight` module per GGUF tensor. Where the checkpoint ties a weight (the encoder
and the decoder share every layer weight), the modules share that one `GGUFWeight`, so moving the model
moves each block tensor once and holds it once. The token embedding is not among them: the output head
and the self-conditioning multiply by all of it every step, so the loader keeps it dense (gguf_load).

A weight read several times in one forward is dequantized once: while a scope is open (`hold_in_forward`)
its first dense result is kept and handed out again. The experts' scope is their own module's forward,
and inside it they are dequantized into a `Scratch` buffer that every layer shares: one layer's experts
are dense at a time, always in the same memory (fresh pages would cost a fault each, every layer).
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from .gguf_quants import TYPES, dequantize

CHUNK_BYTES = 64 << 20  # float32 intermediate of one dequantization step; bounds a large tensor's transient


def chunk_rows(shape: tuple[int, ...]) -> int:
    """Rows per dequantization step of a type without a fast kernel (CHUNK_BYTES of float32)."""
    return max(1, CHUNK_BYTES // (shape[-1] * 4))


class Scratch(nn.Module):
    """The dense buffers the experts of every layer are dequantized into, one per tensor shape and dtype
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


class GGUFWeight(nn.Module):
    """One GGUF tensor's blocks (uint8, one row of blocks per output row) and its torch-order shape."""

    def __init__(self, blocks: torch.Tensor, qtype: int, shape: tuple[int, ...], name: str):
        super().__init__()
        self.register_buffer("blocks", blocks)
        self.qtype, self.shape, self.gguf_name = qtype, tuple(shape), name
        self.scopes, self.held = 0, None  # open scopes; the dense tensor kept while one is open
        self.scratch = None  # the Scratch a scope's dense tensor is written into, where shared

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        held = self.held
        if held is not None and held.dtype == dtype and held.device == self.blocks.device:
            return held
        into = None
        if self.scopes and self.scratch is not None:  # outside a scope a caller gets a tensor of its own
            into = self.scratch.buffer(self.shape, dtype, self.blocks.device)
        out = dequantize(self.blocks, self.qtype, self.shape, dtype, chunk_rows=chunk_rows(self.shape), out=into)
        if self.scopes:
            self.held = out
        return out

    def open_scope(self) -> None:
        self.scopes += 1

    def close_scope(self) -> None:
        self.scopes = max(0, self.scopes - 1)
        if not self.scopes:
            self.held = None

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` of a 2-D weight: each row is whole blocks, so only those rows are dequantized."""
        flat = self.blocks.reshape(self.shape[0], -1)[ids.reshape(-1)]
        return dequantize(flat, self.qtype, (*ids.shape, self.shape[-1]), dtype)

    def extra_repr(self) -> str:
        return f"{self.gguf_name}, {TYPES[self.qtype][0]}, {list(self.shape)}"


class GGUFLinear(nn.Module):
    """nn.Linear without bias whose weight is dequantized, in the input's dtype, at each call."""

    def __init__(self, source: GGUFWeight):
        super().__init__()
        self.source = source
        self.out_features, self.in_features = source.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.source.dense(x.dtype))

    @property
    def weight(self) -> torch.Tensor:
        """The dense weight (made now), for code that reads a linear's `.weight`."""
        return self.source.dense(self.source.compute_dtype)


class GGUFExperts:
    """Mixed into transformers' fused experts: `gate_up_proj` and `down_proj` are dequantized when the
    experts implementation reads them, so it computes exactly as with dense weights."""

    @property
    def gate_up_proj(self) -> torch.Tensor:
        return self.gguf_gate_up.dense(self.gguf_gate_up.compute_dtype)

    @property
    def down_proj(self) -> torch.Tensor:
        return self.gguf_down.dense(self.gguf_down.compute_dtype)


_CLASSES: dict = {}


def mixed(cls, mixin):
    key = (cls, mixin)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"GGUF{cls.__name__}", (mixin, cls), {})
    return _CLASSES[key]


def make_experts(module: nn.Module, gate_up: GGUFWeight, down: GGUFWeight, scratch: Scratch,
                 dtype: torch.dtype) -> None:
    for name in ("gate_up_proj", "down_proj"):
        del module._parameters[name]
    module.__class__ = mixed(type(module), GGUFExperts)
    module.gguf_gate_up, module.gguf_down = gate_up, down
    for w in (gate_up, down):
        object.__setattr__(w, "scratch", scratch)  # a reference, not a submodule: the model owns it once
        scratch.buffer(w.shape, dtype, w.blocks.device)  # made now: the model holds it from the load on
    hold_in_forward(module, [gate_up, down], scratch.lock)


def hold_in_forward(module: nn.Module, weights: list[GGUFWeight], lock=None) -> None:
    """Keep each of `weights` dequantized once for the length of each `module` forward (a raised
    exception closes the scope too), holding `lock` meanwhile if given."""
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


def held_bytes(model: nn.Module) -> int:
    """Bytes of every block tensor, each counted once."""
    seen = {id(m.blocks): m.blocks.nbytes for m in model.modules() if isinstance(m, GGUFWeight)}
    return sum(seen.values())
