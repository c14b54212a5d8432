"""Per-position log-probabilities, taken when a position is committed: what a client's `logprobs` reads.

A diffusion step proposes every position at once. A position's value is read at the step its final
token was put there, or, when it held that token already, at the step that then committed it: the
model's own log p(token) there (the decoder's logits, before the schedule's temperature) and the
`top` likeliest tokens. Under entropy_bound every step re-samples the accepted positions and renoises
the rest, so that is the start of the token's last unbroken stretch on the canvas; a scheduler that
keeps what it committed gives the step that first committed it. Only runs that ask build a capture:
the loop, its tokens and its trace do not change. Every position's values are computed on the device
(`rows`) and reach the host as bytes inside the step's one copy (`add`): a capture adds no wait.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MAX_TOP = 5
ROWS = 16  # positions per log-softmax: bounds the float copy of a 262,144-wide vocabulary


@dataclass(frozen=True)
class Logprobs:
    """One run's capture, aligned with `state.raw_ids`: (N,) values, (N, top) alternatives."""

    values: np.ndarray      # float32 log p of each position's final token
    top_ids: np.ndarray     # int32, likeliest first
    top_values: np.ndarray  # float32


class _Block:
    def __init__(self, length: int, top: int):
        self.ids = np.full(length, -1, np.int64)
        self.committed = np.zeros(length, bool)
        self.values = np.zeros(length, np.float32)
        self.top_ids = np.zeros((length, top), np.int32)
        self.top_values = np.zeros((length, top), np.float32)


class Capture:
    """Fed once per step by the lane (`add`); `result()` gives the run's `Logprobs`."""

    def __init__(self, top: int):
        self.top = top
        self.blocks: list[_Block] = []

    @torch.no_grad()
    def rows(self, logits, canvas, candidates=None) -> torch.Tensor:
        """(1, n) uint8 on the canvas's device: for every position of `canvas` (1, L), the log p of its token
        under `logits` (1, L, V) (the decoder's, before the schedule's temperature) and the `top` likeliest.
        With `candidates` (L, C) ids, each position's log p of each candidate and the candidates follow: a
        constraint picks the token among them on the host after the step's copy (`settle`)."""
        parts = []
        for lo in range(0, canvas.shape[-1], ROWS):
            picked = logits[0, lo:lo + ROWS].float()
            picked = picked - torch.logsumexp(picked, dim=-1, keepdim=True)
            tokens = canvas[0, lo:lo + ROWS].to(picked.device).unsqueeze(-1)
            row = [picked.gather(-1, tokens)]
            if self.top:
                values, top = picked.topk(min(self.top, picked.shape[-1]), dim=-1)
                row += [values, top.to(torch.int32).view(torch.float32)]
            if candidates is not None:
                some = candidates[lo:lo + ROWS].to(picked.device)
                row += [picked.gather(-1, some), some.to(torch.int32).view(torch.float32)]
            parts.append(torch.cat(row, dim=-1))
        return torch.cat(parts).to(canvas.device).view(torch.uint8).reshape(1, -1)

    def settle(self, rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """`rows` made with candidates, for the canvas `ids` a constraint chose among them: each position's
        log p is its chosen candidate's (the same float the device computed for it)."""
        width = 1 + 2 * self.top
        table = rows.view(np.float32).reshape(len(ids), -1)
        count = (table.shape[1] - width) // 2
        values, candidates = table[:, width:width + count], table[:, width + count:].view(np.int32)
        hit = candidates == ids[:, None]
        if not hit.any(axis=1).all():
            raise RuntimeError("the constraint chose a token outside its candidates; logprobs cannot be read")
        out = np.ascontiguousarray(table[:, :width])
        out[:, 0] = values[np.arange(len(ids)), hit.argmax(axis=1)]
        return out.reshape(-1).view(np.uint8)

    def add(self, block: int, ids: np.ndarray, committed: np.ndarray, rows: np.ndarray) -> None:
        """One step of `block` on the host: the canvas's `ids` (L,), what is committed after it (L,), and
        `rows`, the bytes `rows` made; a position is read where its token or its commitment is new."""
        values = rows.view(np.float32).reshape(len(ids), 1 + 2 * self.top)
        while len(self.blocks) <= block:
            self.blocks.append(_Block(len(ids), self.top))
        kept = self.blocks[block]
        where = np.flatnonzero((ids != kept.ids) | (committed & ~kept.committed))
        kept.values[where] = values[where, 0]
        kept.top_values[where] = values[where, 1:1 + self.top]
        kept.top_ids[where] = values[where, 1 + self.top:].view(np.int32)
        kept.ids, kept.committed = ids.astype(np.int64), np.array(committed, bool)

    def result(self) -> Logprobs:
        if not self.blocks:
            empty = np.zeros((0, self.top))
            return Logprobs(np.zeros(0, np.float32), empty.astype(np.int32), empty.astype(np.float32))
        join = lambda name: np.concatenate([getattr(b, name) for b in self.blocks])
        return Logprobs(join("values"), join("top_ids"), join("top_values"))
