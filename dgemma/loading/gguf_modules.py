"""Modules whose weights stay in their GGUF blocks: each forward dequantizes what it multiplies by.

The blocks live in one `GGUFWeight` module per GGUF tensor. Where the checkpoint ties a weight (the encoder
and the decoder share every layer weight; the output head is the token embedding), the modules share that
one `GGUFWeight`, so moving the model moves each block tensor once and holds it once.

A weight read several times in one forward is dequantized once: while a scope is open (`hold_in_forward`)
its first dense result is kept and handed out again. The token embedding's scope is the model's forward
(the self-conditioning reads it twice, the output head once: one dequantization per step); the experts'
is their own module's forward, so at most one layer's experts are dense at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .gguf_quants import TYPES, dequantize

CHUNK_BYTES = 64 << 20  # float32 intermediate of one dequantization step; bounds a large tensor's transient


class GGUFWeight(nn.Module):
    """One GGUF tensor's blocks (uint8, one row of blocks per output row) and its torch-order shape."""

    def __init__(self, blocks: torch.Tensor, qtype: int, shape: tuple[int, ...], name: str):
        super().__init__()
        self.register_buffer("blocks", blocks)
        self.qtype, self.shape, self.gguf_name = qtype, tuple(shape), name
        self.scopes, self.held = 0, None  # open scopes; the dense tensor kept while one is open

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        held = self.held
        if held is not None and held.dtype == dtype and held.device == self.blocks.device:
            return held
        row = self.shape[-1] * 4
        out = dequantize(self.blocks, self.qtype, self.shape, dtype, chunk_rows=max(1, CHUNK_BYTES // row))
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


class GGUFEmbedding:
    """Mixed into the model's scaled word embedding: a lookup dequantizes only the rows it reads. `weight`
    is the whole dense matrix, made when read (the decoder's self-conditioning multiplies by all of it)."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        dtype = self.gguf.compute_dtype
        return self.gguf.rows(input_ids, dtype) * self.embed_scale.to(dtype)

    @property
    def weight(self) -> torch.Tensor:
        return self.gguf.dense(self.gguf.compute_dtype)


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


def make_embedding(module: nn.Module, source: GGUFWeight) -> None:
    del module._parameters["weight"]
    module.__class__ = mixed(type(module), GGUFEmbedding)
    module.gguf = source


def make_experts(module: nn.Module, gate_up: GGUFWeight, down: GGUFWeight) -> None:
    for name in ("gate_up_proj", "down_proj"):
        del module._parameters[name]
    module.__class__ = mixed(type(module), GGUFExperts)
    module.gguf_gate_up, module.gguf_down = gate_up, down
    hold_in_forward(module, [gate_up, down])


def hold_in_forward(module: nn.Module, weights: list[GGUFWeight]) -> None:
    """Keep each of `weights` dequantized once for the length of each `module` forward (a raised
    exception closes the scope too)."""
    def opened(*_):
        for w in weights:
            w.open_scope()

    def closed(*_):
        for w in weights:
            w.close_scope()

    module.register_forward_pre_hook(opened)
    module.register_forward_hook(closed, always_call=True)


def held_bytes(model: nn.Module) -> int:
    """Bytes of every block tensor, each counted once."""
    seen = {id(m.blocks): m.blocks.nbytes for m in model.modules() if isinstance(m, GGUFWeight)}
    return sum(seen.values())
