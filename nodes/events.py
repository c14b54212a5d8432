"""Websocket payloads of the live view, built in one place: `StepStream`.

One `dgemma.start` per run (after its inputs are checked), one `dgemma.step` per step, one
`dgemma.done` at the end with status "done", "error" or "interrupted". A step carries the canvas
as short per-position strings plus one state digit per position by the engine's one rule
(dgemma/readouts/states.py): "0" noise, "1" new, "2" settled, "3" pinned, "4" constrained; the start event
carries the palette, the states' names and, for a model with LoRA adapters, their names and strengths.
A remote engine that does not send a reading (dgemma/readings.py) gets null for it, "5" unknown for every
state when it sends no committed mask (its start event adds that state, and the reasons), and a caption
that says so.
"""

from __future__ import annotations

import numpy as np

from ..dgemma.inputs.tokens import string_table
from ..dgemma.paths import scrub
from ..dgemma.readouts.caption import Caption
from ..dgemma.readouts.states import NAMES, UNKNOWN, UNKNOWN_NAME, hex_palette, step_row_states

START, STEP, DONE = "dgemma.start", "dgemma.step", "dgemma.done"
MAX_PIECE = 8  # characters per position; keeps a 256-token step under 16 KB of JSON
MAX_TEXT = 2000
MAX_PROGRESS_TEXT = 160  # characters of the answer in the node's progress text


def _piece(text: str) -> str:
    return text if len(text) <= MAX_PIECE else text[:MAX_PIECE - 1] + "…"


def _lookup(token_strings, ids, transform=None) -> np.ndarray:
    """The strings of `ids` (each through `transform`) as an object array: one indexing of the model's table."""
    table = string_table(token_strings, transform)
    if table is not None:
        return table[ids]
    out = np.empty(len(ids), dtype=object)
    out[:] = [token_strings[i] if transform is None else transform(token_strings[i]) for i in ids.tolist()]
    return out


def step_states(frame, previous) -> str:
    """State digits of `frame`; `previous` is the step before in the same run, or None (also when its canvas
    has another width: a text-only engine's next chunk)."""
    before = None
    if previous is not None and previous.ids.shape == frame.ids.shape and previous.block == frame.block:
        before = (previous.ids, np.asarray(previous.committed, bool))
    states = step_row_states(frame.ids, np.asarray(frame.committed, bool), before, frame.pinned, frame.constrained)
    return (states + ord("0")).astype(np.uint8).tobytes().decode("ascii")  # one digit per position


class StepStream:
    """The events of one node's run, in order; feed it every frame the engine reports."""

    def __init__(self, node: str, blocks: int | None, steps: int | None, canvas_length: int | None, token_strings,
                 readings=None, adapters: str = ""):
        self.node, self.blocks, self.steps, self.canvas_length = node, blocks, steps, canvas_length
        self.token_strings, self.readings = token_strings, readings
        self.adapters = adapters  # the model's LoRAs as the header names them (' + LoRA name @ 1'); "" for none
        self.unknown = dict(readings.unknown) if readings is not None else {}
        self.previous = None
        self.count = 0  # steps sent, all blocks together

    def start(self, resumed=None, asked: dict | None = None) -> dict:
        """The run's start; a resumed run (its `Recorded` steps) also carries where it resumes, so the
        view continues from it. `asked` (prompt, image thumbnail as base64 PNG) heads the view."""
        states = list(NAMES) + ([UNKNOWN_NAME] if "committed" in self.unknown else [])
        event = {"node": self.node, "blocks": self.blocks, "steps": self.steps, "canvas_length": self.canvas_length,
                 "palette": hex_palette("committed" in self.unknown), "states": states}
        if self.adapters:  # only then: a plain run's start event stays as it was
            event["adapters"] = self.adapters[:MAX_TEXT]
        if self.readings is not None:
            event["unknown"] = {name: why[:MAX_TEXT] for name, why in self.unknown.items()}
        if asked is not None:
            event["asked"] = {"prompt": asked["prompt"][:MAX_TEXT], "thumbnail": asked.get("thumbnail")}
        if resumed is not None and resumed.rows:
            frames = resumed.last_frames(self.canvas_length)
            self.previous = frames[0] if len(frames) > 1 and frames[0].block == frames[1].block else None
            event["resumed"] = {"finished": [self._pieces(ids) for ids in resumed.finished_blocks()],
                                "step": self.step(frames[-1])}
            self.count = 0
        return event

    def _pieces(self, ids) -> str:
        return "".join(self._piece_list(ids))

    def _piece_list(self, ids) -> list[str]:
        return _lookup(self.token_strings, ids, _piece).tolist()

    def _known(self, name: str, value: float) -> float | None:
        return None if name in self.unknown else round(value, 6)

    def step(self, frame) -> dict:
        state = (str(UNKNOWN) * len(frame.ids) if "committed" in self.unknown else step_states(frame, self.previous))
        event = {
            "node": self.node, "block": frame.block, "step": frame.step, "blocks": self.blocks,
            "steps": self.steps if self.steps is not None else frame.total,
            "t": self._known("t", frame.t), "T": self._known("T", frame.temperature),
            "committed": self._known("committed", frame.committed_fraction),
            "caption": Caption.live(frame, self.blocks, self.steps, self.readings).text(),
            "tokens": self._piece_list(frame.ids),
            "state": state,
        }
        self.previous = frame
        self.count += 1
        return event

    def progress_text(self, frame) -> str:
        """One step as the short text under the node: its caption, and the committed text so far (a
        position still noise is a dot)."""
        strings = _lookup(self.token_strings, frame.ids)
        shown = strings if "committed" in self.unknown else np.where(frame.committed, strings, "·")
        text = "".join(shown.tolist()).replace("\n", " ")
        if len(text) > MAX_PROGRESS_TEXT:
            text = text[:MAX_PROGRESS_TEXT - 1] + "…"
        return f"{Caption.live(frame, self.blocks, self.steps, self.readings).text()}\n{text}"

    def done_text(self, steps_used: int | None, text: str, paused: bool = False, warnings=(),
                  per_forward: float | None = None) -> str:
        if paused:  # the canvas is unfinished: its text is still mostly noise
            return f"paused after {steps_used} steps · canvas_state resumes it in an Advanced sampler"
        answer = text if len(text) <= MAX_PROGRESS_TEXT else text[:MAX_PROGRESS_TEXT - 1] + "…"
        rate = "" if per_forward is None else f" · {per_forward:.2f} tokens/forward"
        return f"done · {'?' if steps_used is None else steps_used} steps{rate}{warned(warnings)}\n{answer}"

    def done(self, steps_used: int, text: str, paused: bool = False) -> dict:
        """The end of a run; `paused` when it stopped at its end_step with a resumable canvas_state."""
        return {"node": self.node, "status": "done", "steps_used": steps_used, "text": text[:MAX_TEXT],
                "paused": paused}

    def failed(self, error: BaseException) -> dict:
        """The end of a run that raised: interrupted by the user, or an error with its message."""
        interrupted = "Interrupt" in type(error).__name__ or type(error).__name__ == "Cancelled"
        return {"node": self.node, "status": "interrupted" if interrupted else "error",
                "message": scrub(error)[:MAX_TEXT], "steps_used": self.count}


