"""Is a batched item its solo run? Its tokens and every readout exactly; its entropy readings, to the bit or not.

Batched float arithmetic may round the last bit differently (the mixture-of-experts layers multiply a
different number of tokens at once), and self-conditioning feeds each step's logits into the next,
so a recorded entropy can drift from its solo value while every sampled token stays the same.
`differences` names what differs besides the entropy; `entropy_exact` says whether that did too, and
`entropy_within_half` whether it stayed within float16 rounding (what the trace keeps).
"""

from __future__ import annotations

import numpy as np

from ..dgemma.inputs.tokens import frame_texts

TRACE_ARRAYS = ("blocks", "steps", "ids", "committed_bits", "stop_bits", "pinned_bits", "constrained_bits", "times",
                "knob_index")


def _arrays_differ(a, b) -> bool:
    if a is None or b is None:
        return (a is None) != (b is None)
    return a.shape != b.shape or not np.array_equal(a, b)


def differences(solo, batched, token_strings=None) -> list[str]:
    """What of a batched RunResult differs from its solo run (empty: the same run), the entropy's values aside."""
    out = []
    ta, tb = solo.trace, batched.trace
    out += [name for name in TRACE_ARRAYS if _arrays_differ(getattr(ta, name), getattr(tb, name))]
    for name in ("block_stopped_early", "knob_sets", "scheduler_name", "scheduler_settings", "context"):
        if getattr(ta, name) != getattr(tb, name):
            out.append(name)
    if ta.entropy.shape != tb.entropy.shape:
        out.append("entropy")
    if solo.text != batched.text:
        out.append("text")
    if solo.state != batched.state:
        out.append("canvas_state")
    if solo.config != batched.config:
        out.append("run_config")
    if token_strings is not None and frame_texts(ta, token_strings) != frame_texts(tb, token_strings):
        out.append("frames")
    return out


def entropy_exact(solo, batched) -> bool:
    a, b = solo.trace.entropy, batched.trace.entropy
    return a.shape == b.shape and np.array_equal(a, b)


def entropy_within_half(solo, batched) -> bool:
    """Whether every entropy reading is its solo value to within float16 rounding (one float16 step of
    the larger of the two; the trace keeps them as float16)."""
    a, b = solo.trace.entropy, batched.trace.entropy
    if a.shape != b.shape:
        return False
    step = np.spacing(np.maximum(np.abs(a), np.abs(b)).astype(np.float16)).astype(np.float32)
    return bool((np.abs(a.astype(np.float32) - b.astype(np.float32)) <= step).all())
