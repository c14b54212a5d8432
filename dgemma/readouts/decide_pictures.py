"""A decision as pictures: its bar chart with error bars, and how each option's probability moved over the steps.

Drawn with Pillow and the bundled monospace font (BASIC layout), so a picture is the same on every
machine. Both are ComfyUI IMAGE arrays: float32 (1, H, W, 3) in 0..1.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..readings import percent
from .fonts import FONT_PATH

# Sized to be read where the template shows it (a 420 px wide Preview Image): the smallest text is 14 px.
WIDTH = 400
FONT, SMALL = 16, 14
BACKGROUND, INK, DIM, GRID = (22, 24, 29), (225, 228, 235), (150, 156, 170), (55, 60, 70)
# An option that names a colour is drawn in that colour (a "blue" line is blue); the others take, in order,
# a colour no option names, so no line seems to say another option's word.
COLOURS = {"red": (235, 70, 70), "green": (90, 200, 100), "blue": (80, 140, 255), "yellow": (240, 220, 60),
           "cyan": (60, 215, 220), "magenta": (230, 60, 220), "white": (250, 250, 250), "black": (0, 0, 0),
           "orange": (255, 150, 40), "purple": (160, 90, 230), "violet": (160, 90, 230), "pink": (255, 150, 200),
           "grey": (150, 150, 150), "gray": (150, 150, 150), "brown": (160, 100, 50)}
OTHERS = ("blue", "green", "orange", "purple", "cyan", "pink", "yellow", "grey", "red", "brown")
LEGEND_MAX = 10  # option lines named in the trace's legend (the likeliest); the rest are counted
LABEL_CHARS = 12


def colour_word(option: str) -> str | None:
    """The one colour an option names (its only colour word), else None."""
    words = {w.strip(".,;:!?\"'()").lower() for w in option.split()}
    named = {w for w in words if w in COLOURS}
    return named.pop() if len(named) == 1 else None


def option_colours(options) -> list[tuple]:
    """Each option's colour: its own colour word's, else the next colour that no option names."""
    words = [colour_word(o) for o in options]
    free = [name for name in OTHERS if name not in words] or list(OTHERS)
    out, spare = [], 0
    for word in words:
        if word is None:
            word, spare = free[spare % len(free)], spare + 1
        out.append(COLOURS[word])
    return out


def _dark(colour) -> bool:
    return sum(colour) < 150  # black (or near it) on the dark background: drawn with a light edge


def _font(size: int):
    return ImageFont.truetype(str(FONT_PATH), size, layout_engine=ImageFont.Layout.BASIC)


def _label(text: str, width: int = LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _image(picture: Image.Image) -> np.ndarray:
    return (np.asarray(picture.convert("RGB"), np.float32) / np.float32(255.0))[None]


def chart(decision) -> np.ndarray:
    """One bar per option (mean probability over the draws) in its colour, whiskers at ± one standard error,
    the chosen option marked; the percentage beside each bar."""
    font, small = _font(FONT), _font(SMALL)
    options, mean, se = decision.options, decision.mean, decision.standard_error
    colours = option_colours(options)
    row, top, left, right = 26, 52, 12 + int(font.getlength("m" * (LABEL_CHARS + 1))), WIDTH - 104
    height = top + row * len(options) + 12
    picture = Image.new("RGB", (WIDTH, height), BACKGROUND)
    draw = ImageDraw.Draw(picture)
    n = decision.per_sample.shape[0]
    draw.text((12, 6), f"choice: {_label(decision.choice, 30)}", font=font, fill=INK)
    draw.text((12, 28), f"mean P, {n} noise draw{'s' if n != 1 else ''}, ± 1 s.e.", font=small, fill=DIM)
    scale = lambda p: left + (right - left) * float(np.clip(p, 0.0, 1.0))
    for x in (0.0, 0.25, 0.5, 0.75, 1.0):
        draw.line([(scale(x), top - 4), (scale(x), height - 8)], fill=GRID)
    chosen = decision.options.index(decision.choice)
    for i, (option, m, s, colour) in enumerate(zip(options, mean, se, colours)):
        y = top + i * row
        draw.text((12, y + 4), _label(option), font=font, fill=INK)
        draw.rectangle([left, y + 5, max(scale(m), left + 1), y + row - 5], fill=colour,
                       outline=DIM if _dark(colour) else None)
        lo, hi, mid = scale(m - s), scale(m + s), y + row // 2
        draw.line([(lo, mid), (hi, mid)], fill=INK)
        draw.line([(lo, mid - 5), (lo, mid + 5)], fill=INK)
        draw.line([(hi, mid - 5), (hi, mid + 5)], fill=INK)
        mark = " ◀" if i == chosen else ""
        draw.text((right + 6, y + 5), f"{percent(m)}{mark}", font=small, fill=INK if mark else DIM)
    return _image(picture)


def trace_lines(decision) -> np.ndarray:
    """Each option's probability at the slot before every step of the answer block's run, one line each in
    its colour (the chosen one thicker and marked)."""
    font, small = _font(FONT), _font(SMALL)
    probabilities = decision.trace if decision.trace is not None else np.zeros((0, len(decision.options)))
    steps = probabilities.shape[0]
    order = np.argsort(-decision.mean, kind="stable")
    named, colours = order[:LEGEND_MAX], option_colours(decision.options)
    left, top, right, bottom = 40, 30, WIDTH - 12, 200
    height = bottom + 30 + 20 * ((len(named) + 1) // 2) + (20 if len(order) > LEGEND_MAX else 0)
    picture = Image.new("RGB", (WIDTH, height), BACKGROUND)
    draw = ImageDraw.Draw(picture)
    draw.text((12, 6), f"P(option) before each of {steps} steps", font=small, fill=DIM)
    y_of = lambda p: bottom - (bottom - top) * float(np.clip(p, 0.0, 1.0))
    x_of = lambda s: left + (right - left) * (s / max(steps - 1, 1))
    for p in (0.0, 0.5, 1.0):
        draw.line([(left, y_of(p)), (right, y_of(p))], fill=GRID)
        draw.text((4, y_of(p) - 8), f"{p:.1f}", font=small, fill=DIM)
    draw.text((left, bottom + 4), "step 0", font=small, fill=DIM)
    draw.text((right - int(small.getlength(f"step {max(steps - 1, 0)}")), bottom + 4), f"step {max(steps - 1, 0)}",
              font=small, fill=DIM)
    chosen = decision.options.index(decision.choice)
    for k in order[::-1]:  # the likeliest drawn last, on top
        colour, width = colours[k], 4 if k == chosen else 2
        points = [(x_of(s), y_of(probabilities[s, k])) for s in range(steps)]
        if len(points) > 1:
            if _dark(colour):
                draw.line(points, fill=DIM, width=width + 2)
            draw.line(points, fill=colour, width=width)
        for x, y in points[:1] + points[-1:]:
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=colour, outline=DIM if _dark(colour) else None)
    for i, k in enumerate(named):
        x, y = 12 + (i % 2) * (WIDTH // 2), bottom + 28 + 20 * (i // 2)
        draw.rectangle([x, y + 4, x + 12, y + 14], fill=colours[k], outline=DIM if _dark(colours[k]) else None)
        mark = " ◀ chosen" if k == chosen else ""
        draw.text((x + 18, y), _label(decision.options[k], 17 - len(mark)) + mark, font=font, fill=INK)
    if len(order) > LEGEND_MAX:
        draw.text((12, height - 20), f"+{len(order) - LEGEND_MAX} less likely options, not named",
                  font=small, fill=DIM)
    return _image(picture)
