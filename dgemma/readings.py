"""What a run's record knows: every reading is exact unless the engine that ran it says otherwise.

A local run, and this pack's server, know every reading: their trace, state and config carry
`readings=None` and nothing changes. A remote engine whose stream carries less gives all three one
`Readings`: each reading the stream does not carry is named with why (`unknown`), the knobs that
never reached the engine are named with who fixes them instead, and the engine's own numbers
(timings, step budget, canvas) are kept apart as the engine's. Every surface asks `why_unknown`
before showing a value and shows "?" / "unknown" instead (null and the reason in a run log).
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What a surface may ask about. ids: token ids; committed: the committed mask; stop: the positions
# the adaptive stop committed; stopped_early: which blocks it ended; steps: steps run per block.
READINGS = ("text", "ids", "committed", "entropy", "t", "T", "stop", "stopped_early", "converged", "steps",
            "canvas_length", "answer_tokens")


@dataclass(frozen=True)
class Readings:
    """One run's honesty record beyond the values: what is unknown and why, and what the engine sent."""

    engine: str                                         # who ran it, e.g. "diffusion_frame engine at http://..."
    unknown: dict = field(default_factory=dict)         # reading -> why the stream does not carry it
    canvas: str = ""                                    # what a frame shows, when not the working canvas
    knobs_sent: dict = field(default_factory=dict)      # knob -> how it went on the wire
    knobs_not_sent: dict = field(default_factory=dict)  # knob -> why it is not the run's setting
    reported: dict = field(default_factory=dict)        # the engine's own numbers (timings, usage, budget)
    warnings: tuple = ()

    def __post_init__(self):
        stray = sorted(set(self.unknown) - set(READINGS))
        if stray:
            raise ValueError(f"unknown readings {stray}; the readings are {', '.join(READINGS)}")

    def asdict(self) -> dict:
        return {"engine": self.engine, "unknown": dict(self.unknown), "canvas": self.canvas,
                "knobs_sent": dict(self.knobs_sent), "knobs_not_sent": dict(self.knobs_not_sent),
                "reported": dict(self.reported), "warnings": list(self.warnings)}

    @classmethod
    def of(cls, data: dict | None):
        """From `asdict` (a run log header); None stays None."""
        if not data:
            return None
        return cls(str(data.get("engine", "")), dict(data.get("unknown") or {}), str(data.get("canvas", "")),
                   dict(data.get("knobs_sent") or {}), dict(data.get("knobs_not_sent") or {}),
                   dict(data.get("reported") or {}), tuple(data.get("warnings") or ()))

    def lines(self) -> list[str]:
        """The record in words, for a payload's text preview."""
        out = [f"engine: {self.engine}" + (f"; frames show {self.canvas}" if self.canvas else "")]
        if self.knobs_sent or self.knobs_not_sent:
            out.append(f"knobs sent: {', '.join(self.knobs_sent) or 'none'}; not the run's setting (the engine's "
                       f"own): {', '.join(self.knobs_not_sent) or 'none'}")
        if self.unknown:
            out.append("unknown: " + "; ".join(f"{name} ({why})" for name, why in self.unknown.items()))
        return out


def why_unknown(payload, name: str) -> str | None:
    """Why `payload` (a trace, state or config) does not know reading `name`; None: it knows it."""
    readings = getattr(payload, "readings", None)
    return None if readings is None else readings.unknown.get(name)


def known(payload, name: str, value):
    """`value`, or None when `payload` does not know reading `name`."""
    return None if why_unknown(payload, name) else value


def knob_not_sent(payload, name: str) -> str | None:
    """Why knob `name` is not the run's setting (it never reached the engine); None: it is."""
    readings = getattr(payload, "readings", None)
    return None if readings is None else readings.knobs_not_sent.get(name)


def percent(p: float) -> str:
    """A probability as a person reads it: one decimal, and the ends said as bounds rather than a rounded
    0 or 100 (a 1e-15 is "<0.1 %", never "0.0 %" or "1e-15"); JSON keeps the full float."""
    p = float(p)
    if p <= 0.0:
        return "0 %"
    if p >= 1.0:
        return "100 %"
    if p < 0.0005:
        return "<0.1 %"
    if p > 0.9995:
        return ">99.9 %"
    return f"{100 * p:.1f} %"
