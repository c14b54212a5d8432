"""One text-dialect stream, collected and bounded: its frames as word pieces, the answer, the thought
and the engine's own numbers.

Everything comes from a network peer, so everything is bounded against the request before it is
kept: text per delta and per frame (a token is at most `TOKEN_CHARS` characters), word pieces per
frame (they size the pictures), frames per run (blocks x the step budget, plus slack), and every
block, step and timing number range-checked. A breach is a RemoteError naming the URL and the value.
"""

from __future__ import annotations

import math
import re
import threading

import numpy as np

from ..dgemma.inputs.knobs import num_blocks
from ..dgemma.readouts.trace import Frame, Recorder
from ..dgemma.readouts.wire import TIMINGS
from .access import summary
from .http import RemoteError

PIECE = re.compile(r"<\|?[a-z_]{1,24}\|?>|\s?[^\s<]{1,7}|\s|<")  # markup whole; words in pieces the view shows
TOKEN_CHARS = 32         # characters one token decodes to, at most (generous: a token is rarely over 16)
SHIM_BLOCK = 256         # the shim runs ceil(max_tokens / 256) blocks
CANVAS_MAX = 8192        # a canvas size beyond this (or below 1) is refused
STEPS_MAX = 1024         # a step budget beyond this is refused (the knob's own maximum)
PIECES_PER_TOKEN = 4     # word pieces a frame may show per canvas token
CELLS_PER_BLOCK = 64 * 1024  # frames x the widest frame's pieces (it sizes the pictures), per 256 tokens asked
NUMBER_KEYS = 40         # timing and usage entries kept, at most
NAN = float("nan")


class PieceTable:
    """id -> display text for text-only streams; append-only, so an id once shown never changes."""

    def __init__(self):
        self._pieces, self._ids, self._lock = [""], {"": 0}, threading.Lock()

    def __getitem__(self, i):
        return self._pieces[i]

    def __len__(self) -> int:
        return len(self._pieces)

    def ids(self, pieces: list[str]) -> np.ndarray:
        with self._lock:
            for p in pieces:
                if p not in self._ids:
                    self._ids[p] = len(self._pieces)
                    self._pieces.append(p)
            return np.array([self._ids[p] for p in pieces], np.int32)


def numbers(data, where: str, url: str) -> dict:
    """The finite numbers (and flags) of a timings or usage object, at most NUMBER_KEYS of them."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RemoteError(f"{url} sent {where} as {type(data).__name__}, not an object")
    out = {}
    for key, value in list(data.items())[:NUMBER_KEYS]:
        ok = isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value)
        if isinstance(key, str) and len(key) <= 64 and ok:
            out[key] = value
    return out


def whole(value, name: str, lo: int, hi: int, url: str) -> int:
    """An integer from the server inside [lo, hi], else a RemoteError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise RemoteError(f"{url} sent {name}={repr(value)[:40]}; it must be a whole number from {lo} to {hi}")
    return value


