"""DGemmaTrace's pictures and summary: positions x steps, from the captured trace itself.

Rows are the executed steps of every block, top to bottom, with one separator row between
blocks; columns are canvas positions. Commit mode reads the scheduler's committed mask; entropy
mode paints the captured entropy on one fixed scale, so heatmaps of different runs compare, or
on the run's own range, which shows the small entropies of a confident (demo) model. A reading the
run's engine did not send (readings.py) is painted in the "unknown" colour and said so.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import require_type, short
from ..readings import knob_not_sent, why_unknown
from .states import ALL_COLOURS, NAMES, PALETTE, UNKNOWN_COLOUR, UNKNOWN_NAME
from .trace import CanvasTrace

MODES = ("commit", "entropy")
SCALES = ("fixed", "this run")
CELL_PX_DEFAULT, CELL_PX_MAX = 6, 32
ENTROPY_CAP = math.log(262_144)  # nats: a uniform distribution over the real vocabulary

SEPARATOR = (230, 40, 160)
PAD = (40, 40, 40)  # cells past the last step in a wrapped heatmap's last band
# Dark blue through teal and green to yellow, sampled evenly along the entropy scale.
RAMP = np.array([(13, 8, 135), (40, 60, 160), (33, 125, 160), (40, 170, 130), (120, 205, 75),
                 (250, 230, 35)], np.float32)
RAMP_NAMES = ("dark blue", "blue", "teal", "sea green", "green", "yellow")


def check_inputs(mode, cell_px, trace=None, scale="fixed") -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {', '.join(SCALES)}, got {short(scale)}; pick one of those")
    if trace is not None:
        require_type("canvas_trace", trace, CanvasTrace, "the trace of a run")
    if mode not in MODES:
        raise ValueError(f"mode must be 'commit' or 'entropy', got {short(mode)}; pick one of those two")
    if isinstance(cell_px, bool) or not isinstance(cell_px, int) or not 1 <= cell_px <= CELL_PX_MAX:
        raise ValueError(f"cell_px must be a whole number of pixels from 1 to {CELL_PX_MAX}, got "
                         f"{short(cell_px)}; use e.g. 6 (each step x position cell becomes cell_px square)")


def entropy_level(entropy: np.ndarray, cap: float = ENTROPY_CAP) -> np.ndarray:
    """0..1 on a scale up to `cap`: log(1 + H) / log(1 + cap), H in nats clipped to the cap.

    The log spreads the low entropies the scheduler decides on (its bound is ~0.1 nats).
    """
    h = np.clip(np.nan_to_num(np.asarray(entropy, np.float32), nan=cap), 0.0, cap)
    return np.log1p(h) / np.float32(math.log1p(cap))


def scale_cap(trace, scale: str) -> float:
    """The top of the colour scale in nats: the real vocabulary's maximum, or this run's highest entropy."""
    if scale == "fixed" or not len(trace):
        return ENTROPY_CAP
    top = float(np.nan_to_num(trace.entropy.astype(np.float32), nan=0.0).max())
    return min(max(top, 1e-3), ENTROPY_CAP)


def anchor_nats(i: int, cap: float = ENTROPY_CAP) -> float:
    """Entropy in nats at RAMP anchor i."""
    return math.expm1(i / (len(RAMP) - 1) * math.log1p(cap))


def ramp(level: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 colours for 0..1 levels, linear between the RAMP anchors."""
    x = level * (len(RAMP) - 1)
    lo = np.clip(np.floor(x).astype(np.int64), 0, len(RAMP) - 2)
    frac = (x - lo)[..., None]
    return np.rint(RAMP[lo] * (1 - frac) + RAMP[lo + 1] * frac).astype(np.uint8)


def _commit_colours(trace) -> np.ndarray:
    palette = np.array([ALL_COLOURS[s] for s in range(len(ALL_COLOURS))], np.uint8)
    return palette[trace.states()]


