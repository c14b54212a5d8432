"""The one rule for a canvas position's state, and the one palette every view paints it with.

noise: not committed after this step (the scheduler renoised it); new: committed now, but not
committed with the same token at the block's previous step; settled: committed now and at the
previous step with the same token; pinned: held in place by a pin (it never changes); constrained:
the constraint changed it from the token the step itself put there; unknown: the engine did not say
(a text-only stream carries no committed mask), so no state is claimed. Events,
frame images, heatmaps and run-log replays all read `position_states`, so the live view and the GIF never disagree.
"""

from __future__ import annotations

import numpy as np

NOISE, NEW, SETTLED, PINNED, CONSTRAINED = 0, 1, 2, 3, 4
NAMES = ("noise", "new", "settled", "pinned", "constrained")
PALETTE = {NOISE: (96, 102, 118), NEW: (255, 190, 80), SETTLED: (232, 234, 238), PINNED: (110, 190, 255),
           CONSTRAINED: (200, 120, 255)}
# Only a run whose engine sends no committed mask has it; local runs never name or paint it.
UNKNOWN, UNKNOWN_NAME, UNKNOWN_COLOUR = 5, "unknown", (205, 130, 150)
ALL_COLOURS = {**PALETTE, UNKNOWN: UNKNOWN_COLOUR}


def position_states(ids: np.ndarray, committed: np.ndarray, blocks: np.ndarray,
                    pinned: np.ndarray | None = None, constrained: np.ndarray | None = None) -> np.ndarray:
    """(S, L) uint8 states of consecutive steps; a block's first step has no previous step."""
    ids, committed, blocks = np.asarray(ids), np.asarray(committed, bool), np.asarray(blocks)
    held = np.zeros_like(committed)
    if len(committed) > 1:
        same_block = (blocks[1:] == blocks[:-1])[:, None]
        held[1:] = committed[:-1] & same_block & (ids[1:] == ids[:-1])
    return _paint(committed, held, pinned, constrained)


def step_row_states(ids: np.ndarray, committed: np.ndarray, previous=None, pinned: np.ndarray | None = None,
                    constrained: np.ndarray | None = None) -> np.ndarray:
    """(L,) uint8 states of one step; `previous` is (ids, committed) of the block's step before, or None."""
    held = committed & (previous[0] == ids) & previous[1] if previous is not None else np.zeros_like(committed)
    return _paint(committed, held, pinned, constrained)


def _paint(committed, held, pinned, constrained) -> np.ndarray:
    states = np.full(committed.shape, NOISE, np.uint8)
    states[committed] = NEW
    states[committed & held] = SETTLED
    if constrained is not None:
        states[np.asarray(constrained, bool)] = CONSTRAINED
    if pinned is not None:
        states[np.asarray(pinned, bool)] = PINNED
    return states


def hex_palette(unknown: bool = False) -> dict[str, str]:
    """The palette as CSS colours by state name, for the browser; `unknown` adds that state's colour."""
    names = {**dict(enumerate(NAMES)), UNKNOWN: UNKNOWN_NAME}
    colours = ALL_COLOURS if unknown else PALETTE
    return {names[s]: "#{:02x}{:02x}{:02x}".format(*rgb) for s, rgb in colours.items()}