class TextStream:
    """Collects one stream into frames, the answer, the thought and the server's numbers, within bounds.

    `blocks` is the most blocks (frames, for vLLM) the request can run; `committed`: whether a frame's
    text is a committed canvas (vLLM) or says nothing of it (the shim). A canvas is the card's size, or
    the real model's 256 tokens when the card gives none.
    """

    def __init__(self, model, knobs, on_frame, blocks: int, committed: bool):
        self.model, self.knobs, self.on_frame, self.url = model, knobs, on_frame, model.url
        self.blocks_max, self.committed = blocks, committed
        canvas = model.canvas_length or SHIM_BLOCK
        self.frame_chars, self.frame_pieces = TOKEN_CHARS * canvas, PIECES_PER_TOKEN * canvas
        tokens = (num_blocks(knobs.gen_length, SHIM_BLOCK) + 1) * max(canvas, SHIM_BLOCK)  # whole canvases, + one
        self.text_chars = TOKEN_CHARS * tokens
        self.frames: list[tuple[int, int, np.ndarray]] = []
        self.width = 0  # the widest frame so far, in word pieces
        self.cells = CELLS_PER_BLOCK * num_blocks(knobs.gen_length, SHIM_BLOCK)
        self.budget = None  # the engine's step budget per block, from its first frame
        self.content, self.reasoning, self.chars = [], [], 0
        self.finish, self.usage, self.timings = None, {}, {}

    def token(self) -> str:
        return getattr(getattr(self.model.backend, "remote", None), "token", "")

    def frame_limit(self) -> int:
        """Frames a run may send: every step of every block, plus one per block of slack."""
        return self.blocks_max * ((self.budget or 1) + 1)

    def frame(self, block: int, step: int, text: str) -> None:
        """One frame: its block checked against the request, its text cut into word pieces."""
        if not 0 <= block < self.blocks_max:
            raise RemoteError(f"{self.url} sent block {block}; gen_length {self.knobs.gen_length} runs at most "
                              f"{self.blocks_max} block(s) (numbered from 0)")
        if self.frames and block < self.frames[-1][0]:
            raise RemoteError(f"{self.url} sent block {block} after block {self.frames[-1][0]}")
        if len(self.frames) >= self.frame_limit():
            raise RemoteError(f"{self.url} sent more than {self.frame_limit()} frames for a run of at most "
                              f"{self.blocks_max} block(s) of {self.budget or 1} steps; stopped reading")
        if len(text) > self.frame_chars:
            raise RemoteError(f"{self.url} sent a frame of {len(text)} characters; a canvas of "
                              f"{self.frame_chars // TOKEN_CHARS} tokens holds at most {self.frame_chars}")
        pieces = PIECE.findall(text)
        if len(pieces) > self.frame_pieces:
            raise RemoteError(f"{self.url} sent a frame of {len(pieces)} word pieces; at most {self.frame_pieces} "
                              "are shown for a canvas")
        self.width = max(self.width, len(pieces))
        if (len(self.frames) + 1) * self.width > self.cells:
            raise RemoteError(f"{self.url} sent {len(self.frames) + 1} frames up to {self.width} word pieces wide: "
                              f"over the {self.cells} cells gen_length {self.knobs.gen_length} may paint; stopped "
                              "reading")
        ids = self.model.token_strings.ids(pieces)
        self.frames.append((block, step, ids))
        if self.on_frame is not None:
            self.on_frame(self.live_frame(block, step, ids))

    def live_frame(self, block: int, step: int, ids: np.ndarray) -> Frame:
        n = len(ids)
        arrays = (ids, np.full(n, self.committed), np.full(n, NAN, np.float16), np.zeros(n, bool))
        for a in arrays:
            a.setflags(write=False)
        return Frame(block, step, NAN, NAN, *arrays, total=self.budget)

    def take(self, chunk: dict) -> str:
        """Record the chunk's deltas and numbers; returns the new content it carried."""
        if not isinstance(chunk, dict):
            raise RemoteError(f"{self.url} sent a chunk that is not an object")
        if "error" in chunk:
            raise RemoteError(f"{self.url} stopped the run: {summary(chunk['error'], self.token())}")
        self.usage = numbers(chunk.get("usage"), "usage", self.url) or self.usage
        self.timings = numbers(chunk.get(TIMINGS), TIMINGS, self.url) or self.timings
        new = ""
        choices = chunk.get("choices") or []
        for choice in choices if isinstance(choices, list) else []:
            delta = (choice.get("delta") if isinstance(choice, dict) else None) or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(thought, str) and thought:
                self.reasoning.append(self._bounded(thought))
            if isinstance(delta.get("content"), str):
                new += self._bounded(delta["content"])
            finish = choice.get("finish_reason")
            self.finish = finish if isinstance(finish, str) else self.finish
        self.content.append(new)
        return new

    def _bounded(self, text: str) -> str:
        self.chars += len(text)
        if self.chars > self.text_chars:
            raise RemoteError(f"{self.url} sent over {self.text_chars} characters of text for gen_length "
                              f"{self.knobs.gen_length} (at most {TOKEN_CHARS} per token); stopped reading")
        return text

    def recorder(self, knob_set: dict) -> Recorder:
        """Every frame recorded, padded with the empty piece to the widest frame; t and T unknown (NaN)."""
        import torch

        width = max((len(ids) for _, _, ids in self.frames), default=1)
        recorder = Recorder(self.knobs, width, self.model.token_strings, clock=_NoClock(), knob_set=knob_set)
        for block, step, ids in self.frames:
            canvas = np.zeros((1, width), np.int32)
            canvas[0, :len(ids)] = ids
            recorder.add(block, step, torch.from_numpy(canvas), torch.full((1, width), self.committed),
                         torch.zeros((1, width), dtype=torch.bool), torch.full((1, width), NAN))
        return recorder


class _NoClock:
    """A schedule nobody streamed: every step's t and T are unknown."""

    def position(self, step: int) -> float:
        return NAN

    def temperature(self, step: int) -> float:
        return NAN
