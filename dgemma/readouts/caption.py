"""One step's caption: the facts every surface shows (frames, the node's progress text, MCP progress,
the console), and their one text form.

After a run a block's step count is the steps it ran (from the trace); during a run the totals are
the plan's and only upper bounds (a block may stop early), marked with ≤. A reading the engine did
not send (readings.py) is None here and "?" in the text; `canvas` names what a remote frame shows
when it is not the working canvas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..readings import known


@dataclass(frozen=True)
class Caption:
    block: int                # 0-based
    blocks: int | None
    step: int | None          # 0-based, within the block
    steps: int | None         # that block's steps
    temperature: float | None  # T of the step, as the run's scheduler set it
    committed: float | None   # fraction of the canvas committed after the step
    final: bool = True        # False: blocks and steps are upper bounds of a run still going
    canvas: str = ""          # what the frame shows, when not the working canvas

    @classmethod
    def live(cls, frame, blocks: int | None, steps: int | None, readings=None) -> Caption:
        """A step while the run goes; where the plan does not know the steps, the total the frame carries
        (a remote engine's), else unknown: never a local default."""
        steps = steps if steps is not None else getattr(frame, "total", None)
        of = _Of(readings)
        return cls(frame.block, blocks, of.known("steps", frame.step), steps, of.known("T", frame.temperature),
                   of.known("committed", frame.committed_fraction), False, readings.canvas if readings else "")

    def text(self) -> str:
        bound = "" if self.final else "≤"
        step = "?" if self.step is None else f"{self.step + 1}/{bound}{_num(self.steps, 'd')}"
        committed = "?" if self.committed is None else f"{100 * self.committed:.1f}%"
        text = (f"block {self.block + 1}/{bound}{_num(self.blocks, 'd')}  step {step}  "
                f"T {_num(self.temperature, '.3f')}  committed {committed}")
        return f"{text}  {self.canvas}" if self.canvas else text


class _Of:
    """`known` for a bare Readings (a live run's, before it has a trace)."""

    def __init__(self, readings):
        self.readings = readings

    def known(self, name, value):
        return known(self, name, value)


def _num(value, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def trace_captions(trace) -> list[Caption]:
    """The caption of every step of a finished run, each step counted against its block's own steps."""
    per_block = trace.steps_per_block
    committed = trace.committed.mean(axis=1) if len(trace) else np.zeros(0)
    canvas = trace.readings.canvas if trace.readings is not None else ""
    return [Caption(int(b), trace.num_blocks, known(trace, "steps", int(s)), known(trace, "steps", per_block[int(b)]),
                    known(trace, "T", trace.t_and_temperature(i)[1]), known(trace, "committed", float(c)), True, canvas)
            for i, (b, s, c) in enumerate(zip(trace.blocks, trace.steps, committed))]
