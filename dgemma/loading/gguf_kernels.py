"""Fast GGUF block kernels for the types a K-quant file mostly holds (Q4_K, Q5_0, Q8_0, Q6_K).

Each kernel writes one chunk of blocks as float32 into a caller's buffer through `out=` and in-place
torch ops, so a chunk small enough to stay in the CPU's cache is read and written a few times without a
new allocation. The values are the `gguf` package's bit for bit: every product here is exact in float32
(a half-float scale's 11 significant bits times integers of at most 12 together fit its 24), so only
Q4_K's final subtraction rounds, and it is the reference's own operation on the same operands. Offsets
(q - 16, q - 32) are applied to the integers, as the reference does, so infinite scales give the same
infinities and NaNs.
"""

from __future__ import annotations

import torch

_TABLES: dict = {}


def _bit_table(device) -> torch.Tensor:
    """Byte -> its eight bits, least significant first, each as 0 or 16 (the fifth bit of a 5-bit quant),
    packed in one int64 so a gather moves eight weights' high bits at once."""
    key = ("bits16", str(device))
    if key not in _TABLES:
        byte = torch.arange(256, dtype=torch.int64).reshape(256, 1)
        bits = ((byte >> torch.arange(8).reshape(1, 8)) & 1).to(torch.uint8) << 4
        _TABLES[key] = bits.contiguous().view(torch.int64).reshape(256).to(device)
    return _TABLES[key]


def _half(raw: torch.Tensor) -> torch.Tensor:
    """(n, 2) little-endian half floats -> (n, 1) float32."""
    return raw.contiguous().view(torch.float16).float()


def _wide(*tensors: torch.Tensor) -> tuple[torch.dtype, int]:
    """The widest integer (int32, int16 or uint8) all these byte tensors can be viewed as, and the byte
    mask repeated to it: uint8 shifts run element by element, so bytes are shifted four or two at a time
    (the masks drop whatever crosses from a neighbouring byte)."""
    for dtype, width, repeat in ((torch.int32, 4, 0x01010101), (torch.int16, 2, 0x0101)):
        if all(t.shape[-1] % width == 0 and t.stride(-1) == 1 and t.storage_offset() % width == 0
               and all(s % width == 0 for s in t.stride()[:-1]) for t in tensors):
            return dtype, repeat
    return torch.uint8, 1


def _split_nibbles(qs: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Bytes (n, g, w) -> (n, g, 2, w): each group's low nibbles, then its high ones. The two halves are
    written whole into `q` (all low nibbles, then all high ones: long contiguous runs, fast to shift)
    and handed back as a view in the weights' order."""
    n, g, w = qs.shape
    halves = q.reshape(-1)[:2 * qs.numel()].view(2, n, g, w)
    low, high = halves[0], halves[1]
    dtype, repeat = _wide(qs, low, high)
    wide_qs, low, high = qs.view(dtype), low.view(dtype), high.view(dtype)
    torch.bitwise_and(wide_qs, 0x0F * repeat, out=low)
    torch.bitwise_right_shift(wide_qs, 4, out=high)
    high.bitwise_and_(0x0F * repeat)
    return halves.permute(1, 2, 0, 3)


def q8_0(b: torch.Tensor, f: torch.Tensor, _q: torch.Tensor) -> None:
    f.copy_(b[:, 2:].view(torch.int8))
    f.mul_(_half(b[:, :2]))


def q5_0(b: torch.Tensor, f: torch.Tensor, q: torch.Tensor) -> None:
    n = b.shape[0]
    qs, weights = b[:, 6:], q.reshape(-1)[:n * 32].view(n, 2, 16)
    dtype, repeat = _wide(qs, weights[:, 0])  # a block is short: here writing in the weights' order is faster
    wide_qs = qs.view(dtype)
    torch.bitwise_and(wide_qs, 0x0F * repeat, out=weights[:, 0].view(dtype))
    high_nibbles = weights[:, 1].view(dtype)
    torch.bitwise_right_shift(wide_qs, 4, out=high_nibbles)
    high_nibbles.bitwise_and_(0x0F * repeat)
    fifth = torch.take(_bit_table(b.device), b[:, 2:6].reshape(-1).long()).view(torch.uint8).view(n, 2, 16)
    weights.bitwise_or_(fifth).sub_(16)  # wraps in uint8: read as int8 it is q - 16
    f.view(n, 2, 16).copy_(weights.view(torch.int8))
    f.mul_(_half(b[:, :2]))


def k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12 bytes of a Q4_K/Q5_K super-block: eight 6-bit scales and eight 6-bit mins."""
    n = s.shape[0]
    s = s.reshape(n, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales, mins


def q4_k(b: torch.Tensor, f: torch.Tensor, q: torch.Tensor) -> None:
    n = b.shape[0]
    nibbles = _split_nibbles(b[:, 16:].reshape(n, 4, 32), q)
    sc, mn = k_scales(b[:, 4:16])
    d = (_half(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_half(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    g = f.view(n, 8, 32)
    g.view(n, 4, 2, 32).copy_(nibbles)
    g.mul_(d).sub_(dm)


def q6_k(b: torch.Tensor, f: torch.Tensor, q: torch.Tensor) -> None:
    n = b.shape[0]
    low = _split_nibbles(b[:, :128].reshape(n, 2, 64), q)  # (n, half, nibble, 64)
    qh = b[:, 128:192].reshape(n, 2, 32)
    dtype, repeat = _wide(qh, low[:, :, 0, :32])
    qh = qh.view(dtype)
    for k in range(4):  # bits 2k..2k+1 of the high byte are the top two bits of the k-th 32 of each half
        part = torch.bitwise_left_shift(qh, 4 - 2 * k) if k < 2 else torch.bitwise_right_shift(qh, 2 * k - 4)
        low[:, :, k // 2, (k % 2) * 32:(k % 2 + 1) * 32].view(dtype).bitwise_or_(part.bitwise_and_(0x30 * repeat))
    q.reshape(-1)[:n * 256].sub_(32)  # wraps in uint8: read as int8 it is q - 32
    d = (_half(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()).reshape(n, 16, 1)
    f.view(n, 2, 2, 64).copy_(low.view(torch.int8))
    f.view(n, 16, 16).mul_(d)


KERNELS = {6: q5_0, 8: q8_0, 12: q4_k, 14: q6_k}