def _colours(trace, mode: str, scale: str) -> np.ndarray:
    if mode == "commit":
        return _commit_colours(trace)
    if why_unknown(trace, "entropy"):
        return np.full((*trace.ids.shape, 3), UNKNOWN_COLOUR, np.uint8)
    return ramp(entropy_level(trace.entropy, scale_cap(trace, scale)))


def grid(trace, mode: str, scale: str = "fixed") -> np.ndarray:
    """(rows, L, 3) uint8 at one pixel per cell, separator rows included."""
    colours = _colours(trace, mode, scale)
    L = trace.canvas_length
    if not len(trace):
        return np.full((1, L, 3), PALETTE[0], np.uint8)
    starts = np.flatnonzero(np.diff(trace.blocks.astype(np.int64))) + 1
    parts = np.split(colours, starts)
    sep = np.full((1, L, 3), SEPARATOR, np.uint8)
    rows = [parts[0]]
    for part in parts[1:]:
        rows += [sep, part]
    return np.concatenate(rows)


WRAP_AFTER = 4      # a grid more than this many times taller than wide is wrapped into side-by-side bands
WRAP_ASPECT = 1.5   # and then into as few bands as keep it at most this much taller than wide
BAND_GAP = 2        # columns of separator between bands, at one pixel per cell


