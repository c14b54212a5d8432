"""Per-step capture: one compact frame per executed step, kept on the CPU.

A step keeps its canvas ids (int32), what is committed after it (packed bits: the scheduler's
committed mask, plus the positions the adaptive stop committed, also kept apart) and the entropy
of the distribution the scheduler committed from (float16): about 7 bytes per canvas position,
nothing that scales with the vocabulary.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..inputs.knobs import Knobs
from ..payloads import lora_text
from ..readings import why_unknown
from ..steps import schedulers
from .states import UNKNOWN, position_states


@dataclass(frozen=True)
class Frame:
    """One executed step: where it sits in the run and what the canvas looked like after it."""

    block: int
    step: int
    t: float
    temperature: float
    ids: np.ndarray
    committed: np.ndarray   # committed after this step (the scheduler's, the stop's and the pins')
    entropy: np.ndarray
    stop: np.ndarray        # committed by the adaptive stop, not by the scheduler
    pinned: np.ndarray | None = None  # held by a pin (also counted in `committed`)
    constrained: np.ndarray | None = None  # changed by the constraint from the step's own token
    total: int | None = None  # the block's step budget as a remote engine's frame says it (None: the plan's)

    @functools.cached_property
    def committed_fraction(self) -> float:  # read by the step event and the progress text
        return np.count_nonzero(self.committed) / self.committed.size  # the mean, to the bit, without its overhead


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
    committed_bits: np.ndarray  # (S, ceil(L/8)) uint8, np.packbits of the committed mask
    entropy: np.ndarray      # (S, L) float16, nats, of logits / T
    scheduler_name: str = field(default_factory=lambda: schedulers.default().diffusers_name)
    context: dict | None = None  # provenance summary of an injected KV cache
    block_stopped_early: tuple = field(default=())
    stop_bits: np.ndarray | None = None  # (S, ceil(L/8)) packed: committed by the adaptive stop
    run_id: str = field(default="", compare=False)
    token_strings: object = field(default=(), repr=False, compare=False)  # id -> display text (shared)
    pinned_bits: np.ndarray | None = None  # (S, ceil(L/8)) packed: held by a pin; None when nothing was pinned
    times: np.ndarray | None = None        # (S, 2) float32: schedule position t and temperature T of each step
    knob_sets: tuple = ()                  # the knobs in force, one dict per window of the run
    knob_index: np.ndarray | None = None   # (S,) uint8 index into knob_sets of each step
    scheduler_settings: dict | None = None  # the scheduler's own config, when not the knobs' entropy bound
    constrained_bits: np.ndarray | None = None  # (S, ceil(L/8)) packed: changed by the constraint; None: no constraint
    readings: object = None  # readings.Readings: what a remote engine did not send; None: every reading is exact
    adapters: tuple = ()  # (name, strength) of each LoRA the model ran with; () for a plain or remote model

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def __str__(self) -> str:
        """What a text preview shows: the size of the record and how the last step ended."""
        if not len(self):
            return "canvas trace: no steps"
        per_block = "?" if why_unknown(self, "steps") else self.steps_per_block
        committed = "?" if why_unknown(self, "committed") else f"{float(self.committed[-1].mean()):.0%}"
        entropy = ("unknown" if why_unknown(self, "entropy") else
                   f"{float(self.entropy[-1].astype(np.float32).mean()):.3f} nats")
        extra = [] if self.readings is None else self.readings.lines()
        unit = "word pieces" if why_unknown(self, "ids") else "positions"  # a text-only engine's frames
        return "\n".join([f"canvas trace: {len(self)} steps in {self.num_blocks} block(s) {per_block} of "
                           f"{self.canvas_length} {unit} · {self.scheduler_name}", *self.model_lines(),
                           f"last step: {committed} committed, mean entropy {entropy}", self.stop_readout(), *extra,
                           "wire it to Trace Heatmap (DGemmaTrace), or to the Run Log Writer"])

    def model_lines(self) -> list[str]:
        """The adapters the run's model had, as one line ('model + LoRA name @ 1'); none for a plain model."""
        return [f"model{lora_text(self.adapters)}"] if self.adapters else []

    def stop_readout(self) -> str:
        """How many blocks the adaptive stop ended, and, when none, the scheduler's own word on why."""
        why = why_unknown(self, "stopped_early")
        if why:
            return f"adaptive stop: unknown ({why})"
        stopped = sum(self.block_stopped_early)
        line = f"adaptive stop: {stopped} of {len(self.block_stopped_early)} block(s) ended early"
        if self.readings is not None:  # a remote engine's own step counts
            return f"{line} (the engine's step counts)"
        rule = next((c.stop_rule for c in schedulers.REGISTRY.values() if c.diffusers_name == self.scheduler_name),
                    "")
        return f"{line} ({rule})" if not stopped and rule else line

    @property
    def steps_per_block(self) -> list[int]:
        """Steps each block ran (a block may stop early or end the run)."""
        return np.bincount(self.blocks.astype(np.int64), minlength=self.num_blocks).tolist()

    @property
    def num_blocks(self) -> int:
        return int(self.blocks[-1]) + 1 if len(self) else 0

    @property
    def scheduler_config(self) -> dict:
        """The scheduler's config as its run recorded it; else (a plain run) the default scheduler's, from the knobs."""
        if self.scheduler_settings is not None:
            return dict(self.scheduler_settings)
        return schedulers.default().knob_config(self.knobs)

    def _unpack(self, bits, row: int | None = None) -> np.ndarray:
        if bits is None:
            return np.zeros((len(self), self.canvas_length) if row is None else self.canvas_length, bool)
        return np.unpackbits(bits if row is None else bits[row], axis=-1, count=self.canvas_length).astype(bool)

    @property
    def committed(self) -> np.ndarray:
        """(S, L) bool: committed after each step (the scheduler's mask or the adaptive stop)."""
        return self._unpack(self.committed_bits)

    @property
    def stop(self) -> np.ndarray:
        """(S, L) bool: positions the adaptive stop committed that the scheduler had not."""
        return self._unpack(self.stop_bits)

    @property
    def pinned(self) -> np.ndarray | None:
        """(S, L) bool: positions held by a pin, or None when the run pinned nothing."""
        return None if self.pinned_bits is None else self._unpack(self.pinned_bits)

    @property
    def constrained(self) -> np.ndarray | None:
        """(S, L) bool: positions the constraint changed, or None when the run had no constraint."""
        return None if self.constrained_bits is None else self._unpack(self.constrained_bits)

    def states(self) -> np.ndarray:
        """(S, L) position states by the one rule of `states.position_states`; all unknown when the
        engine sent no committed mask."""
        if why_unknown(self, "committed"):
            return np.full(self.ids.shape, UNKNOWN, np.uint8)
        return position_states(self.ids, self.committed, self.blocks, self.pinned, self.constrained)

    def t_and_temperature(self, i: int) -> tuple[float, float]:
        if self.times is not None:
            return float(self.times[i, 0]), float(self.times[i, 1])
        step = int(self.steps[i])
        return self.knobs.position(step), self.knobs.temperature(step)

    def frame(self, i: int) -> Frame:
        pinned = None if self.pinned_bits is None else self._unpack(self.pinned_bits, i)
        constrained = None if self.constrained_bits is None else self._unpack(self.constrained_bits, i)
        return Frame(int(self.blocks[i]), int(self.steps[i]), *self.t_and_temperature(i),
                     self.ids[i], self._unpack(self.committed_bits, i), self.entropy[i],
                     self._unpack(self.stop_bits, i), pinned, constrained)

    def frames(self):
        return (self.frame(i) for i in range(len(self)))

    @property
    def nbytes(self) -> int:
        arrays = (self.blocks, self.steps, self.ids, self.committed_bits, self.entropy, self.stop_bits,
                  self.pinned_bits, self.times, self.knob_index, self.constrained_bits)
        return sum(a.nbytes for a in arrays if a is not None)


