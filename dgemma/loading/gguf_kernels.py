"""Fast GGUF block kernels in torch for the types a K-quant file mostly holds (Q4_K, Q5_0, Q8_0, Q6_K): what
an accelerator runs, and a CPU without numba (gguf_numba.py is the CPU's faster path).

A kernel is made for a tensor's blocks (their storage offset a multiple of 8: its views read bytes as
wider types) and a chunk size; it makes its views of the blocks' fields and of its scratch buffers once,
then each call writes one chunk of blocks as float32 with a few `out=` and in-place torch ops and no
new allocation. Every op runs over long contiguous runs: a block's fields make rows of 2 to 32 bytes,
and an op over rows that short runs several times slower; a copy (or a concatenation, here of bytes
viewed as float64: moved, never changed) is the exception, so bytes are split in bulk and then moved
into the weights' order. `scales` turns the scale bytes of a batch of chunks into float32 factors in
reused buffers (a dozen small ops, too many to pay for each chunk).

The values are the `gguf` package's bit for bit: every product here is exact in float32 (a half-float
scale's 11 significant bits times integers of at most 12 together fit its 24), so only Q4_K's final
subtraction rounds, and it is the reference's own operation on the same operands. Offsets (q - 16,
q - 32) are applied to the integers, as the reference does, so infinite scales give the same
infinities and NaNs.
"""

from __future__ import annotations

import torch

_TABLES: dict = {}
INT16, INT32 = (torch.int16, 0x0101), (torch.int32, 0x01010101)  # lanes and a byte repeated to them


def _fifth_bit_table(device) -> torch.Tensor:
    """Byte -> eight bytes, least significant bit first, each 0x00 where the bit is set and 0xF0 where it
    is not: OR-ed onto a nibble q it gives the Q5_0 quant q + 16 * bit - 16 as an int8 (a nibble minus 16
    is the nibble with the top four bits set)."""
    key = ("fifth", str(device))
    if key not in _TABLES:
        byte = torch.arange(256, dtype=torch.int64).reshape(256, 1)
        clear = ((byte >> torch.arange(8).reshape(1, 8)) & 1) ^ 1
        _TABLES[key] = (clear.to(torch.uint8) * 0xF0).contiguous().view(torch.int64).reshape(256).to(device)
    return _TABLES[key]


def _nibble_masks(device) -> torch.Tensor:
    """The int32 masks of low and high nibbles, (2, 1, 1), on `device`, made once (never in a forward)."""
    key = ("nibbles", str(device))
    if key not in _TABLES:
        masks = [_signed(byte * INT32[1], torch.int32) for byte in (0x0F, 0xF0)]
        _TABLES[key] = torch.tensor(masks, dtype=torch.int32).view(2, 1, 1).to(device)
    return _TABLES[key]


def _signed(value: int, dtype: torch.dtype) -> int:
    """The bits of `value` read as `dtype` (a mask like 0xF0F0F0F0 is negative as an int32)."""
    bits = 8 * dtype.itemsize
    return value - (1 << bits) if dtype.is_signed and value >> (bits - 1) else value


def _int(value: int, dtype: torch.dtype) -> torch.Tensor:
    """`value` as a 0-d CPU tensor of `dtype`, made once: an int operand is made into one at every op."""
    key = (value, dtype)
    if key not in _TABLES:
        _TABLES[key] = torch.tensor(_signed(value, dtype), dtype=dtype)
    return _TABLES[key]


def _split_nibbles(qs: torch.Tensor, low: torch.Tensor, high: torch.Tensor, repeat: int) -> None:
    """Lanes of bytes -> their low nibbles into `low` and their high ones into `high`. Bytes go two or four
    at a time (uint8 shifts run element by element); the mask drops what a shift moves across bytes."""
    nibble = _int(0x0F * repeat, qs.dtype)
    torch.bitwise_and(qs, nibble, out=low)
    torch.bitwise_right_shift(qs, _int(4, qs.dtype), out=high)
    high.bitwise_and_(nibble)


class Q8_0:
    """A kernel for the blocks `blocks`: `scales(first, stop)` for up to `batch` of them at once, then
    a call per chunk of `f.shape[0]` blocks, its last op writing `out` (`f` itself, or the float32
    result's rows: one pass less); `views` makes the chunk's views again for a shorter one. `scratch`:
    the bytes of the uint8 scratch `q` it takes per weight of a chunk."""

    scratch = 0

    def __init__(self, blocks: torch.Tensor, f: torch.Tensor, q: torch.Tensor, batch: int):
        self.blocks, self.d = blocks, torch.empty(batch, 1, device=blocks.device)
        self.views(f, q)

    def views(self, f: torch.Tensor, q: torch.Tensor) -> None:
        self.f, self.quants = f, self.blocks[:, 2:].view(torch.int8)

    def scales(self, first: int, stop: int) -> list[torch.Tensor]:
        d = self.d[:stop - first]
        d.copy_(self.blocks[first:stop, :2].view(torch.float16))
        return [d]

    def __call__(self, start: int, scales, out: torch.Tensor) -> None:
        out.copy_(self.quants[start:start + out.shape[0]])  # two passes only: in `out` itself is faster
        out.mul_(scales[0])


