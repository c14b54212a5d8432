"""One step's caption: the facts every surface shows (frames, the node's progress text, MCP progress,
the console), and their one text form.

After a run a block's step count is the steps it ran (from the trace); during a run the totals are
the plan's and only upper bounds (a block may stop early), marked with ≤.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Caption:
    block: int          # 0-based
    blocks: int
    step: int           # 0-based, within the block
    steps: int          # that block's steps
    temperature: float  # T of the step, as the run's scheduler set it
    committed: float    # fraction of the canvas committed after the step
    final: bool = True  # False: blocks and steps are upper bounds of a run still going

    @classmethod
    def live(cls, frame, blocks: int, steps: int) -> Caption:
        return cls(frame.block, blocks, frame.step, steps, frame.temperature, frame.committed_fraction, False)

    def text(self) -> str:
        bound = "" if self.final else "≤"
        return (f"block {self.block + 1}/{bound}{self.blocks}  step {self.step + 1}/{bound}{self.steps}  "
                f"T {self.temperature:.3f}  committed {100 * self.committed:.1f}%")


def trace_captions(trace) -> list[Caption]:
    """The caption of every step of a finished run, each step counted against its block's own steps."""
    per_block = trace.steps_per_block
    committed = trace.committed.mean(axis=1) if len(trace) else np.zeros(0)
    return [Caption(int(b), trace.num_blocks, int(s), per_block[int(b)], trace.t_and_temperature(i)[1], float(c))
            for i, (b, s, c) in enumerate(zip(trace.blocks, trace.steps, committed))]