def _unpack_row(bits, canvas_length: int) -> np.ndarray:
    return np.unpackbits(bits, count=canvas_length).astype(bool)


@dataclass(frozen=True, eq=False)
class Row:
    """One recorded step, compact: what `CanvasTrace` stacks into its arrays."""

    block: int
    step: int
    ids: np.ndarray             # (L,) int32
    committed_bits: np.ndarray  # packed: committed after the step
    entropy: np.ndarray         # (L,) float16
    stop_bits: np.ndarray       # packed: committed by the adaptive stop alone
    pinned_bits: np.ndarray | None
    t: float
    temperature: float
    knob_set: int               # index into the run's knob sets
    constrained_bits: np.ndarray | None = None  # packed: changed by the constraint

    def frame(self, canvas_length: int) -> Frame:
        unpack = lambda bits: None if bits is None else _unpack_row(bits, canvas_length)
        return Frame(self.block, self.step, self.t, self.temperature, self.ids,
                     unpack(self.committed_bits), self.entropy, unpack(self.stop_bits),
                     unpack(self.pinned_bits), unpack(self.constrained_bits))


@dataclass(frozen=True, eq=False)
class Recorded:
    """The steps of a run so far, as a resumed run starts from them."""

    rows: tuple[Row, ...] = ()
    stopped_early: tuple[bool, ...] = ()
    knob_sets: tuple[dict, ...] = ()

    def last_frames(self, canvas_length: int, n: int = 2) -> list[Frame]:
        return [r.frame(canvas_length) for r in self.rows[-n:]]

    def finished_blocks(self) -> list[np.ndarray]:
        """The final canvas ids of every block before the one the run stopped in."""
        rows = self.rows
        return [r.ids for r, nxt in zip(rows, rows[1:]) if nxt.block != r.block and r.block < rows[-1].block]


