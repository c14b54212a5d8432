"""GGUF blocks to floats, in torch, on whichever device the bytes sit.

Each type's layout is ggml's (block size in weights, bytes per block). Every function takes a uint8
tensor of shape (blocks, bytes per block) and returns float32 (blocks, weights per block) with the
same operations, in the same order and precision, as the `gguf` package's numpy reference, so the
values are bit-for-bit its values (float32 multiplications and additions round the same everywhere;
no step fuses them).
"""

from __future__ import annotations

import threading

import torch

from . import gguf_numba
from .gguf_kernels import KERNELS, k_scales

CPU_CHUNK = 1 << 20  # weights per kernel chunk on the CPU: 8 MiB of scratch at most (see _by_blocks)
SCALE_BATCH = 1 << 22  # weights whose scales are made at once (in buffers of 2 MiB at most)
DEVICE_CHUNK = 8 << 20  # on an accelerator, larger chunks (fewer launches): 64 MiB of buffers at most
QK_K = 256  # weights in a K-quant super-block

# ggml type id -> (name, weights per block, bytes per block)
TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 30: ("BF16", 1, 2),
}
BY_NAME = {name: tid for tid, (name, _, _) in TYPES.items()}


_SHIFTS: dict = {}


def _shifts(values, device) -> torch.Tensor:
    """A small constant table on `device`, made once (made from host values, each making would wait)."""
    key = (tuple(values), str(device))
    if key not in _SHIFTS:
        _SHIFTS[key] = torch.tensor(values, dtype=torch.uint8, device=device)
    return _SHIFTS[key]


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """(n, 2) little-endian half floats -> (n, 1) float32."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, groups: int) -> torch.Tensor:
    """Bytes (n, groups * width) -> (n, groups * 2 * width): each group's low nibbles, then its high ones."""
    n = qs.shape[0]
    q = qs.reshape(n, groups, 1, -1) >> _shifts([0, 4], qs.device).reshape(1, 1, 2, 1)
    return (q & 0x0F).reshape(n, -1)


def _bits(qh: torch.Tensor) -> torch.Tensor:
    """(n, b) bytes -> (n, 8b) bits, least significant first (a little-endian bit field)."""
    n = qh.shape[0]
    return ((qh.reshape(n, -1, 1) >> _shifts(range(8), qh.device).reshape(1, 1, 8)) & 1).reshape(n, -1)


def q4_0(b):
    q = (_nibbles(b[:, 2:], 1).to(torch.int8) - 8).float()
    return _f16(b[:, :2]) * q


def q4_1(b):
    return _f16(b[:, :2]) * _nibbles(b[:, 4:], 1).float() + _f16(b[:, 2:4])


def _five_bits(qh, qs):
    return _nibbles(qs, 1) | (_bits(qh) << 4)


def q5_1(b):
    return _f16(b[:, :2]) * _five_bits(b[:, 4:8], b[:, 8:]).float() + _f16(b[:, 2:4])


