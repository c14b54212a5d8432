"""The bundled monospace font and its glyph atlas: one cell-sized tile per character, cached.

DejaVu Sans Mono (LICENSE.txt beside this file) ships with the pack, so frames render the same
on every machine. A character the font cannot draw gets one visible substitute tile (a small
diamond) instead of the font's .notdef box.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_PATH = Path(__file__).with_name("DejaVuSansMono.ttf")
FONT_SIZE = 10
BLANK = 0                  # tile id of an empty cell
SUBSTITUTE = 1             # tile id of the narrow missing-glyph marker
WIDE_SUBSTITUTE = (2, 3)   # the marker centred over two cells, for wide (CJK) characters
NOTDEF_PROBE = "\U0010fffd"  # a private-use code point no text font maps

_DIAMOND = np.array([[0, 0, 1, 0, 0],
                     [0, 1, 1, 1, 0],
                     [1, 1, 1, 1, 1],
                     [0, 1, 1, 1, 0],
                     [0, 0, 1, 0, 0]], dtype=np.uint8) * 255


def is_wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


class GlyphAtlas:
    """Tiles of (cell_h, cell_w) alpha, rendered once per character and reused for every frame."""

    def __init__(self, path: Path | str = FONT_PATH, size: int = FONT_SIZE):
        # BASIC layout: per-character rendering that does not depend on whether raqm is installed.
        self.font = ImageFont.truetype(str(path), size, layout_engine=ImageFont.Layout.BASIC)
        self.cell_w = int(round(self.font.getlength("M")))
        self.cell_h = int(self.font.getbbox("ÁÉgjpqy|_", anchor="la")[3])
        self._tiles: list[np.ndarray] = [np.zeros((self.cell_h, self.cell_w), np.uint8)]
        self._tiles += list(self._marker(1)) + list(self._marker(2))
        self._stack: np.ndarray | None = None
        self.notdef = self._render(NOTDEF_PROBE, 1)
        self._map: dict[str, tuple[int, ...]] = {" ": (BLANK,)}
        self.substituted: set[str] = set()
        self.wide_left: set[int] = {WIDE_SUBSTITUTE[0]}  # first halves: never split across rows

    def _marker(self, cells: int) -> list[np.ndarray]:
        tile = np.zeros((self.cell_h, self.cell_w * cells), np.uint8)
        y = self.cell_h // 2 - 2
        x = (self.cell_w * cells - 5) // 2 if cells > 1 else 0
        tile[y:y + 5, x:x + 5] = _DIAMOND
        return np.hsplit(tile, cells)

    def _render(self, ch: str, cells: int) -> np.ndarray:
        img = Image.new("L", (self.cell_w * cells, self.cell_h))
        ImageDraw.Draw(img).text((0, 0), ch, font=self.font, fill=255, anchor="la")
        return np.asarray(img)

    def drawable(self, ch: str) -> bool:
        """True when the font has a real glyph: not its .notdef box, not an empty non-space."""
        narrow = self._render(ch, 1)
        if np.array_equal(narrow, self.notdef):
            return False
        if not narrow.any() and not ch.isspace():
            return bool(self._render(ch, 2).any())
        return True

    def tiles(self, ch: str) -> tuple[int, ...]:
        """Tile ids for one character: one cell, or two for a wide character."""
        got = self._map.get(ch)
        if got is not None:
            return got
        wide = is_wide(ch)
        if ch.isspace():
            got = (BLANK, BLANK) if wide else (BLANK,)
        elif not self.drawable(ch):
            self.substituted.add(ch)
            got = WIDE_SUBSTITUTE if wide else (SUBSTITUTE,)
        else:
            start = len(self._tiles)
            self._tiles += np.hsplit(self._render(ch, 2 if wide else 1), 2 if wide else 1)
            got = tuple(range(start, len(self._tiles)))
            if wide:
                self.wide_left.add(start)
            self._stack = None
        self._map[ch] = got
        return got

    @property
    def stack(self) -> np.ndarray:
        """All tiles as one (G, cell_h, cell_w) uint8 array, rebuilt only after new glyphs."""
        if self._stack is None or len(self._stack) != len(self._tiles):
            self._stack = np.stack(self._tiles)
        return self._stack


_DEFAULT: GlyphAtlas | None = None


def default_atlas() -> GlyphAtlas:
    """The process-wide atlas of the bundled font, so glyphs are rendered once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = GlyphAtlas()
    return _DEFAULT
