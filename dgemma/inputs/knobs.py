"""The sampler's knobs: one table of names, defaults, ranges and tooltips, and their validation.

The nodes build their widgets from `KNOBS`, so the engine and the canvas agree on every range.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from ..errors import InputError, short

SEED_MAX = 2**64 - 1


@dataclass(frozen=True)
class KnobSpec:
    kind: type
    default: object
    lo: float | None = None
    hi: float | None = None
    step: float | None = None
    tooltip: str = ""


KNOBS: dict[str, KnobSpec] = {
    "seed": KnobSpec(
        int, 0, 0, SEED_MAX, 1,
        "Seed of the one random generator behind the noise canvas, sampling and renoise (an integer)."),
    "num_inference_steps": KnobSpec(
        int, 48, 1, 1024, 1,
        "Most denoising steps per block (a count); the schedule position is t = (N - step) / N."),
    "t_min": KnobSpec(
        float, 0.4, 0.0, 1.0, 0.01,
        "Temperature the anneal cools toward (dimensionless softmax divisor); the last step uses "
        "t_min + (t_max - t_min) / N."),
    "t_max": KnobSpec(
        float, 0.8, 0.0, 1.0, 0.01,
        "Temperature of the first step (dimensionless softmax divisor), where t = 1."),
    "entropy_bound": KnobSpec(
        float, 0.1, 0.0, 1.0, 0.001,
        "Joint entropy budget per step in nats: the lowest-entropy positions are committed while their summed "
        "entropy fits."),
    "confidence": KnobSpec(
        float, 0.005, 0.0, 1.0, 0.001,
        "Adaptive stop in nats: a block ends once its argmax is stable and the mean entropy of the scaled logits "
        "is below this; 0 never stops early."),
    "gen_length": KnobSpec(
        int, 256, 1, 8192, 1,
        "Tokens to generate; run as ceil(gen_length / canvas_length) blocks (256 tokens each on the real model)."),
    "thinking": KnobSpec(
        bool, False,
        tooltip="Render the chat template with the model's native thinking switch (enable_thinking=True); the "
                "thought goes to canvas_state, not text."),
}


def _default(name: str):
    return KNOBS[name].default


def check_knob(name: str, value, table: dict | None = None) -> None:
    """Refuse a value of the wrong type or outside the table's range, naming the knob."""
    spec = (KNOBS if table is None else table)[name]
    if spec.kind is bool:
        if not isinstance(value, bool):
            raise InputError(name, f"{name} must be true or false, got {short(value)}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            spec.kind is int and not isinstance(value, int)):
        raise InputError(name, f"{name} must be a{'n' if spec.kind is int else ''} {spec.kind.__name__}, "
                               f"got {short(value)}; set a number such as the default {spec.default}")
    if not spec.lo <= value <= spec.hi:  # also refuses NaN
        raise InputError(name, f"{name} must be between {spec.lo} and {spec.hi}, got {value!r}; "
                               f"set it inside that range (default {spec.default})")


@dataclass(frozen=True)
class Knobs:
    """The sampler's knobs, validated on construction; defaults and ranges come from `KNOBS`."""

    seed: int = _default("seed")
    num_inference_steps: int = _default("num_inference_steps")
    t_min: float = _default("t_min")
    t_max: float = _default("t_max")
    entropy_bound: float = _default("entropy_bound")
    confidence: float = _default("confidence")
    gen_length: int = _default("gen_length")
    thinking: bool = _default("thinking")

    def __post_init__(self):
        for name in KNOBS:
            check_knob(name, getattr(self, name))
        if self.t_min > self.t_max:
            raise InputError("t_min", f"t_min must not exceed t_max, got t_min={self.t_min!r} > "
                                      f"t_max={self.t_max!r}; swap them (t_max is the hot first step)")
        if self.t_max == 0:
            raise InputError("t_max", "t_max must be above 0, got 0.0; a zero temperature divides the logits "
                                      "by zero")
        if self.entropy_bound == 0:
            raise InputError("entropy_bound", "entropy_bound must be above 0, got 0.0; at 0 a step accepts only its "
                                              "one surest position, so the canvas is mostly noise when the steps run "
                                              "out; set it to 0.001 or more (default 0.1)")

    def asdict(self) -> dict:
        return asdict(self)

    def position(self, step: int) -> float:
        return schedule_position(self.num_inference_steps, step)

    def temperature(self, step: int) -> float:
        """The entropy_bound schedule's temperature at `step` (0-based) of a block, as these knobs set it: the
        clock of a Recorder given no scheduler; a run's steps read theirs from its built scheduler."""
        return anneal(self.t_min, self.t_max, self.position(step))


def schedule_position(steps: int, step: int) -> float:
    """Schedule position t = (N - step) / N of `step` (0-based) of N: 1 at the first step, 1/N at the last."""
    return (steps - step) / steps


def anneal(t_min: float, t_max: float, t: float) -> float:
    """The entropy-bound temperature at schedule position t: t_max at t = 1, cooling toward t_min (the one formula,
    diffusers' EntropyBoundScheduler's; a test holds them equal)."""
    return t_min + (t_max - t_min) * t


def num_blocks(gen_length: int, canvas_length: int) -> int:
    """Blocks a run of `gen_length` tokens takes on a canvas of `canvas_length` positions: the one count."""
    return math.ceil(gen_length / canvas_length)


def canvas_positions(gen_length: int, canvas_length: int) -> int:
    """Positions a run of `gen_length` tokens writes: its blocks' whole canvases."""
    return num_blocks(gen_length, canvas_length) * canvas_length


def knobs_from(values: dict, every: bool = False) -> Knobs:
    """Knobs from named values, unknown names refused; missing ones take their defaults unless `every`.

    A node passes `every`: its knobs are required inputs, and a default seed would be a silent choice.
    """
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise InputError(unknown[0], f"{short(unknown[0])[1:-1]} is not a knob (got {short(values[unknown[0]])}); "
                                     f"the knobs are {', '.join(KNOBS)}")
    missing = [name for name in KNOBS if name not in values]
    if every and missing:
        raise InputError(missing[0], f"{missing[0]} is missing ({', '.join(missing)} not given); a node needs every "
                                     f"knob, so give it, e.g. {missing[0]}={KNOBS[missing[0]].default!r}")
    return Knobs(**values)


if tuple(KNOBS) != tuple(f.name for f in fields(Knobs)):
    raise RuntimeError("KNOBS and Knobs must list the same knobs in the same order")