def band_count(rows: int, width: int) -> int:
    """Bands a grid of `rows` x `width` cells wraps into: 1 unless it is over WRAP_AFTER times taller than wide."""
    if rows <= WRAP_AFTER * width:
        return 1
    bands = 2
    while -(-rows // bands) > WRAP_ASPECT * (bands * width + (bands - 1) * BAND_GAP):
        bands += 1
    return bands


def wrapped(g: np.ndarray) -> np.ndarray:
    """A long run's grid (thousands of steps of a narrow canvas is a sliver in a preview) as bands of rows
    laid side by side, read left to right, each band top to bottom; a short run's grid as it is."""
    rows, width = g.shape[:2]
    bands = band_count(rows, width)
    if bands == 1:
        return g
    tall = -(-rows // bands)
    padded = np.concatenate([g, np.full((bands * tall - rows, width, 3), PAD, np.uint8)])
    gap = np.full((tall, BAND_GAP, 3), SEPARATOR, np.uint8)
    parts = []
    for b in range(bands):
        parts += ([gap] if b else []) + [padded[b * tall:(b + 1) * tall]]
    return np.concatenate(parts, axis=1)


def heatmap(trace, mode: str = MODES[0], cell_px: int = CELL_PX_DEFAULT, scale: str = "fixed") -> np.ndarray:
    """ComfyUI IMAGE layout: float32 (1, H, W, 3) in 0..1, each cell cell_px square; a long run wraps into
    bands side by side (`wrapped`)."""
    check_inputs(mode, cell_px, trace, scale)
    g = wrapped(grid(trace, mode, scale))
    g = np.repeat(np.repeat(g, cell_px, axis=0), cell_px, axis=1)
    return np.divide(g, np.float32(255.0), dtype=np.float32)[None]


def _nats(value: float) -> str:
    return f"{value:.2f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


def _percent_lines(values, per_line: int = 24) -> list[str]:
    cells = [f"{round(100 * v):3d}" for v in values]
    return [" ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]


def summary(trace, mode: str = "commit", scale: str = "fixed") -> str:
    """Readable text: scheduler, blocks and their stops, committed % per step, legend, scale."""
    check_inputs(mode, 1, trace, scale)
    k = trace.knobs
    config = " ".join(f"{name}={value}" for name, value in trace.scheduler_config.items())
    confidence = "" if knob_not_sent(trace, "confidence") else f"; confidence={k.confidence}"
    canvas = f"canvas {trace.canvas_length} positions"
    if why_unknown(trace, "ids"):  # a text-only engine's frames: word pieces of its text, not tokens
        canvas = f"{trace.canvas_length} word pieces of the engine's text per row (not tokens)"
    lines = [f"DGemmaTrace {mode} heatmap: {len(trace)} steps in {trace.num_blocks} block(s), {canvas}",
             *trace.model_lines(), f"scheduler: {trace.scheduler_name} {config}{confidence}"]
    for b in range(trace.num_blocks):
        lines += _block_lines(trace, b)
    lines.append("layout: one row per executed step, top to bottom, all blocks stacked; a magenta row "
                 f"separates blocks; one column per {'word piece' if why_unknown(trace, 'ids') else 'canvas position'}"
                 ", left to right")
    bands = band_count(len(trace) + trace.num_blocks - 1 if len(trace) else 1, trace.canvas_length)
    if bands > 1:
        lines.append(f"wrapped: the rows run in {bands} bands side by side (a magenta gap between them), read "
                     "left to right, each top to bottom, so a long run stays readable")
    lines += _legend(trace, mode, scale)
    if trace.readings is not None:
        lines += trace.readings.lines()
    return "\n".join(lines)


def _block_lines(trace, b: int) -> list[str]:
    """A block's steps, its stop, mean entropy and committed share; what the engine did not send is unknown."""
    rows, stops = np.flatnonzero(trace.blocks == b), tuple(trace.block_stopped_early)
    budget = trace.knobs.num_inference_steps
    if knob_not_sent(trace, "num_inference_steps"):
        budget = (trace.readings.reported.get("steps_per_block") or "?") if trace.readings else "?"
    early = b < len(stops) and stops[b]
    stop = ("early stop unknown" if why_unknown(trace, "stopped_early") else
            "stopped early (adaptive stop)" if early else "no early stop")
    steps = "? steps" if why_unknown(trace, "steps") else f"{len(rows)} of {budget} steps"
    entropy = ("entropy unknown" if why_unknown(trace, "entropy") else
               f"mean entropy {float(trace.entropy[rows].astype(np.float32).mean()):.3f} nats")
    if why_unknown(trace, "committed"):
        return [f"block {b + 1}: {steps}, {stop}, {entropy}, committed unknown"]
    committed = trace.committed
    return [f"block {b + 1}: {steps}, {stop}, {entropy}, last step committed {100 * committed[rows[-1]].mean():.1f}%",
            "  committed % per step (block-local, committed at that step):",
            *("    " + line for line in _percent_lines(committed[rows].mean(axis=1)))]


def _legend(trace, mode: str, scale: str) -> list[str]:
    unknown = why_unknown(trace, "committed" if mode == "commit" else "entropy")
    if unknown:
        return [f"colours: {UNKNOWN_NAME} (rose) = the engine did not send it: {unknown}"]
    if mode == "commit":
        lines = [f"colours: {NAMES[2]} (white) = committed at this step and the one before with the same "
                 f"token; {NAMES[1]} (amber) = newly committed or changed at this step; {NAMES[0]} (grey) = "
                 "not committed (renoised to a random token); the adaptive stop commits every position "
                 "of a block's last step"]
        if trace.pinned_bits is not None:
            lines.append(f"{NAMES[3]} (blue) = held in place by a pin (it never changes)")
        if trace.constrained_bits is not None:
            lines.append(f"{NAMES[4]} (violet) = the constraint changed the token the step put there")
        return lines
    cap = scale_cap(trace, scale)
    anchors = ", ".join(f"{name} {_nats(anchor_nats(i, cap))}" for i, name in enumerate(RAMP_NAMES))
    which = ("a fixed scale, the same for every run" if scale == "fixed" else
             "this run's own range (its highest entropy at the top), so runs do not compare")
    return [f"colours: entropy of the distribution the scheduler committed from (logits / T) on "
            f"{which}: 0..{_nats(cap)} nats{' (ln 262144)' if scale == 'fixed' else ''}, clipped above, "
            f"log-spaced as level = ln(1+H) / ln(1+{_nats(cap)}); colour at H nats: {anchors}"]