def warned(warnings) -> str:
    """What qualifies the answer (a pin it never reached, say), on lines of their own; bounded."""
    lines = "".join(f"\n⚠ {w}" for w in list(warnings)[:4])
    return lines if len(lines) <= MAX_PROGRESS_TEXT else lines[:MAX_PROGRESS_TEXT - 1] + "…"


class BatchStream:
    """The events of one node's list run: one StepStream per item, painted as rows of one view.

    A single item sends exactly a single run's events. Several add the item count and each item's
    blocks and steps to the start, and to every step the item it belongs to and the items that
    settled since the previous step (item index -> its steps): a list of a thousand items would
    otherwise resend every settled item with every step.
    """

    def __init__(self, node: str, rows: list[tuple[int, int]], canvas_length: int | None, token_strings, readings=None,
                 adapters: str = ""):
        self.streams = [StepStream(node, blocks, steps, canvas_length, token_strings, readings, adapters)
                        for blocks, steps in rows]
        self.settled: dict[str, int] = {}
        self.fresh: dict[str, int] = {}  # settled since the last step event

    @property
    def items(self) -> int:
        return len(self.streams)

    def start(self, resumed: list, asked: list | None = None) -> dict:
        """`resumed`: per item the `Recorded` steps it resumes from, or None; `asked`: per item its prompt
        and image thumbnail (see StepStream.start)."""
        asked = asked if asked is not None else [None] * self.items
        events = [s.start(r, a) for s, r, a in zip(self.streams, resumed, asked)]
        if self.items == 1:
            return events[0]
        own = ("resumed", "asked")  # each row's own
        rows = [{"blocks": s.blocks, "steps": s.steps, **{k: e[k] for k in own if k in e}}
                for s, e in zip(self.streams, events)]
        first = {k: v for k, v in events[0].items() if k not in own}
        return {**first, "blocks": max(r["blocks"] for r in rows), "steps": max(r["steps"] for r in rows),
                "items": self.items, "rows": rows}

    def step(self, index: int, frame) -> dict:
        event = self.streams[index].step(frame)
        if self.items == 1:
            return event
        fresh, self.fresh = self.fresh, {}
        return {**event, "item": index, "items": self.items, "settled": fresh}

    def settle(self, index: int) -> None:
        self.settled[str(index)] = self.fresh[str(index)] = self.streams[index].count

    def progress_text(self, index: int, frame) -> str:
        text = self.streams[index].progress_text(frame)
        if self.items == 1:
            return text
        return f"{len(self.settled)} of {self.items} items settled · item {index + 1}: {text}"

    def done_text(self, results) -> str:
        if self.items == 1:
            state = results[0].state
            return self.streams[0].done_text(state.steps_used, results[0].text, state.paused, state.warnings,
                                             state.tokens_per_forward)
        texts = " | ".join(r.text.replace("\n", " ") for r in results)
        if len(texts) > MAX_PROGRESS_TEXT:
            texts = texts[:MAX_PROGRESS_TEXT - 1] + "…"
        steps = [r.state.steps_used for r in results]
        notes = [f"item {i + 1}: {w}" for i, r in enumerate(results) for w in r.state.warnings]
        total = "?" if None in steps else sum(steps)
        return f"done · {self.items} items settled, {total} steps{warned(notes)}\n{texts}"

    def done(self, results) -> dict:
        ends = [s.done(r.state.steps_used, r.text, r.state.paused) for s, r in zip(self.streams, results)]
        if self.items == 1:
            return ends[0]
        steps = [e["steps_used"] for e in ends]
        return {"node": ends[0]["node"], "status": "done", "steps_used": None if None in steps else sum(steps),
                "text": ends[0]["text"], "paused": any(e["paused"] for e in ends), "items": ends}

    def failed(self, error: BaseException) -> dict:
        event = self.streams[0].failed(error)
        if self.items == 1:
            return event
        return {**event, "steps_used": sum(s.count for s in self.streams), "items": self.items,
                "settled": len(self.settled)}
