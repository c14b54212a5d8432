"""Frame images: one picture per executed step, the canvas painted as text on a fixed cell grid.

Every character takes one cell of the bundled monospace font (two for wide characters), so a
glyph is rendered once per process and a frame is one gather of cached tiles. Text word-wraps;
a run longer than a line breaks at a token boundary (else at the edge) instead of being clipped.
Colour is each position's state (dgemma/readouts/states.py): settled bright, new amber, noise dim; a remote
engine that sends no committed mask paints every position "unknown", and the legend says what its
frames show instead.
"""

from __future__ import annotations

import base64
import io
import math
import mmap
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..readings import why_unknown
from .caption import trace_captions
from .fonts import BLANK, SUBSTITUTE, GlyphAtlas, default_atlas
from .states import ALL_COLOURS, CONSTRAINED, NEW, NOISE, PINNED, SETTLED, UNKNOWN, UNKNOWN_NAME
from .textlayout import TextLayout

# Per-cell colour states: the position states, then the caption's own.
CAPTION = len(ALL_COLOURS)
BACKGROUND = (22, 24, 29)
COLOURS = {**ALL_COLOURS, CAPTION: (150, 156, 170)}
N_STATES = len(COLOURS)

COLS = 94                 # 94 cells of 6 px + margins = 576 px wide
CELLS_PER_POSITION = 8    # the text area holds 8 cells per canvas position before it grows
MARGIN_Y, CAPTION_GAP = 4, 4  # the side margins are one blank cell each
SPACE, NEWLINE = -1, -2   # layout codes beside tile ids
NEWLINE_MARK = "\u21b5"   # shows a newline inline when line breaks would not fit
UNIT_CACHE_LIMIT = 200_000
LEGEND = (("new", NEW), (" settled", SETTLED), (" noise", NOISE))
LEGEND_PINNED = LEGEND + ((" pinned", PINNED),)  # only a run with pins shows it
ASKED_ROWS = 2            # the header's lines for what was asked: the prompt, after the image's thumbnail


@dataclass(frozen=True)
class Asked:
    """What a run was asked, for the frames' header: the prompt, and the image's thumbnail pixels."""

    prompt: str
    thumbnail: np.ndarray | None = None  # (h <= ASKED_ROWS cells, w, 3) uint8

    @classmethod
    def of(cls, prompt: str, image: dict | None) -> Asked:
        """From a run's prompt and image record (a RunConfig's, or a run log header's)."""
        thumb = (image or {}).get("thumbnail")
        if thumb is None:
            return cls(prompt)
        from PIL import Image

        pixels = np.asarray(Image.open(io.BytesIO(base64.b64decode(thumb))).convert("RGB"))
        return cls(prompt, pixels)


