"""Per-position log-probabilities, taken when a position is committed: what a client's `logprobs` reads.

A diffusion step proposes every position at once. A position's value is read at the step its final
token was put there, or, when it held that token already, at the step that then committed it: the
model's own log p(token) there (the decoder's logits, before the schedule's temperature) and the
`top` likeliest tokens. Under entropy_bound every step re-samples the accepted positions and renoises
the rest, so that is the start of the token's last unbroken stretch on the canvas; a scheduler that
keeps what it committed gives the step that first committed it. Only runs that ask build a capture:
the loop, its tokens and its trace do not change.
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
    def add(self, block: int, logits, canvas, committed: np.ndarray) -> None:
        """One step of `block`: `logits` (1, L, V) the decoder gave, `canvas` (1, L) after the step,
        `committed` (L,) what is committed after it."""
        ids = canvas[0].to("cpu").numpy().astype(np.int64)
        while len(self.blocks) <= block:
            self.blocks.append(_Block(len(ids), self.top))
        kept = self.blocks[block]
        where = np.flatnonzero((ids != kept.ids) | (committed & ~kept.committed))
        for lo in range(0, len(where), ROWS):
            rows = torch.as_tensor(where[lo:lo + ROWS], device=logits.device)
            picked = logits[0, rows].float()
            picked = picked - torch.logsumexp(picked, dim=-1, keepdim=True)
            tokens = canvas[0, rows].to(logits.device).unsqueeze(-1)
            at = where[lo:lo + ROWS]
            kept.values[at] = picked.gather(-1, tokens).squeeze(-1).cpu().numpy()
            if self.top:
                values, top = picked.topk(min(self.top, picked.shape[-1]), dim=-1)
                kept.top_values[at], kept.top_ids[at] = values.cpu().numpy(), top.cpu().numpy()
        kept.ids, kept.committed = ids, np.array(committed, bool)

    def result(self) -> Logprobs:
        if not self.blocks:
            empty = np.zeros((0, self.top))
            return Logprobs(np.zeros(0, np.float32), empty.astype(np.int32), empty.astype(np.float32))
        join = lambda name: np.concatenate([getattr(b, name) for b in self.blocks])
        return Logprobs(join("values"), join("top_ids"), join("top_values"))
