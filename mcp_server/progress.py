"""Per-step progress for agents: step, an honest total, committed %, and the text so far.

The total is the step budget known so far: the steps done, plus what the current block may still
take, plus a full budget for each block still to come. It drops as soon as a frame shows that its
block ended early (the adaptive stop fired) or that the answer ended (an end-of-turn token in a
finished block), so a client's bar reaches its end with the last step.
"""

from __future__ import annotations

import numpy as np

from ..dgemma.inputs.knobs import num_blocks
from ..dgemma.readouts.caption import Caption

NOISE = "\u00b7"    # a position the scheduler has not committed yet
MAX_CHARS = 4000    # keep a notification small on long runs: the tail of the text


class StepMessages:
    """Turns frames into (total, message); blocks already finished stay in the text."""

    def __init__(self, dm, knobs, steps_per_block: int, start: int = 0, end: int | None = None, first_block: int = 0):
        self.strings = dm.token_strings
        self.eos = np.asarray(dm.eos_ids)
        self.blocks = num_blocks(knobs.gen_length, dm.canvas_length)
        self.steps = steps_per_block
        self.limit = min(end, steps_per_block) if end is not None else steps_per_block
        self.block_start, self.block = start, first_block
        self.done_before = 0       # steps of finished blocks
        self.finished: list[str] = []
        self.last = None
        self.total = self._total()

    def _total(self) -> int:
        if self.limit < self.steps:  # the window pauses the run in this block
            return self.done_before + self.limit - self.block_start
        return self.done_before + self.steps - self.block_start + (self.blocks - 1 - self.block) * self.steps

    def text(self, frame, all_committed: bool = False) -> str:
        return "".join(self.strings[i] if all_committed or ok else NOISE
                       for i, ok in zip(frame.ids.tolist(), frame.committed.tolist()))

    def update(self, frame, done: int) -> tuple[int, str]:
        """(total, message) after `frame`, the `done`-th step of this call."""
        if self.last is not None and frame.block != self.last.block:
            self.finished.append(self.text(self.last, all_committed=True))
            self.done_before, self.block, self.block_start = done - 1, frame.block, 0
        self.last = frame
        self.total = self._total()
        pauses = self.limit < self.steps
        block_ended = frame.step + 1 >= self.limit or bool(frame.stop.any())
        if block_ended and (pauses and frame.step + 1 >= self.limit or frame.block + 1 >= self.blocks
                            or np.isin(frame.ids, self.eos).any()):
            self.total = done
        elif block_ended:
            self.total = done + (self.limit if pauses else (self.blocks - 1 - frame.block) * self.steps)
        text = "".join(self.finished) + self.text(frame)
        if len(text) > MAX_CHARS:
            text = "\u2026" + text[-MAX_CHARS:]
        return self.total, f"{Caption.live(frame, self.blocks, self.steps).text()}: {text}"


class BatchMessages:
    """Progress of several prompts run as one batch: the sum of their totals, and the latest item's text."""

    def __init__(self, items: list[StepMessages]):
        self.items = items
        self.done = [0] * len(items)   # steps of each item so far
        self.totals = [m.total for m in items]

    def update(self, index: int, frame) -> tuple[int, str]:
        self.done[index] += 1
        self.totals[index], text = self.items[index].update(frame, self.done[index])
        return sum(self.totals), f"item {index + 1}/{len(self.items)} · {text}"

    def settle(self, index: int) -> None:
        """The item ended: what it ran is its whole budget (a stop its frames cannot show included)."""
        self.totals[index] = self.done[index]