class Q5_0(Q8_0):
    """The nibbles of every byte of a chunk are split in bulk, then its quant bytes' nibbles are copied
    into the weights' order and OR-ed onto the fifth bits (a table lookup per byte of qh)."""

    scratch = 4

    def views(self, f: torch.Tensor, q: torch.Tensor) -> None:
        n = self.n = f.shape[0]
        self.f, self.qh, self.table = f, self.blocks[:, 2:6], _fifth_bit_table(self.blocks.device)
        self.lanes, self.repeat = INT16
        self.bytes = self.blocks.view(-1).view(self.lanes)
        self.weights = q[:32 * n].view(torch.int64)
        nibbles = q[32 * n:64 * n].view(n, 2, 16)
        self.nibbles = nibbles.view(-1).view(torch.int64)
        low, high = q[64 * n:86 * n], q[86 * n:108 * n]
        self.low, self.high = low.view(self.lanes), high.view(self.lanes)
        self.moves = [(nibbles[:, 0], low.view(n, 22)[:, 6:]), (nibbles[:, 1], high.view(n, 22)[:, 6:])]
        self.index = q[108 * n:124 * n].view(torch.int32)
        self.quants = self.weights.view(torch.int8).view(n, 32)

    def __call__(self, start: int, scales, out: torch.Tensor) -> None:
        n = self.n
        self.index.view(n, 4).copy_(self.qh[start:start + n])
        torch.index_select(self.table, 0, self.index, out=self.weights)
        _split_nibbles(self.bytes[start * 11:(start + n) * 11], self.low, self.high, self.repeat)
        for to, source in self.moves:
            to.copy_(source)
        self.weights.bitwise_or_(self.nibbles)
        self.f.copy_(self.quants)
        torch.mul(self.f, scales[0], out=out)


def k_scales(s: torch.Tensor) -> torch.Tensor:
    """The 12 scale bytes of Q4_K/Q5_K super-blocks (n, 12) -> (n, 16) uint8: each block's eight 6-bit
    scales, then its eight 6-bit mins."""
    out = torch.empty(s.shape[0], 16, dtype=torch.uint8, device=s.device)
    _k_scales(s.clone(memory_format=torch.contiguous_format).view(torch.int32), out.view(torch.int32))
    return out


def _k_scales(lanes: torch.Tensor, out: torch.Tensor) -> None:
    """(n, 3) int32 lanes of scale bytes (overwritten) -> (n, 4) int32 lanes of the 6-bit scales and mins.
    Each op runs over one column, n long: a row of a few lanes would be too short."""
    d, m, md = lanes.unbind(1)
    lo_scales, hi_scales, lo_mins, hi_mins = out.unbind(1)
    torch.bitwise_and(d, 0x3F3F3F3F, out=lo_scales)
    torch.bitwise_and(m, 0x3F3F3F3F, out=lo_mins)
    for high, six, bits in ((hi_scales, d, 0), (hi_mins, m, 4)):  # the top two bits, then the low four
        torch.bitwise_right_shift(six, 2, out=high).bitwise_and_(0x30303030)
        torch.bitwise_right_shift(md, bits, out=d).bitwise_and_(0x0F0F0F0F)  # d is read: free now
        high.bitwise_or_(d)


class Q4_K(Q8_0):
    """All low nibbles of a chunk, then all its high ones (long runs), moved into the weights' order
    eight bytes at a time as float64 (bytes a concatenation moves are moved, never changed). A high
    nibble h is kept in place, as 16 * h, and its group's d * scale is divided by 16 instead: a power of
    two, so the product is still exactly d * scale * h."""

    scratch = 2

    def __init__(self, blocks: torch.Tensor, f: torch.Tensor, q: torch.Tensor, batch: int):
        device = blocks.device
        self.head = torch.empty(batch, 16, dtype=torch.uint8, device=device)
        self.sixes = torch.empty(batch, 16, dtype=torch.uint8, device=device)
        self.halves, self.scaled = torch.empty(batch, 8, device=device), torch.empty(2, batch, 8, device=device)
        self.blocks = blocks
        self.views(f, q)

    def views(self, f: torch.Tensor, q: torch.Tensor) -> None:
        n = self.n = f.shape[0]
        self.qs, self.nibbles = self.blocks.view(torch.int32)[:, 4:], _nibble_masks(self.blocks.device)
        halves = q[:256 * n].view(2, n, 128)
        self.split = halves.view(torch.int32)
        self.pieces = [halves[0].view(torch.float64).view(n, 4, 4), halves[1].view(torch.float64).view(n, 4, 4)]
        ordered = q[256 * n:512 * n]
        self.ordered, self.quants = ordered.view(torch.float64).view(n, 4, 8), ordered.view(n, 8, 32)
        self.f, self.g = f, f.view(n, 8, 32)

    def scales(self, first: int, stop: int) -> list[torch.Tensor]:
        """Each 32-weight group's d * scale and dmin * min, (n, 8, 1) each: exact products, as the
        reference forms them."""
        n = stop - first
        head, halves, scaled = self.head[:n], self.halves[:n], self.scaled[:, :n]
        head.copy_(self.blocks[first:stop, :16])
        halves.copy_(head.view(torch.float16))  # d and dmin, and six more: a whole row converts faster
        _k_scales(head.view(torch.int32)[:, 1:], self.sixes[:n].view(torch.int32))
        # each in its own contiguous run: the chunk's ops read them at twice the speed of a strided one
        scaled.copy_(self.sixes[:n].view(n, 2, 8).transpose(0, 1)).mul_(halves[:, :2].t().unsqueeze(-1))
        scaled[0, :, 1::2].mul_(0.0625)  # >= 2**-28 where not 0: far from float32's subnormals
        return [scaled[0].unsqueeze(-1), scaled[1].unsqueeze(-1)]

    def __call__(self, start: int, scales, out: torch.Tensor) -> None:
        torch.bitwise_and(self.qs[start:start + self.n], self.nibbles, out=self.split)  # both halves at once
        torch.cat(self.pieces, dim=-1, out=self.ordered)
        self.g.copy_(self.quants)
        self.g.mul_(scales[0])
        torch.sub(self.g, scales[1], out=out.view(self.g.shape))


