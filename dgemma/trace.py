"""Per-step capture: one compact frame per executed step, kept on the CPU.

A step keeps its canvas ids (int32), the scheduler's accepted mask (packed bits) and the entropy
of the distribution the scheduler accepted from (float16): about 7 bytes per canvas position,
nothing that scales with the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .knobs import Knobs


@dataclass(frozen=True)
class Frame:
    """One executed step: where it sits in the run and what the canvas looked like after it."""

    block: int
    step: int
    t: float
    temperature: float
    ids: np.ndarray
    accepted: np.ndarray
    entropy: np.ndarray

    @property
    def committed_fraction(self) -> float:
        return float(self.accepted.mean())


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class CanvasTrace:
    """Every executed step of a run, stored as contiguous arrays (steps x canvas)."""

    knobs: Knobs
    canvas_length: int
    blocks: np.ndarray       # (S,) int16 block index per step
    steps: np.ndarray        # (S,) int16 step index within the block
    ids: np.ndarray          # (S, L) int32 canvas after the step
    accepted_bits: np.ndarray  # (S, ceil(L/8)) uint8, np.packbits of the accepted mask
    entropy: np.ndarray      # (S, L) float16, nats, of logits / T
    scheduler_name: str = "EntropyBoundScheduler"
    context: dict | None = None  # provenance summary of an injected KV cache
    block_stopped_early: tuple = field(default=())

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    @property
    def num_blocks(self) -> int:
        return int(self.blocks[-1]) + 1 if len(self) else 0

    @property
    def scheduler_config(self) -> dict:
        k = self.knobs
        return {"entropy_bound": k.entropy_bound, "t_min": k.t_min, "t_max": k.t_max,
                "num_inference_steps": k.num_inference_steps}

    @property
    def accepted(self) -> np.ndarray:
        """(S, L) bool accepted mask."""
        return np.unpackbits(self.accepted_bits, axis=1, count=self.canvas_length).astype(bool)

    def frame(self, i: int) -> Frame:
        step = int(self.steps[i])
        accepted = np.unpackbits(self.accepted_bits[i], count=self.canvas_length).astype(bool)
        return Frame(int(self.blocks[i]), step, self.knobs.position(step), self.knobs.temperature(step),
                     self.ids[i], accepted, self.entropy[i])

    def frames(self):
        return (self.frame(i) for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.blocks, self.steps, self.ids, self.accepted_bits, self.entropy))


class Recorder:
    """Collects frames during a run and freezes them into a CanvasTrace."""

    def __init__(self, knobs: Knobs, canvas_length: int):
        self.knobs = knobs
        self.canvas_length = canvas_length
        self._rows: list[tuple] = []
        self.stopped_early: list[bool] = []

    def add(self, block: int, step: int, canvas, accepted, entropy) -> Frame:
        """Capture batch row 0 of one step's tensors; returns the frame for live consumers."""
        ids = canvas[0].to("cpu", copy=True).numpy().astype(np.int32)
        acc = accepted[0].to("cpu").numpy().astype(bool)
        ent = entropy[0].to("cpu").numpy().astype(np.float16)
        self._rows.append((block, step, ids, np.packbits(acc), ent))
        return Frame(block, step, self.knobs.position(step), self.knobs.temperature(step),
                     _frozen(ids), _frozen(acc), _frozen(ent))

    def finish(self, context: dict | None = None) -> CanvasTrace:
        L = self.canvas_length
        rows = self._rows
        col = lambda k, dt, shape: (np.array([r[k] for r in rows], dtype=dt) if rows else np.zeros(shape, dt))
        return CanvasTrace(
            knobs=self.knobs, canvas_length=L,
            blocks=_frozen(col(0, np.int16, (0,))), steps=_frozen(col(1, np.int16, (0,))),
            ids=_frozen(col(2, np.int32, (0, L))), accepted_bits=_frozen(col(3, np.uint8, (0, (L + 7) // 8))),
            entropy=_frozen(col(4, np.float16, (0, L))), context=context,
            block_stopped_early=tuple(self.stopped_early))
