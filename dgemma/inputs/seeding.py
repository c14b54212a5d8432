"""One random generator per run, and every seed in 0..2^64-1 its own stream.

Seeds below 2^32 seed torch's generator exactly as diffusers does (`manual_seed`), so runs
match the pipeline. torch's CPU generator (mt19937) keeps only the low 32 bits of a seed, so a
larger seed instead fills the mt19937 state with the reference `init_by_array` of its two 32-bit
halves. CUDA generators (Philox) take all 64 bits already.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK = 0xFFFFFFFF
_N = 624
_STATE_AT = 24  # torch's CPU state: initial seed u64, left i32, seeded i32, next u64, then 624 u64 words


def _init_genrand(seed: int) -> list[int]:
    mt = [seed & _MASK]
    for i in range(1, _N):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & _MASK)
    return mt


def _init_by_array(key: list[int]) -> list[int]:
    """mt19937's reference seeding from an array of 32-bit words."""
    mt = _init_genrand(19650218)
    i, j = 1, 0
    for _ in range(max(_N, len(key))):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525)) + key[j] + j) & _MASK
        i, j = i + 1, (j + 1) % len(key)
        if i >= _N:
            mt[0], i = mt[_N - 1], 1
    for _ in range(_N - 1):
        mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941)) - i) & _MASK
        i += 1
        if i >= _N:
            mt[0], i = mt[_N - 1], 1
    mt[0] = 0x80000000
    return mt


def make_generator(seed: int, device) -> torch.Generator:
    generator = torch.Generator(device=device).manual_seed(seed)
    if seed <= _MASK or generator.device.type != "cpu":
        return generator
    state = generator.get_state().numpy().copy()
    words = np.array(_init_by_array([seed & _MASK, seed >> 32]), dtype="<u8")
    state[_STATE_AT:_STATE_AT + 8 * _N] = words.view(np.uint8)
    generator.set_state(torch.from_numpy(state))
    return generator
