"""Frame images: one picture per executed step, the canvas painted as text on a fixed cell grid.

Every character takes one cell of the bundled monospace font (two for wide characters), so a
glyph is rendered once per process and a frame is one gather of cached tiles. Text word-wraps;
a run longer than a line breaks at a token boundary (else at the edge) instead of being clipped.
Colour is each position's state (dgemma/states.py): settled bright, new amber, noise dim.
"""

from __future__ import annotations

import math
import mmap
import unicodedata
from collections.abc import Sequence

import numpy as np

from .caption import trace_captions
from .fonts import BLANK, SUBSTITUTE, GlyphAtlas, default_atlas
from .states import CONSTRAINED, NEW, NOISE, PALETTE, PINNED, SETTLED

# Per-cell colour states: the position states, then the caption's own.
CAPTION = len(PALETTE)
BACKGROUND = (22, 24, 29)
COLOURS = {**PALETTE, CAPTION: (150, 156, 170)}
N_STATES = len(COLOURS)

COLS = 94                 # 94 cells of 6 px + margins = 576 px wide
CELLS_PER_POSITION = 8    # the text area holds 8 cells per canvas position before it grows
MARGIN_Y, CAPTION_GAP = 4, 4  # the side margins are one blank cell each
SPACE, NEWLINE = -1, -2   # layout codes beside tile ids
NEWLINE_MARK = "\u21b5"   # shows a newline inline when line breaks would not fit
UNIT_CACHE_LIMIT = 200_000
LEGEND = (("new", NEW), (" settled", SETTLED), (" noise", NOISE))
LEGEND_PINNED = LEGEND + ((" pinned", PINNED),)  # only a run with pins shows it


def _lut() -> np.ndarray:
    """(states, 256 alpha levels, 3) uint8: a cell pixel is one lookup of state and glyph alpha."""
    bg = np.array(BACKGROUND, np.float32)
    a = np.arange(256, dtype=np.float32)[:, None] / 255.0
    rows = [np.rint(bg + a * (np.array(COLOURS[s], np.float32) - bg)) for s in sorted(COLOURS)]
    return np.stack(rows).astype(np.uint8)