class Q6_K(Q8_0):
    """The quant of 32-weight part k of a half is nibble k // 2 of ql's group k % 2 and bits 2k..2k+1 of
    qh. The nibbles and the bits are each built in bulk, moved into the weights' order, then OR-ed."""

    scratch = 4

    def __init__(self, blocks: torch.Tensor, f: torch.Tensor, q: torch.Tensor, batch: int):
        self.d, self.scaled = torch.empty(batch, 1, device=blocks.device), torch.empty(batch, 16, device=blocks.device)
        self.blocks = blocks
        self.views(f, q)

    def views(self, f: torch.Tensor, q: torch.Tensor) -> None:
        n = self.n = f.shape[0]
        self.f, (self.lanes, self.repeat) = f, INT16
        self.ql, self.qh = self.blocks.view(self.lanes)[:, :64], self.blocks[:, 128:192]
        nibbles, qh = q[:256 * n].view(2, n, 2, 2, 32), q[256 * n:320 * n].view(n, 64)
        self.low, self.high = nibbles[0].view(n, -1).view(self.lanes), nibbles[1].view(n, -1).view(self.lanes)
        self.qh_copy, self.qh_lanes = qh, qh.view(self.lanes)
        bits = q[320 * n:576 * n].view(4, n, 2, 32)
        self.bits = [bits[k].view(n, -1).view(self.lanes) for k in range(4)]
        self.all_bits = bits.view(-1).view(self.lanes)
        ordered, ordered_bits = q[576 * n:832 * n], q[:256 * n]  # the nibbles are moved out first
        w = torch.float64  # (pieces, where they go side by side), eight bytes at a time
        self.moves = [([nibbles[i].view(w).view(n, 2, 1, 8) for i in range(2)], ordered.view(w).view(n, 2, 2, 8)),
                      ([bits[k].view(w).view(n, 2, 1, 4) for k in range(4)], ordered_bits.view(w).view(n, 2, 4, 4))]
        self.ordered, self.ordered_bits = ordered.view(self.lanes), ordered_bits.view(self.lanes)
        self.quants = ordered.view(torch.int8).view(n, 256)

    def scales(self, first: int, stop: int) -> list[torch.Tensor]:
        n = stop - first
        d, scaled = self.d[:n], self.scaled[:n]
        d.copy_(self.blocks[first:stop, 208:210].view(torch.float16))
        scaled.copy_(self.blocks[first:stop, 192:208].view(torch.int8)).mul_(d)
        return [scaled.unsqueeze(-1)]

    def __call__(self, start: int, scales, out: torch.Tensor) -> None:
        stop, lanes, repeat = start + self.n, self.lanes, self.repeat
        _split_nibbles(self.ql[start:stop], self.low, self.high, repeat)
        self.qh_copy.copy_(self.qh[start:stop])
        for k, bits in enumerate(self.bits):  # a neighbour's bits shifted in are dropped by the mask below
            torch.bitwise_right_shift(self.qh_lanes, _int(2 * k, lanes), out=bits)
        self.all_bits.bitwise_and_(_int(0x03 * repeat, lanes)).bitwise_left_shift_(_int(4, lanes))  # no carry out
        for pieces, to in self.moves:
            torch.cat(pieces, dim=2, out=to)
        self.ordered.bitwise_or_(self.ordered_bits)
        self.ordered.view(torch.uint8).sub_(_int(32, torch.uint8))  # wraps in uint8: read as int8 it is q - 32
        self.f.copy_(self.quants)
        torch.mul(self.f.view(self.n, 16, 16), scales[0], out=out.view(self.n, 16, 16))


KERNELS = {6: Q5_0, 8: Q8_0, 12: Q4_K, 14: Q6_K}
