"""Per-step capture: one compact frame per executed step, kept on the CPU.

A step keeps its canvas ids (int32), what is committed after it (packed bits: the scheduler's
accepted mask, plus the positions the adaptive stop committed, also kept apart) and the entropy
of the distribution the scheduler accepted from (float16): about 7 bytes per canvas position,
nothing that scales with the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .knobs import Knobs
from .states import position_states


@dataclass(frozen=True)
class Frame:
    """One executed step: where it sits in the run and what the canvas looked like after it."""

    block: int
    step: int
    t: float
    temperature: float
    ids: np.ndarray
    accepted: np.ndarray    # committed after this step
    entropy: np.ndarray
    stop: np.ndarray        # committed by the adaptive stop, not by the scheduler

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
    accepted_bits: np.ndarray  # (S, ceil(L/8)) uint8, np.packbits of the committed mask
    entropy: np.ndarray      # (S, L) float16, nats, of logits / T
    scheduler_name: str = "EntropyBoundScheduler"
    context: dict | None = None  # provenance summary of an injected KV cache
    block_stopped_early: tuple = field(default=())
    stop_bits: np.ndarray | None = None  # (S, ceil(L/8)) packed: committed by the adaptive stop
    run_id: str = field(default="", compare=False)
    token_strings: object = field(default=(), repr=False, compare=False)  # id -> display text (shared)

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def __str__(self) -> str:
        """What a text preview shows: the size of the record and how the last step ended."""
        if not len(self):
            return "canvas trace: no steps"
        per_block = np.bincount(self.blocks.astype(np.int64)).tolist()
        entropy = float(self.entropy[-1].astype(np.float32).mean())
        return (f"canvas trace: {len(self)} steps in {self.num_blocks} block(s) {per_block} of "
                f"{self.canvas_length} positions · {self.scheduler_name}\n"
                f"last step: {float(self.accepted[-1].mean()):.0%} committed, mean entropy {entropy:.3f} nats\n"
                "wire it to DiffusionGemma Trace for a heatmap, or to the Run Log Writer")

    @property
    def num_blocks(self) -> int:
        return int(self.blocks[-1]) + 1 if len(self) else 0

    @property
    def scheduler_config(self) -> dict:
        k = self.knobs
        return {"entropy_bound": k.entropy_bound, "t_min": k.t_min, "t_max": k.t_max,
                "num_inference_steps": k.num_inference_steps}

    def _unpack(self, bits, row: int | None = None) -> np.ndarray:
        if bits is None:
            return np.zeros((len(self), self.canvas_length) if row is None else self.canvas_length, bool)
        return np.unpackbits(bits if row is None else bits[row], axis=-1, count=self.canvas_length).astype(bool)

    @property
    def accepted(self) -> np.ndarray:
        """(S, L) bool: committed after each step (the scheduler's mask or the adaptive stop)."""
        return self._unpack(self.accepted_bits)

    @property
    def stop(self) -> np.ndarray:
        """(S, L) bool: positions the adaptive stop committed that the scheduler had not accepted."""
        return self._unpack(self.stop_bits)

    @property
    def scheduler_accepted(self) -> np.ndarray:
        """(S, L) bool: the scheduler's own accepted mask."""
        return self.accepted & ~self.stop

    def states(self) -> np.ndarray:
        """(S, L) position states by the one rule of `states.position_states`."""
        return position_states(self.ids, self.accepted, self.blocks)

    def frame(self, i: int) -> Frame:
        step = int(self.steps[i])
        return Frame(int(self.blocks[i]), step, self.knobs.position(step), self.knobs.temperature(step),
                     self.ids[i], self._unpack(self.accepted_bits, i), self.entropy[i],
                     self._unpack(self.stop_bits, i))

    def frames(self):
        return (self.frame(i) for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        arrays = (self.blocks, self.steps, self.ids, self.accepted_bits, self.entropy, self.stop_bits)
        return sum(a.nbytes for a in arrays if a is not None)


class Recorder:
    """Collects frames during a run and freezes them into a CanvasTrace."""

    def __init__(self, knobs: Knobs, canvas_length: int, token_strings=()):
        self.knobs = knobs
        self.canvas_length = canvas_length
        self.token_strings = token_strings
        self._rows: list[tuple] = []
        self.stopped_early: list[bool] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, block: int, step: int, canvas, accepted, stop, entropy) -> Frame:
        """Capture batch row 0 of one step's tensors; returns the frame for live consumers.

        `accepted` is the scheduler's mask, `stop` what the adaptive stop committed on top of it.
        """
        ids = canvas[0].to("cpu", copy=True).numpy().astype(np.int32)
        by_stop = stop[0].to("cpu").numpy().astype(bool)
        scheduler = accepted[0].to("cpu").numpy().astype(bool)
        acc, by_stop = scheduler | by_stop, by_stop & ~scheduler
        ent = entropy[0].to("cpu").numpy().astype(np.float16)
        self._rows.append((block, step, ids, np.packbits(acc), ent, np.packbits(by_stop)))
        return Frame(block, step, self.knobs.position(step), self.knobs.temperature(step),
                     _frozen(ids), _frozen(acc), _frozen(ent), _frozen(by_stop))

    def end_block(self, stopped_early: bool) -> None:
        self.stopped_early.append(stopped_early)

    def finish(self, context: dict | None = None, run_id: str = "") -> CanvasTrace:
        L = self.canvas_length
        rows, packed = self._rows, (0, (L + 7) // 8)
        col = lambda k, dt, shape: (np.array([r[k] for r in rows], dtype=dt) if rows else np.zeros(shape, dt))
        return CanvasTrace(
            knobs=self.knobs, canvas_length=L,
            blocks=_frozen(col(0, np.int16, (0,))), steps=_frozen(col(1, np.int16, (0,))),
            ids=_frozen(col(2, np.int32, (0, L))), accepted_bits=_frozen(col(3, np.uint8, packed)),
            entropy=_frozen(col(4, np.float16, (0, L))), context=context,
            block_stopped_early=tuple(self.stopped_early), stop_bits=_frozen(col(5, np.uint8, packed)),
            run_id=run_id, token_strings=self.token_strings)