class TextLayout:
    """Cells of one frame's text, filled row by row: words wrap whole, long runs break."""

    def __init__(self, cols: int, wide_left):
        self.cols, self.wide_left = cols, wide_left
        self.tiles: list[int] = []
        self.owner: list[int] = []
        self.col = 0
        self.soft = False  # the current row began by wrapping, not at a newline
        self.word_tiles: list[int] = []
        self.word_owner: list[int] = []
        self.newline(False)

    def newline(self, wrapped: bool) -> None:
        self.tiles.extend([BLANK] * self.cols)
        self.owner.extend([-1] * self.cols)
        self.col, self.soft = 0, wrapped

    def place(self, tl, ow, start: int, stop: int) -> None:
        """Put cells tl[start:stop] at the cursor; slices, not cells, go in one row at a time."""
        cols = self.cols
        while start < stop:
            if self.col >= cols:
                self.newline(True)
            take = min(cols - self.col, stop - start)
            if take < stop - start and tl[start + take - 1] in self.wide_left:
                take -= 1  # both halves of a wide character stay on one row
                if take == 0:
                    self.newline(True)
                    continue
            at = len(self.tiles) - cols + self.col
            self.tiles[at:at + take] = tl[start:start + take]
            self.owner[at:at + take] = ow[start:start + take]
            self.col += take
            start += take

    def add_word(self, chunk, pos: int) -> None:
        self.word_tiles.extend(chunk)
        self.word_owner.extend([pos] * len(chunk))

    def flush(self) -> None:
        """Place the pending word: on a fresh row if it fits there, else broken at token boundaries."""
        tiles, owner, n = self.word_tiles, self.word_owner, len(self.word_tiles)
        if not n:
            return
        if self.col + n > self.cols and 0 < self.col and n <= self.cols:
            self.newline(True)
        start = 0
        while n - start > self.cols - self.col:
            room = self.cols - self.col
            if room <= 1:
                self.newline(True)
                continue
            cut = next((j for j in range(start + room, start + room // 2, -1) if owner[j] != owner[j - 1]),
                       start + room)
            self.place(tiles, owner, start, cut)
            start = cut
            if self.col:  # place() may already have wrapped to keep a wide character whole
                self.newline(True)
        self.place(tiles, owner, start, n)
        tiles.clear()
        owner.clear()


class FrameRenderer:
    """Paints canvases of one canvas length at one fixed size; caches per-token cell codes."""

    def __init__(self, canvas_length: int, atlas: GlyphAtlas | None = None, cols: int = COLS):
        if canvas_length < 1:
            raise ValueError(f"canvas_length must be at least 1, got {canvas_length}")
        self.atlas = atlas or default_atlas()
        self.cols = cols
        self.base_rows = max(3, math.ceil(CELLS_PER_POSITION * canvas_length / cols))
        self._units: dict[str, tuple[int, ...]] = {}
        self._chunks: dict[str, tuple] = {}
        self._lut = _lut()
        self._strips = {np.uint8: np.zeros((0, self.atlas.cell_w * 3), np.uint8)}
        self._newline_tiles = self.atlas.tiles(NEWLINE_MARK)

    def size(self, rows: int | None = None) -> tuple[int, int]:
        """(height, width) in pixels of a frame whose text area has `rows` rows."""
        a = self.atlas
        rows = self.base_rows if rows is None else rows
        return (2 * MARGIN_Y + a.cell_h * (rows + 1) + CAPTION_GAP, a.cell_w * (self.cols + 2))

    def units(self, text: str) -> tuple[int, ...]:
        """Cell codes of one token string: tile ids, SPACE and NEWLINE; computed once per string."""
        got = self._units.get(text)
        if got is not None:
            return got
        out: list[int] = []
        for ch in unicodedata.normalize("NFC", text):
            if ch == "\n":
                out.append(NEWLINE)
            elif ch == "\t":
                out += (SPACE, SPACE)
            elif ch == " ":
                out.append(SPACE)
            elif unicodedata.category(ch) in ("Mn", "Me", "Cc", "Cf"):
                continue  # zero-width: combining marks and controls take no cell of their own
            else:
                out += self.atlas.tiles(ch)
        got = tuple(out)
        if len(self._units) >= UNIT_CACHE_LIMIT:
            self._units.clear()  # bounds memory when noise walks a 262k vocabulary
        self._units[text] = got
        return got

    def chunks(self, text: str) -> tuple:
        """The token's cells grouped for layout: tuples of glyph tiles between SPACE and NEWLINE codes."""
        got = self._chunks.get(text)
        if got is None:
            out: list = []
            for code in self.units(text):
                if code < 0:
                    out.append(code)
                elif out and isinstance(out[-1], list):
                    out[-1].append(code)
                else:
                    out.append([code])
            got = tuple(tuple(c) if isinstance(c, list) else c for c in out)
            if len(self._chunks) >= UNIT_CACHE_LIMIT:
                self._chunks.clear()
            self._chunks[text] = got
        return got

    def layout(self, tokens: Sequence[str], breaks: bool = True, dense: bool = False
               ) -> tuple[list[int], list[int]]:
        """Flat row-major (tile id, position) lists of whole rows, `cols` cells each.

        Words wrap at spaces; a run longer than a line breaks at its last token boundary in the
        line's second half, else at the edge. Without `breaks` newlines show inline as a mark;
        `dense` also fills every cell, ignoring word boundaries.
        """
        text = TextLayout(self.cols, self.atlas.wide_left)
        mark = list(self._newline_tiles)
        for pos, token in enumerate(tokens):
            for chunk in self.chunks(token):
                if chunk.__class__ is tuple:
                    if dense:
                        text.place(chunk, [pos] * len(chunk), 0, len(chunk))
                    else:
                        text.add_word(chunk, pos)
                    continue
                text.flush()
                if chunk == NEWLINE and breaks:
                    text.newline(False)
                elif chunk == NEWLINE:
                    text.place(mark, [pos] * len(mark), 0, len(mark))
                elif dense or text.col < self.cols and not (text.col == 0 and text.soft):
                    text.place([BLANK], [pos], 0, 1)  # a space that would start a wrapped line is dropped
        text.flush()
        return text.tiles, text.owner

    def fit(self, tokens: Sequence[str]) -> tuple[list[int], list[int]]:
        """The most readable layout that fits the base rows, else the one with fewest rows."""
        best = None
        for breaks, dense in ((True, False), (False, False), (False, True)):
            got = self.layout(tokens, breaks, dense)
            if len(got[0]) <= self.base_rows * self.cols:
                return got
            if best is None or len(got[0]) < len(best[0]):
                best = got
        return best

    def caption_cells(self, caption: Sequence[tuple[str, int]], legend: bool) -> tuple[list[int], list[int]]:
        """One row of (tile, state): the caption on the left, the colour legend on the right."""
        tiles: list[int] = []
        states: list[int] = []
        for text, state in caption:
            for code in self.units(text):
                tiles.append(max(code, BLANK))
                states.append(state)
        right: list[tuple[int, int]] = []
        if legend:
            for text, state in (*(LEGEND if legend is True else legend), ("  ", CAPTION)):
                right += [(max(c, BLANK), state) for c in self.units(text)]
            right += [(SUBSTITUTE, CAPTION)] + [(max(c, BLANK), CAPTION) for c in self.units(" no glyph")]
        gap = self.cols - len(tiles) - len(right)
        if gap >= 2:
            tiles += [BLANK] * gap + [t for t, _ in right]
            states += [CAPTION] * gap + [s for _, s in right]
        return tiles[:self.cols], states[:self.cols]

    def strips(self, dtype) -> np.ndarray:
        """(tiles * states * cell_h, cell_w * 3): one pixel row of every tile in every state.

        A frame is then one gather of these rows straight into its output, in output order.
        """
        stack = self.atlas.stack
        h, w = self.atlas.cell_h, self.atlas.cell_w
        have = len(self._strips[np.uint8]) // (N_STATES * h)
        if have < len(stack):
            states = np.arange(N_STATES)[None, :, None, None]
            fresh = self._lut[states, stack[have:, None]].reshape(-1, w * 3)
            self._strips[np.uint8] = np.concatenate([self._strips[np.uint8], fresh])
            self._strips.pop(np.float32, None)
        if dtype not in self._strips:
            self._strips[dtype] = np.divide(self._strips[np.uint8], np.float32(255.0), dtype=np.float32)
        return self._strips[dtype]

    def paint(self, tiles: list[int], owner: list[int], states: np.ndarray, caption_tiles: list[int],
              caption_states: list[int], rows: int, out: np.ndarray, strips: np.ndarray) -> None:
        """Paint one frame's cells into `out` (H, W, 3), whose vertical margins are already set."""
        cols = self.cols
        body = np.zeros(rows * cols, np.int64)
        body[:len(tiles)] = tiles
        body *= N_STATES
        # owner -1 marks an empty cell; it reads the NOISE state appended after the positions.
        body[:len(owner)] += np.append(states, NOISE)[np.asarray(owner, np.int64)]
        cells = np.zeros((rows, cols + 2), np.int64)  # one blank cell each side is the margin
        cells[:, 1:-1] = body.reshape(rows, cols)
        cap = np.zeros((1, cols + 2), np.int64)
        cap[0, 1:len(caption_tiles) + 1] = np.asarray(caption_tiles, np.int64) * N_STATES + caption_states
        self._gather(out, MARGIN_Y, cap, strips)
        self._gather(out, MARGIN_Y + self.atlas.cell_h + CAPTION_GAP, cells, strips)

    def _gather(self, out: np.ndarray, y0: int, cells: np.ndarray, strips: np.ndarray) -> None:
        h = self.atlas.cell_h
        rows, n = cells.shape
        index = cells[:, None, :] * h + np.arange(h)[None, :, None]  # (rows, pixel row, cell)
        target = out[y0:y0 + rows * h].reshape(rows, h, n, strips.shape[1])  # whole rows: a view
        np.take(strips, index, axis=0, out=target, mode="clip")

    def render(self, canvases: Sequence[Sequence[str]], states: Sequence[np.ndarray],
               captions: Sequence[Sequence[tuple[str, int]]], legend: bool = True, dtype=np.uint8) -> np.ndarray:
        """(B, H, W, 3) frames for B canvases (token strings), all the same size.

        uint8, or float32 in 0..1 (ComfyUI's IMAGE values) painted directly with no second pass.
        The size is the base size for the canvas length unless some frame needs more rows even
        when laid out densely: then every frame of the batch grows, and nothing is clipped.
        """
        if not len(canvases) == len(states) == len(captions):
            raise ValueError(f"canvases, states and captions must be the same length, got "
                             f"{len(canvases)}, {len(states)} and {len(captions)}")
        for tokens, st in zip(canvases, states):
            if len(st) != len(tokens):
                raise ValueError(f"each canvas needs one colour state per token, got {len(st)} states "
                                 f"for {len(tokens)} tokens")
        layouts = [self.fit(tokens) for tokens in canvases]
        caption_rows = [self.caption_cells(cap, legend) for cap in captions]  # may add glyphs too
        rows = max([self.base_rows] + [len(t) // self.cols for t, _ in layouts])
        h, w = self.size(rows)
        dtype = np.dtype(dtype).type
        strips = self.strips(dtype)
        out = _empty((len(canvases), h, w, 3), dtype)
        text_top = MARGIN_Y + self.atlas.cell_h + CAPTION_GAP
        for ys in (slice(0, MARGIN_Y), slice(text_top - CAPTION_GAP, text_top),
                   slice(text_top + rows * self.atlas.cell_h, None)):
            out[:, ys] = strips[0, :3]  # tile BLANK in state NOISE: the background colour
        for i, ((tiles, owner), st, (ct, cs)) in enumerate(zip(layouts, states, caption_rows)):
            self.paint(tiles, owner, np.asarray(st, np.uint8), ct, cs, rows, out[i], strips)
        return out


def _empty(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array whose pages are already mapped.

    Faulting a fresh 100 MB batch in page by page is most of the cost of the IMAGE batch, and
    numpy's own allocation asks for huge pages, which stalls while the kernel compacts memory.
    MAP_POPULATE maps it in one call where Linux has it; elsewhere torch's allocator.
    """
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size and hasattr(mmap, "MAP_POPULATE"):
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
        return np.frombuffer(buffer, dtype).reshape(shape)  # the array keeps the mapping alive
    import torch

    return torch.empty(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype).numpy()


_RENDERERS: dict[int, FrameRenderer] = {}


def renderer(canvas_length: int) -> FrameRenderer:
    """The shared renderer for a canvas length, so token cells are reused across runs."""
    got = _RENDERERS.get(canvas_length)
    if got is None:
        got = _RENDERERS[canvas_length] = FrameRenderer(canvas_length)
    return got


def captions(trace) -> list[list[tuple[str, int]]]:
    """Per frame of a CanvasTrace, its caption (dgemma/caption.py) as painted text."""
    return [[(c.text(), CAPTION)] for c in trace_captions(trace)]


def render_frames(trace, token_strings: Sequence[str], legend: bool = True, dtype=np.uint8) -> np.ndarray:
    """(S, H, W, 3) images, one per executed step of a CanvasTrace; uint8 unless dtype says."""
    canvases = [[token_strings[i] for i in row] for row in trace.ids.tolist()]
    r = renderer(trace.canvas_length)
    if not canvases:
        return np.zeros((0, *r.size(), 3), dtype)
    if legend and trace.pinned_bits is not None:
        legend = LEGEND_PINNED
    if legend and trace.constrained_bits is not None:
        legend = (LEGEND if legend is True else legend) + ((" constrained", CONSTRAINED),)
    return r.render(canvases, trace.states(), captions(trace),
                    legend=legend, dtype=dtype)


def render_images(trace, token_strings: Sequence[str]):
    """The sampler's `images`: ComfyUI's IMAGE, torch float32 (S, H, W, 3) in 0..1, painted directly."""
    import torch

    return torch.from_numpy(render_frames(trace, token_strings, dtype=np.float32))
