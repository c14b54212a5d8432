"""Per-step progress for agents: step, total, committed %, and the text so far."""

from __future__ import annotations

from ..dgemma.caption import Caption

NOISE = "\u00b7"    # a position the scheduler has not accepted yet
MAX_CHARS = 4000    # keep a notification small on long runs: the tail of the text


class StepMessages:
    """Turns frames into progress messages; blocks already finished stay in the text."""

    def __init__(self, dm, blocks: int, steps: int):
        self.strings = dm.token_strings
        self.blocks, self.steps = blocks, steps  # the request's plan, as the engine counts them
        self.total = self.blocks * self.steps  # an upper bound: the adaptive stop may end a block early
        self.finished: list[str] = []
        self.last = None

    def text(self, frame, all_accepted: bool = False) -> str:
        return "".join(self.strings[i] if all_accepted or ok else NOISE
                       for i, ok in zip(frame.ids.tolist(), frame.accepted.tolist()))

    def message(self, frame) -> str:
        if self.last is not None and frame.block != self.last.block:
            self.finished.append(self.text(self.last, all_accepted=True))
        self.last = frame
        text = "".join(self.finished) + self.text(frame)
        if len(text) > MAX_CHARS:
            text = "\u2026" + text[-MAX_CHARS:]
        return f"{Caption.live(frame, self.blocks, self.steps).text()}: {text}"