def _k_scaled(b, q):
    """d * scale * q - dmin * min over the eight 32-weight groups of a super-block."""
    n = b.shape[0]
    sixes = k_scales(b[:, 4:16])
    sc, mn = sixes[:, :8], sixes[:, 8:]
    d = (_f16(b[:, :2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    return (d * q.reshape(n, 8, 32).float() - dm).reshape(n, QK_K)


def q5_k(b):
    n = b.shape[0]
    low = _nibbles(b[:, 48:], 4)
    high = ((b[:, 16:48].reshape(n, 1, 32) >> _shifts(range(8), b.device).reshape(1, 8, 1)) & 1).reshape(n, -1)
    return _k_scaled(b, low | (high << 4))


def f32(b):
    return b.contiguous().view(torch.float32)


def f16(b):
    return b.contiguous().view(torch.float16).float()


def bf16(b):
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


# The types without a fast kernel (gguf_kernels.KERNELS has Q5_0, Q8_0, Q4_K and Q6_K), whole blocks at a time.
BLOCKS = {0: f32, 1: f16, 2: q4_0, 3: q4_1, 7: q5_1, 13: q5_k, 30: bf16}


def type_name(qtype: int) -> str:
    return TYPES[qtype][0] if qtype in TYPES else f"type {qtype}"


def row_bytes(qtype: int, row: int) -> int:
    """Bytes of one row of `row` weights (a whole number of blocks)."""
    _, size, nbytes = TYPES[qtype]
    if row % size:
        raise ValueError(f"a {type_name(qtype)} row of {row} weights is not a whole number of {size}-weight blocks")
    return row // size * nbytes


def dequantize(raw: torch.Tensor, qtype: int, shape: tuple[int, ...], dtype=torch.float32,
               chunk_rows: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """The weights of `raw` (uint8, rows of blocks, any leading shape) as a `shape` tensor of `dtype`,
    written into `out` where given (a contiguous tensor of that shape and dtype, reused by the caller).

    `chunk_rows` > 0 converts that many rows at a time into the result, so the float32 intermediate of
    a large tensor is never whole (the values are the same either way). The types with a fast kernel
    always go by chunks of blocks instead, small enough to stay in the CPU's cache."""
    if qtype not in BLOCKS and qtype not in KERNELS:
        raise ValueError(f"GGUF tensor type {type_name(qtype)} is not supported")
    _, size, nbytes = TYPES[qtype]
    rows = raw.reshape(-1, raw.shape[-1])
    out_row = rows.shape[-1] // nbytes * size
    compiled = _compiled(raw, qtype, dtype)
    whole = qtype not in KERNELS and not compiled and not 0 < chunk_rows < rows.shape[0]
    if whole and out is None:  # a float type in its own dtype is a view of its bytes, no copy
        return _rows(rows, qtype, nbytes, out_row).to(dtype).reshape(shape)
    if out is None:
        out = torch.empty(rows.shape[0], out_row, dtype=dtype, device=raw.device)
    flat = out.view(rows.shape[0], out_row)
    if qtype in KERNELS or compiled:
        _by_blocks(rows.reshape(-1, nbytes), qtype, flat.view(-1, size), compiled)
        return out.view(shape)
    step = rows.shape[0] if whole else chunk_rows
    for start in range(0, rows.shape[0], step):
        part = rows[start:start + step]
        flat[start:start + part.shape[0]] = _rows(part, qtype, nbytes, out_row)
    return out.view(shape)


def _compiled(raw: torch.Tensor, qtype: int, dtype: torch.dtype) -> bool:
    """Whether numba's one-pass kernel makes these blocks dense (on the CPU, into float32 or bfloat16)."""
    return raw.device.type == "cpu" and qtype in gguf_numba.KERNELS and dtype in (torch.float32, torch.bfloat16)


def _by_blocks(blocks: torch.Tensor, qtype: int, out: torch.Tensor, compiled: bool = False) -> None:
    """Blocks (n, bytes) -> `out` (n, weights) through the type's kernel: numba's where `compiled`, else
    torch's a chunk at a time.

    On the CPU each of torch's threads takes its own share of the chunks and runs their ops on itself
    alone: with torch's intra-op threads every op ends at a barrier that waits for a thread the OS has
    descheduled whenever the machine is busy (measured: 10-40 M weights/s on two threads of a loaded
    2-core machine, 300 per thread this way). Each op's call takes the GIL back, which costs tens of
    microseconds when the other threads hold it: chunks are large (CPU_CHUNK) to make few calls."""
    size = TYPES[qtype][1]
    n = blocks.shape[0]
    if blocks.storage_offset() % 4:  # the kernels view bytes as int16, int32 and half floats
        blocks = blocks.clone()
    if blocks.device.type != "cpu":
        _chunks(blocks, out, qtype, DEVICE_CHUNK)
        return
    with _THREADS:  # the thread count is the process's: two callers must not restore each other's
        threads = torch.get_num_threads()
        share = -(-n // max(1, min(threads, n * size // CPU_CHUNK)))
        parts = [(blocks[i:i + share], out[i:i + share]) for i in range(0, n, share)]
        try:
            torch.set_num_threads(1)
            if len(parts) == 1:
                _alone(*parts[0], qtype, compiled)
            else:
                list(_pool(threads).map(lambda p: _alone(p[0], p[1], qtype, compiled), parts))
        finally:
            torch.set_num_threads(threads)


_THREADS = threading.Lock()
_POOLS: dict = {}


def _pool(threads: int):
    from concurrent.futures import ThreadPoolExecutor

    if threads not in _POOLS:
        _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="gguf-dequant")
    return _POOLS[threads]


def _alone(blocks: torch.Tensor, out: torch.Tensor, qtype: int, compiled: bool) -> None:
    torch.set_num_threads(1)  # a thread's own setting: each worker thread runs its ops on itself
    if compiled:
        gguf_numba.run(qtype, blocks, out)
    else:
        _chunks(blocks, out, qtype, CPU_CHUNK)


def _chunks(blocks: torch.Tensor, out: torch.Tensor, qtype: int, chunk: int) -> None:
    """Into `out`, a chunk at a time through the type's kernel and its scratch, reused for every chunk
    (float32 is made in the scratch too, all but the last op, which writes `out`: the other passes stay
    nearer the CPU). The scales are made for a batch of chunks at once."""
    size = TYPES[qtype][1]
    n = blocks.shape[0]
    step = min(max(1, chunk // size), n)
    batch = max(step, SCALE_BATCH // size // step * step)
    f = torch.empty(step, size, device=blocks.device)
    kind = KERNELS[qtype]
    q = torch.empty(kind.scratch * step * size, dtype=torch.uint8, device=blocks.device)
    kernel = kind(blocks, f, q, min(batch, n))
    direct = out.dtype == torch.float32
    for first in range(0, n, batch):
        scales = kernel.scales(first, min(first + batch, n))
        for start in range(first, min(first + batch, n), step):
            stop = min(start + step, n)
            if stop - start < step:  # the last chunk, shorter
                kernel.views(f[:stop - start], q)
            kernel(start, [s[start - first:stop - first] for s in scales], out[start:stop] if direct else kernel.f)
            if not direct:
                out[start:stop].copy_(kernel.f)


def _rows(rows: torch.Tensor, qtype: int, nbytes: int, out_row: int) -> torch.Tensor:
    blocks = rows.reshape(-1, nbytes)
    return BLOCKS[qtype](blocks).reshape(rows.shape[0], out_row)
