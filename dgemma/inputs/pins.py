"""Pins and infilling: text held in place on the canvas, typed as a template or as `position: text` lines.

A template pins its text at the start of the generated answer and leaves each blank free: a run of
three or more underscores is a blank as wide as the run, or `___{n}` is a blank of n positions.
A line `12: text` pins `text` from answer position 12 (0 is the first generated token, across
blocks). `\\n` in pinned text is a newline. Each piece is tokenized alone, as literal text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import InputError, short
from .tokens import check_text, literal_ids

BLANK = re.compile(r"_{3,}(?:\{(\d+)\})?")
PAIR = re.compile(r"^\s*(\d+)\s*:\s?(.*)$")
ESCAPE = re.compile(r"\\([\\n])")
MAX_PINS_TEXT = 20_000
MAX_REACH = 1_000_000  # answer positions: far past the longest answer (gen_length 8192), short of any overflow


def _unescape(text: str) -> str:
    """`\\n` is a newline and `\\\\` a backslash; every other character, NUL included, stays itself."""
    return ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else "\\", text)


def pieces(text: str) -> tuple[list[tuple[int, str]], str]:
    """The `position: text` pairs and the template (every other line), before tokenizing."""
    pairs, template = [], []
    for line in text.split("\n"):
        m = PAIR.match(line)
        if m:
            pairs.append((int(m.group(1)), _unescape(m.group(2))))
        elif line.strip() or template:
            template.append(line)
    return pairs, "\n".join(template).rstrip("\n")


@dataclass(frozen=True, eq=False)
class Pins:
    """Pinned ids by answer position; `for_block` gives a block's mask and ids on the run's device."""

    positions: np.ndarray  # (P,) int64 answer positions
    ids: np.ndarray        # (P,) int64 token ids
    source: str = ""
    blanks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # a template's blank positions

    def __len__(self) -> int:
        return int(self.positions.size)

    def for_block(self, block: int, canvas_length: int, device):
        """(mask (1, L) bool, ids (1, L) long) of the pins in `block`, or None when it has none."""
        lo = block * canvas_length
        sel = (self.positions >= lo) & (self.positions < lo + canvas_length)
        if not sel.any():
            return None
        mask = torch.zeros((1, canvas_length), dtype=torch.bool, device=device)
        ids = torch.zeros((1, canvas_length), dtype=torch.long, device=device)
        where = torch.as_tensor(self.positions[sel] - lo, device=device)
        mask[0, where] = True
        ids[0, where] = torch.as_tensor(self.ids[sel], device=device)
        return mask, ids

    def summary(self) -> dict:
        return {"text": self.source, "positions": self.positions.tolist(), "ids": self.ids.tolist()}


def _template(tokenizer, template: str, limit: int) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """(pinned spans, blank positions before `limit`) of a template."""
    out, blanks, pos, at = [], [], 0, 0
    for m in BLANK.finditer(template):
        ids = literal_ids(tokenizer, _unescape(template[at:m.start()])) if m.start() > at else []
        out.append((pos, ids))
        width = int(m.group(1)) if m.group(1) else len(m.group(0))
        blanks += range(pos + len(ids), min(pos + len(ids) + width, limit))
        pos += len(ids) + width
        at = m.end()
    tail = _unescape(template[at:])
    if tail:
        out.append((pos, literal_ids(tokenizer, tail)))
    return out, blanks


@dataclass(frozen=True)
class PinReport:
    """Which pins reached the answer, which never did, and which blanks the answer left unfilled."""

    applied: tuple[int, ...] = ()
    skipped: tuple[int, ...] = ()
    blanks_unfilled: tuple[int, ...] = ()


def report(pins: Pins | None, raw_ids: list[int], end: int, special_ids) -> PinReport:
    """Pins before `end` (where the answer ended, or the canvas that ran ended) applied; the rest skipped.

    A blank is unfilled when the answer ended before it or the model left a special token (padding,
    end of turn) in it.
    """
    if pins is None:
        return PinReport()
    limit = min(end, len(raw_ids))
    special = set(special_ids)
    unfilled = [int(p) for p in pins.blanks if p >= limit or raw_ids[p] in special]
    return PinReport(tuple(int(p) for p in pins.positions if p < limit),
                     tuple(int(p) for p in pins.positions if p >= limit), tuple(unfilled))


def check_shape(text) -> tuple[list[tuple[int, str]], str] | None:
    """The pairs and template of pins text, refused on what needs no tokenizer (None when empty).

    Headless graphs and ComfyUI's validation call this before any node runs; a pin occupies at
    least its first position, so two pins starting at one position overlap whatever the tokenizer.
    """
    if isinstance(text, (list, tuple)):
        raise InputError("pins", f"pins must be one text, got a {type(text).__name__} of {len(text)} item(s); give "
                                 "one text (a sampler runs one item per text when a list is wired to it)")
    if not isinstance(text, str):
        raise InputError("pins", f"pins must be text, got {type(text).__name__}")
    check_text("pins", text)
    if not text.strip():
        return None
    if len(text) > MAX_PINS_TEXT:
        raise InputError("pins", f"pins is {len(text)} characters, over {MAX_PINS_TEXT}; pin less text")
    _check_reach(text)
    pairs, template = pieces(text)
    if template and not BLANK.search(template):
        raise InputError("pins", f"pins line {short(template.splitlines()[0])} is neither `position: text` nor a "
                                 "template with a blank (___); add a blank where the model writes, or a position")
    head = template[:BLANK.search(template).start()] if template else ""  # text pinned from position 0
    starts = [p for p, t in pairs if t] + ([0] if head else [])
    twice = sorted(p for p, n in Counter(starts).items() if n > 1)
    if twice:
        raise InputError("pins", f"two pins claim answer position {twice[0]}; give each position one pin")
    return pairs, template


def _check_reach(text: str) -> None:
    """Refuse a pin position or blank width no answer can hold, before any number is used."""
    for line in text.split("\n"):
        pair = PAIR.match(line)
        counts = [pair.group(1)] if pair else [m.group(1) for m in BLANK.finditer(line) if m.group(1)]
        for digits in counts:
            if len(digits) > len(str(MAX_REACH)) or int(digits) > MAX_REACH:
                what = "position" if pair else "blank width"
                raise InputError("pins", f"pins line {short(line[:80])} gives {what} {short(digits)}, past any "
                                         f"answer (at most {MAX_REACH:,} positions); pin within gen_length")


def parse(dm, text: str, positions_available: int) -> Pins | None:
    """Pins from the widget's text (None when empty); refuses overlaps and pins past the canvas."""
    shape = check_shape(text)
    if shape is None:
        return None
    pairs, template = shape
    spans, blanks = _template(dm.tokenizer, template, positions_available) if template else ([], [])
    spans += [(p, literal_ids(dm.tokenizer, t)) for p, t in pairs]
    taken: dict[int, int] = {}
    for start, ids in spans:
        for offset, token in enumerate(ids):
            p = start + offset
            if p >= positions_available:
                raise InputError("pins", f"pins reach answer position {p}, past the {positions_available} "
                                         "positions this gen_length generates; raise gen_length or pin earlier")
            if p in taken:
                raise InputError("pins", f"two pins claim answer position {p}; give each position one pin")
            taken[p] = token
    if not taken:
        raise InputError("pins", "pins holds no text to pin (only blanks); type the text around the blanks")
    order = sorted(taken)
    blanks = [p for p in blanks if p < positions_available and p not in taken]
    return Pins(np.array(order, np.int64), np.array([taken[p] for p in order], np.int64), text,
                np.array(blanks, np.int64))
