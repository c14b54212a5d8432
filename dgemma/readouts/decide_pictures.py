"""A decision as pictures: its bar chart with error bars, and how each option's probability moved over the steps.

Drawn with Pillow and the bundled monospace font (BASIC layout), so a picture is the same on every
machine. Both are ComfyUI IMAGE arrays: float32 (1, H, W, 3) in 0..1.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .fonts import FONT_PATH

WIDTH = 576
BACKGROUND, INK, DIM, GRID = (22, 24, 29), (225, 228, 235), (150, 156, 170), (55, 60, 70)
BAR, CHOSEN = (90, 140, 220), (250, 180, 40)
# One colour per option line, in order (distinct on the dark background); the chosen option's is amber.
LINES = ((90, 160, 255), (110, 210, 120), (235, 90, 90), (190, 130, 240), (70, 210, 210),
         (240, 140, 200), (200, 200, 90), (160, 160, 160), (255, 130, 60))
LEGEND_MAX = 10  # option lines named in the trace's legend (the likeliest); the rest are counted
LABEL_CHARS = 14


def _font(size: int):
    return ImageFont.truetype(str(FONT_PATH), size, layout_engine=ImageFont.Layout.BASIC)


def _label(text: str, width: int = LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _image(picture: Image.Image) -> np.ndarray:
    return (np.asarray(picture.convert("RGB"), np.float32) / np.float32(255.0))[None]


def chart(decision) -> np.ndarray:
    """One bar per option (mean probability over the draws), whiskers at ± one standard error, the chosen
    option in amber and marked; the percentage beside each bar."""
    font, small = _font(12), _font(10)
    options, mean, se = decision.options, decision.mean, decision.standard_error
    row, top, left, right = 20, 44, 12 + 7 * (LABEL_CHARS + 1), WIDTH - 110
    height = top + row * len(options) + 16
    picture = Image.new("RGB", (WIDTH, height), BACKGROUND)
    draw = ImageDraw.Draw(picture)
    n = decision.per_sample.shape[0]
    draw.text((12, 8), f"choice: {_label(decision.choice, 40)}", font=font, fill=CHOSEN)
    draw.text((12, 24), f"mean P over {n} noise draw{'s' if n != 1 else ''}; whiskers ± 1 standard error",
              font=small, fill=DIM)
    scale = lambda p: left + (right - left) * float(np.clip(p, 0.0, 1.0))
    for x in (0.0, 0.25, 0.5, 0.75, 1.0):
        draw.line([(scale(x), top - 4), (scale(x), height - 12)], fill=GRID)
    chosen = decision.options.index(decision.choice)
    for i, (option, m, s) in enumerate(zip(options, mean, se)):
        y = top + i * row
        colour = CHOSEN if i == chosen else BAR
        draw.text((12, y + 3), _label(option), font=font, fill=colour if i == chosen else INK)
        draw.rectangle([left, y + 4, max(scale(m), left + 1), y + row - 4], fill=colour)
        lo, hi, mid = scale(m - s), scale(m + s), y + row // 2
        draw.line([(lo, mid), (hi, mid)], fill=INK)
        draw.line([(lo, mid - 4), (lo, mid + 4)], fill=INK)
        draw.line([(hi, mid - 4), (hi, mid + 4)], fill=INK)
        mark = " ◀ chosen" if i == chosen else ""
        draw.text((right + 8, y + 3), f"{100 * m:5.1f}%{mark}", font=small, fill=colour if mark else DIM)
    return _image(picture)


def trace_lines(decision) -> np.ndarray:
    """Each option's probability at the slot before every step of the answer block's run, one line each."""
    font, small = _font(12), _font(10)
    probabilities = decision.trace if decision.trace is not None else np.zeros((0, len(decision.options)))
    steps = probabilities.shape[0]
    order = np.argsort(-decision.mean, kind="stable")
    named = order[:LEGEND_MAX]
    left, top, right, bottom = 44, 30, WIDTH - 16, 230
    height = bottom + 28 + 16 * ((len(named) + 2) // 3) + (16 if len(order) > LEGEND_MAX else 0)
    picture = Image.new("RGB", (WIDTH, height), BACKGROUND)
    draw = ImageDraw.Draw(picture)
    draw.text((12, 8), f"P(option) at the answer slot before each step ({steps} steps of the answer block)",
              font=small, fill=DIM)
    y_of = lambda p: bottom - (bottom - top) * float(np.clip(p, 0.0, 1.0))
    x_of = lambda s: left + (right - left) * (s / max(steps - 1, 1))
    for p in (0.0, 0.5, 1.0):
        draw.line([(left, y_of(p)), (right, y_of(p))], fill=GRID)
        draw.text((6, y_of(p) - 6), f"{p:.1f}", font=small, fill=DIM)
    draw.text((left, bottom + 4), "step 0", font=small, fill=DIM)
    draw.text((right - 60, bottom + 4), f"step {max(steps - 1, 0)}", font=small, fill=DIM)
    chosen = decision.options.index(decision.choice)
    colour_of = lambda k: CHOSEN if k == chosen else LINES[int(k) % len(LINES)]
    for k in order[::-1]:  # the likeliest drawn last, on top
        colour = colour_of(k)
        points = [(x_of(s), y_of(probabilities[s, k])) for s in range(steps)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=3 if k == chosen else 2)
        for x, y in points[:1] + points[-1:]:
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
    for i, k in enumerate(named):
        x, y = 12 + (i % 3) * 186, bottom + 24 + 16 * (i // 3)
        draw.rectangle([x, y + 4, x + 10, y + 10], fill=colour_of(k))
        mark = " ◀ chosen" if k == chosen else ""
        draw.text((x + 16, y), _label(decision.options[k], 22 - len(mark)) + mark, font=font, fill=INK)
    if len(order) > LEGEND_MAX:
        draw.text((12, height - 18), f"+{len(order) - LEGEND_MAX} less likely options drawn, not named",
                  font=small, fill=DIM)
    return _image(picture)