def _lut() -> np.ndarray:
    """(states, 256 alpha levels, 3) uint8: a cell pixel is one lookup of state and glyph alpha."""
    bg = np.array(BACKGROUND, np.float32)
    a = np.arange(256, dtype=np.float32)[:, None] / 255.0
    rows = [np.rint(bg + a * (np.array(COLOURS[s], np.float32) - bg)) for s in sorted(COLOURS)]
    return np.stack(rows).astype(np.uint8)


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

    def size(self, rows: int | None = None, asked: bool = False) -> tuple[int, int]:
        """(height, width) in pixels of a frame whose text area has `rows` rows (and an asked band)."""
        a = self.atlas
        rows = self.base_rows if rows is None else rows
        return self.text_top(asked) + a.cell_h * rows + MARGIN_Y, a.cell_w * (self.cols + 2)

    def text_top(self, asked: bool) -> int:
        band = ASKED_ROWS * self.atlas.cell_h + CAPTION_GAP if asked else 0
        return MARGIN_Y + self.atlas.cell_h + CAPTION_GAP + band

    def asked_cells(self, asked: Asked) -> np.ndarray:
        """(ASKED_ROWS, cols + 2) cell codes: "asked:" and the prompt, words wrapped, cut with an ellipsis,
        right of room kept for the thumbnail."""
        skip = 0 if asked.thumbnail is None else -(-asked.thumbnail.shape[1] // self.atlas.cell_w) + 1
        width = self.cols - skip
        text = TextLayout(width, self.atlas.wide_left)
        for chunk in self.chunks(" ".join(f"asked: {asked.prompt}".split())):
            if chunk.__class__ is tuple:
                text.add_word(chunk, 0)
                continue
            text.flush()
            if text.col < width and not (text.col == 0 and text.soft):
                text.place([BLANK], [0], 0, 1)
        text.flush()
        tiles = np.full(ASKED_ROWS * width, BLANK, np.int64)
        got = text.tiles[:len(tiles)]
        tiles[:len(got)] = got
        if any(t != BLANK for t in text.tiles[len(tiles):]):  # cut: an ellipsis after the last word shown
            shown = np.flatnonzero(tiles != BLANK)
            tiles[min(shown[-1] + 1, len(tiles) - 1) if len(shown) else 0] = self.atlas.tiles("\u2026")[0]
        cells = np.zeros((ASKED_ROWS, self.cols + 2), np.int64)
        cells[:, 1 + skip:-1] = tiles.reshape(ASKED_ROWS, width) * N_STATES + CAPTION
        return cells

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
              caption_states: list[int], rows: int, out: np.ndarray, strips: np.ndarray, top: int) -> None:
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
        self._gather(out, top, cells, strips)

    def _gather(self, out: np.ndarray, y0: int, cells: np.ndarray, strips: np.ndarray) -> None:
        h = self.atlas.cell_h
        rows, n = cells.shape
        index = cells[:, None, :] * h + np.arange(h)[None, :, None]  # (rows, pixel row, cell)
        target = out[y0:y0 + rows * h].reshape(rows, h, n, strips.shape[1])  # whole rows: a view
        np.take(strips, index, axis=0, out=target, mode="clip")

    def render(self, canvases: Sequence[Sequence[str]], states: Sequence[np.ndarray],
               captions: Sequence[Sequence[tuple[str, int]]], legend: bool = True, dtype=np.uint8,
               asked: Asked | None = None) -> np.ndarray:
        """(B, H, W, 3) frames for B canvases (token strings), all the same size; `asked` adds a
        header band with the prompt and the image's thumbnail.

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
        band = None if asked is None else self.asked_cells(asked)  # before the strips: it may add glyphs
        h, w = self.size(rows, asked is not None)
        dtype = np.dtype(dtype).type
        strips = self.strips(dtype)
        out = _empty((len(canvases), h, w, 3), dtype)
        cell_h, top = self.atlas.cell_h, self.text_top(asked is not None)
        out[:, :MARGIN_Y] = strips[0, :3]  # tile BLANK in state NOISE: the background colour
        out[:, MARGIN_Y + cell_h:top] = strips[0, :3]
        out[:, top + rows * cell_h:] = strips[0, :3]
        for i, ((tiles, owner), st, (ct, cs)) in enumerate(zip(layouts, states, caption_rows)):
            self.paint(tiles, owner, np.asarray(st, np.uint8), ct, cs, rows, out[i], strips, top)
        if band is not None:
            self._paint_asked(out, band, asked.thumbnail, strips)
        return out

    def _paint_asked(self, out: np.ndarray, band: np.ndarray, thumbnail, strips: np.ndarray) -> None:
        y0 = MARGIN_Y + self.atlas.cell_h + CAPTION_GAP
        for i in range(len(out)):
            self._gather(out[i], y0, band, strips)
        if thumbnail is not None:
            th, tw = thumbnail.shape[:2]
            pixels = thumbnail if out.dtype == np.uint8 else thumbnail.astype(np.float32) / np.float32(255.0)
            out[:, y0:y0 + th, self.atlas.cell_w:self.atlas.cell_w + tw] = pixels


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
    """Per frame of a CanvasTrace, its caption (dgemma/readouts/caption.py) as painted text."""
    return [[(c.text(), CAPTION)] for c in trace_captions(trace)]


def render_frames(trace, token_strings: Sequence[str], legend: bool = True, dtype=np.uint8,
                  asked: Asked | None = None) -> np.ndarray:
    """(S, H, W, 3) images, one per executed step of a CanvasTrace; uint8 unless dtype says; `asked`
    (the run's prompt and image) heads every frame, so a GIF shared alone says what was asked."""
    canvases = [[token_strings[i] for i in row] for row in trace.ids.tolist()]
    r = renderer(trace.canvas_length)
    if not canvases:
        return np.zeros((0, *r.size(asked=asked is not None), 3), dtype)
    if legend and why_unknown(trace, "committed"):  # no state is claimed: say what the frames are instead
        legend = ((f" {UNKNOWN_NAME} ({trace.readings.canvas or 'text only'})", UNKNOWN),)
    elif legend and trace.pinned_bits is not None:
        legend = LEGEND_PINNED
    if legend and trace.constrained_bits is not None:
        legend = (LEGEND if legend is True else legend) + ((" constrained", CONSTRAINED),)
    return r.render(canvases, trace.states(), captions(trace), legend=legend, dtype=dtype, asked=asked)


def render_images(trace, token_strings: Sequence[str], asked: Asked | None = None):
    """The sampler's `images`: ComfyUI's IMAGE, torch float32 (S, H, W, 3) in 0..1, painted directly."""
    import torch

    return torch.from_numpy(render_frames(trace, token_strings, dtype=np.float32, asked=asked))
