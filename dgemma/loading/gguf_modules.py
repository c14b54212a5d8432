"""Modules whose weights stay in their GGUF blocks: each forward dequantizes what it multiplies by.

The blocks live in one `GGUFWeight` module per GGUF tensor. Where the checkpoint ties a weight (the encoder
and the decoder share every layer weight), the modules share that one `GGUFWeight`, so moving the model
moves each block tensor once and holds it once. The token embedding is not among them: the output head
and the self-conditioning multiply by all of it every step, so the loader keeps it dense (gguf_load).

Linears and experts read them as any packed weight (held.py: `HeldLinear`, `make_experts`). The experts are
dequantized once per forward of their module, into a `Scratch` buffer that every layer shares: one layer's
experts are dense at a time, always in the same memory.
"""

from __future__ import annotations

import torch

from .gguf_quants import TYPES, dequantize
from .held import HeldWeight

CHUNK_BYTES = 64 << 20  # float32 intermediate of one dequantization step; bounds a large tensor's transient


def chunk_rows(shape: tuple[int, ...]) -> int:
    """Rows per dequantization step of a type without a fast kernel (CHUNK_BYTES of float32)."""
    return max(1, CHUNK_BYTES // (shape[-1] * 4))


class GGUFWeight(HeldWeight):
    """One GGUF tensor's blocks (uint8, one row of blocks per output row) and its torch-order shape."""

    def __init__(self, blocks: torch.Tensor, qtype: int, shape: tuple[int, ...], name: str):
        super().__init__(shape)
        self.register_buffer("blocks", blocks)
        self.qtype, self.gguf_name = qtype, name

    def make(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        return dequantize(self.blocks, self.qtype, self.shape, dtype, chunk_rows=chunk_rows(self.shape), out=out)

    def device(self) -> torch.device:
        return self.blocks.device

    def extra_repr(self) -> str:
        return f"{self.gguf_name}, {TYPES[self.qtype][0]}, {list(self.shape)}"
