"""Websocket payloads of the live view: one `dgemma.start` per run, one `dgemma.step` per step.

A step carries the canvas itself as short per-position strings plus one state character per
position, so the page can paint the text as it anneals: "0" noise (renoised this step), "1" newly
accepted, "2" accepted again with the same token as the step before (settled).
"""

from __future__ import annotations

import numpy as np

START, STEP, DONE = "dgemma.start", "dgemma.step", "dgemma.done"
MAX_PIECE = 8  # characters per position; keeps a 256-token step under 16 KB of JSON


def start_event(node: str, blocks: int, steps: int, canvas_length: int) -> dict:
    return {"node": node, "blocks": blocks, "steps": steps, "canvas_length": canvas_length}


def _piece(text: str) -> str:
    return text if len(text) <= MAX_PIECE else text[:MAX_PIECE - 1] + "…"


def step_states(frame, previous) -> str:
    """Per-position state characters; `previous` is the frame before in the same block, or None."""
    states = np.where(frame.accepted, 1, 0)
    if previous is not None:
        settled = frame.accepted & previous.accepted & (frame.ids == previous.ids)
        states[settled] = 2
    return "".join("012"[s] for s in states)


def step_event(node: str, frame, previous, token_strings, blocks: int, steps: int) -> dict:
    return {
        "node": node, "block": frame.block, "step": frame.step, "blocks": blocks, "steps": steps,
        "t": round(frame.t, 6), "T": round(frame.temperature, 6),
        "committed": round(frame.committed_fraction, 6),
        "tokens": [_piece(token_strings[i]) for i in frame.ids.tolist()],
        "state": step_states(frame, previous),
    }


def done_event(node: str, steps_used: int, text: str) -> dict:
    return {"node": node, "steps_used": steps_used, "text": text[:2000]}
