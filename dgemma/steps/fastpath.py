"""Whether the engine takes its fast path: the entropy-bound step fused on the device (dgemma/steps/batch_step.py),
which gives diffusers' very tokens. DGEMMA_FAST=0 in the environment, or `eager()` around a run, takes the
eager path (diffusers' own step), for parity checks (decision 0030)."""

from __future__ import annotations

import contextlib
import os
import threading

_lock = threading.Lock()
_eager = 0  # runs inside `eager()`, process-wide (a run's steps may be taken on another thread)


def on() -> bool:
    return _eager == 0 and os.environ.get("DGEMMA_FAST", "1") != "0"


@contextlib.contextmanager
def eager():
    """The eager path while the block runs."""
    global _eager
    with _lock:
        _eager += 1
    try:
        yield
    finally:
        with _lock:
            _eager -= 1
