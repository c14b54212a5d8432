"""GGUF blocks made dense on the CPU in one pass per weight, compiled by numba.

torch has no fused op for a block format: in torch each weight goes through several passes over memory
(bytes to float32, the scale, the offset, the cast), and each pass costs about as much as the whole loop
here. Each kernel reads a block's bytes once and writes each weight once, as float32 or as bfloat16
(its bits, rounded to nearest even as torch's cast rounds): a layer's experts are dense in about a fourth
of the torch kernels' time (decision 0036).

The values are the `gguf` package's bit for bit: each weight is formed by the reference's float32
operations in its order (numba fuses no multiply into an add unless told to), its half-float scales read
from a table of every half's value. Without numba, `KERNELS` is empty and the torch kernels do the work.
"""

from __future__ import annotations

import numpy as np
import torch

try:
    import numba
    import numba.extending
except ImportError:  # optional: the torch kernels are the fallback
    numba = None

# type id -> kernel(blocks, out, HALVES, zero): each block's weights into out, as zero's type (float32, or
# uint16 for bfloat16's bits): numba compiles a kernel for each type, the cast inlined in its loop
KERNELS: dict = {}
# every half float's value by its bits: a block's scales read from a table the cache keeps (exact)
HALVES = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def run(qtype: int, blocks: torch.Tensor, out: torch.Tensor) -> None:
    """Blocks (n, bytes) -> `out` (n, weights per block), float32 or bfloat16, contiguous, on the CPU."""
    bf16 = out.dtype == torch.bfloat16
    target = out.view(torch.int16).numpy().view(np.uint16) if bf16 else out.numpy()
    KERNELS[qtype](blocks.numpy(), target, HALVES, target.dtype.type(0))


if numba is not None:
    # compiled in each process (about 0.2 s a kernel, at its first use): numba's disk cache is keyed by the
    # source file but names the module, which differs between ComfyUI, the headless runner and the tests
    jit = numba.njit(nogil=True, boundscheck=False)

    def _cast(value, zero):
        """value (float32) as zero's type: itself, or (uint16) its bfloat16 bits."""

    @numba.extending.overload(_cast)
    def _cast_to(value, zero):  # chosen when a kernel compiles, by zero's type
        if zero != numba.types.uint16:
            return lambda value, zero: value

        def bfloat16(value, zero):  # rounded to nearest even, as torch casts; NaN as 0x7FC0
            u = np.uint32(np.float32(value).view(np.uint32))
            if value != value:
                return np.uint16(0x7FC0)
            return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
        return bfloat16

    @jit
    def _le(low, high):
        """Two little-endian bytes as one number."""
        return np.int64(low) | (np.int64(high) << 8)

    @jit
    def _k_scale(j, d, m, md):
        """Group j's 6-bit scale and min in a Q4_K/Q5_K block, from scale bytes j % 4, 4 + j % 4, 8 + j % 4."""
        if j < 4:
            return d & 63, m & 63
        return (md & 15) | ((d >> 2) & 48), (md >> 4) | ((m >> 2) & 48)

    @jit
    def _q8_0(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d = half[_le(blocks[b, 0], blocks[b, 1])]
            for i in range(32):
                out[b, i] = _cast(d * np.float32(np.int8(blocks[b, 2 + i])), zero)

    @jit
    def _q4_0(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d = half[_le(blocks[b, 0], blocks[b, 1])]
            for i in range(16):  # a byte's low nibble is weight i, its high one weight i + 16
                out[b, i] = _cast(d * np.float32((blocks[b, 2 + i] & 15) - 8), zero)
                out[b, i + 16] = _cast(d * np.float32((blocks[b, 2 + i] >> 4) - 8), zero)

    @jit
    def _q4_1(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d, m = half[_le(blocks[b, 0], blocks[b, 1])], half[_le(blocks[b, 2], blocks[b, 3])]
            for i in range(16):
                out[b, i] = _cast(d * np.float32(blocks[b, 4 + i] & 15) + m, zero)
                out[b, i + 16] = _cast(d * np.float32(blocks[b, 4 + i] >> 4) + m, zero)

    @jit
    def _q5_0(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d = half[_le(blocks[b, 0], blocks[b, 1])]
            qh = _le(blocks[b, 2], blocks[b, 3]) | (_le(blocks[b, 4], blocks[b, 5]) << 16)  # bit i: weight i's
            for i in range(16):
                low = (blocks[b, 6 + i] & 15) | (((qh >> i) & 1) << 4)
                high = (blocks[b, 6 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)
                out[b, i] = _cast(d * np.float32(low - 16), zero)
                out[b, i + 16] = _cast(d * np.float32(high - 16), zero)

    @jit
    def _q5_1(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d, m = half[_le(blocks[b, 0], blocks[b, 1])], half[_le(blocks[b, 2], blocks[b, 3])]
            qh = _le(blocks[b, 4], blocks[b, 5]) | (_le(blocks[b, 6], blocks[b, 7]) << 16)
            for i in range(16):
                low = (blocks[b, 8 + i] & 15) | (((qh >> i) & 1) << 4)
                high = (blocks[b, 8 + i] >> 4) | (((qh >> (i + 16)) & 1) << 4)
                out[b, i] = _cast(d * np.float32(low) + m, zero)
                out[b, i + 16] = _cast(d * np.float32(high) + m, zero)

    @jit
    def _k_quant(blocks, out, half, zero, quants, fifth):
        """Q4_K (fifth 0) or Q5_K (fifth 1: each weight's fifth bit from bytes 16..47, quants from `quants` on)."""
        for b in range(blocks.shape[0]):
            d, dmin = half[_le(blocks[b, 0], blocks[b, 1])], half[_le(blocks[b, 2], blocks[b, 3])]
            for j in range(8):
                sc, mn = _k_scale(j, blocks[b, 4 + j % 4], blocks[b, 8 + j % 4], blocks[b, 12 + j % 4])
                dl, ml = d * np.float32(sc), dmin * np.float32(mn)
                shift, base = 4 * (j % 2), quants + (j // 2) * 32
                for i in range(32):
                    q = ((blocks[b, base + i] >> shift) & 15) | ((((blocks[b, 16 + i] >> j) & 1) * fifth) << 4)
                    out[b, j * 32 + i] = _cast(dl * np.float32(q) - ml, zero)

    @jit
    def _q4_k(blocks, out, half, zero):
        _k_quant(blocks, out, half, zero, 16, 0)

    @jit
    def _q5_k(blocks, out, half, zero):
        _k_quant(blocks, out, half, zero, 48, 1)

    @jit
    def _q6_k(blocks, out, half, zero):
        for b in range(blocks.shape[0]):
            d = half[_le(blocks[b, 208], blocks[b, 209])]
            for g in range(16):  # 16 weights share a scale
                dl = d * np.float32(np.int8(blocks[b, 192 + g]))
                for k in range(16):
                    w = g * 16 + k
                    top, c = w // 128, w % 64
                    low = (blocks[b, top * 64 + c] >> (4 * ((w % 128) // 64))) & 15
                    high = (blocks[b, 128 + top * 32 + w % 32] >> (2 * ((w % 128) // 32))) & 3
                    out[b, w] = _cast(dl * np.float32(np.int8(low | (high << 4)) - 32), zero)

    KERNELS.update({8: _q8_0, 2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 12: _q4_k, 13: _q5_k, 14: _q6_k})