class Recorder:
    """Collects frames during a run and freezes them into a CanvasTrace.

    `clock` gives each step's t and T (the run's scheduler adapter, or the knobs); a resumed run
    starts from the rows of the run it continues; `knob_set` is what is in force from now on (the
    knobs alone unless given).
    """

    def __init__(self, knobs: Knobs, canvas_length: int, token_strings=(), resumed=None, clock=None,
                 knob_set: dict | None = None):
        self.knobs = knobs
        self.canvas_length = canvas_length
        self.token_strings = token_strings
        self.clock = knobs if clock is None else clock
        resumed = resumed if resumed is not None else Recorded()
        self._rows: list[Row] = list(resumed.rows)
        self.stopped_early: list[bool] = list(resumed.stopped_early)
        self.knob_sets: list[dict] = list(resumed.knob_sets)
        if knob_set is not None:
            self.use_knobs(knob_set)
        elif not self.knob_sets:
            self.knob_sets.append(knobs.asdict())

    def __len__(self) -> int:
        return len(self._rows)

    def snapshot(self) -> Recorded:
        """What a resumed run starts from: the rows so far (immutable), block stops, knob sets."""
        return Recorded(tuple(self._rows), tuple(self.stopped_early), tuple(self.knob_sets))

    def use_knobs(self, values: dict) -> None:
        """The knobs in force from the next step on (a new window may change them)."""
        if not self.knob_sets or values != self.knob_sets[-1]:
            self.knob_sets.append(values)

    def add(self, block: int, step: int, canvas, committed, stop, entropy, pinned=None, constrained=None) -> Frame:
        """Capture batch row 0 of one step's tensors (each read on the host on its own); returns the frame.

        `committed` is the scheduler's mask, `stop` what the adaptive stop committed on top of it,
        `pinned` what a pin holds (counted as committed), `constrained` what a constraint changed.
        """
        host = lambda t, dtype: None if t is None else t[0].to("cpu").numpy().astype(dtype)
        return self.add_host(block, step, host(canvas, np.int32), host(committed, bool), host(stop, bool),
                             host(entropy, np.float16), host(pinned, bool), host(constrained, bool))

    def add_host(self, block: int, step: int, ids, committed, stop, entropy, pinned=None, constrained=None) -> Frame:
        """`add` from host arrays of row 0 that the recorder keeps (int32 ids, bool masks, float16 entropy)."""
        done, by_stop = committed | stop, stop & ~committed
        if pinned is not None:
            done, by_stop = done | pinned, by_stop & ~pinned
        t, temperature = self.clock.position(step), self.clock.temperature(step)
        self._rows.append(Row(block, step, ids, np.packbits(done), entropy, np.packbits(by_stop),
                              None if pinned is None else np.packbits(pinned), t, temperature,
                              len(self.knob_sets) - 1, None if constrained is None else np.packbits(constrained)))
        return Frame(block, step, t, temperature, _frozen(ids), _frozen(done), _frozen(entropy), _frozen(by_stop),
                     None if pinned is None else _frozen(pinned), None if constrained is None else _frozen(constrained))

    def end_block(self, stopped_early: bool) -> None:
        self.stopped_early.append(stopped_early)

    def _bits(self, field: str) -> np.ndarray | None:
        """One column of packed masks (pins, constraint), or None when no step has one."""
        if all(getattr(r, field) is None for r in self._rows):
            return None
        blank = np.zeros((self.canvas_length + 7) // 8, np.uint8)
        return _frozen(np.array([blank if getattr(r, field) is None else getattr(r, field) for r in self._rows],
                                np.uint8))

    def finish(self, context: dict | None = None, run_id: str = "", scheduler: tuple = (),
               adapters: tuple = ()) -> CanvasTrace:
        """The frozen trace; `scheduler` is (diffusers name, its config), empty for the default scheduler's
        name and a config read from the knobs; `adapters` the model's LoRAs, (name, strength) each."""
        L = self.canvas_length
        rows, packed = self._rows, (0, (L + 7) // 8)
        col = lambda k, dt, shape: (np.array([getattr(r, k) for r in rows], dtype=dt) if rows else np.zeros(shape, dt))
        times = np.array([(r.t, r.temperature) for r in rows], np.float32).reshape(-1, 2)
        name, settings = scheduler or (schedulers.default().diffusers_name, None)
        return CanvasTrace(
            knobs=self.knobs, canvas_length=L,
            blocks=_frozen(col("block", np.int16, (0,))), steps=_frozen(col("step", np.int16, (0,))),
            ids=_frozen(col("ids", np.int32, (0, L))), committed_bits=_frozen(col("committed_bits", np.uint8, packed)),
            entropy=_frozen(col("entropy", np.float16, (0, L))), scheduler_name=name, context=context,
            block_stopped_early=tuple(self.stopped_early), stop_bits=_frozen(col("stop_bits", np.uint8, packed)),
            run_id=run_id, token_strings=self.token_strings, times=_frozen(times),
            knob_sets=tuple(self.knob_sets), knob_index=_frozen(col("knob_set", np.uint8, (0,))),
            scheduler_settings=settings, pinned_bits=self._bits("pinned_bits"),
            constrained_bits=self._bits("constrained_bits"), adapters=tuple(adapters))
