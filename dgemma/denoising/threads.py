"""CPU threads for a model's forwards: one thread for models too small to split.

torch splits each CPU op over its intra-op threads. For a model of a few million parameters an op
is microseconds of work, less than the threads' hand-off, and on a busy machine idle threads spin
against the ones that work (the demo ran 10x slower with two threads than with one). The setting
is process-wide, so it is held only while a run computes and restored after the last run leaves.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

SMALL_MODEL_PARAMS = 20_000_000  # below this a CPU forward is faster on one thread

_lock = threading.Lock()
_held = 0
_saved = 0


def _small_on_cpu(model) -> bool:
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return False
    return sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMS


@contextlib.contextmanager
def compute_threads(model):
    """One intra-op thread while a small CPU model computes; the caller's setting otherwise and after."""
    global _held, _saved
    if not _small_on_cpu(model):
        yield
        return
    with _lock:
        if _held == 0:
            _saved = torch.get_num_threads()
            torch.set_num_threads(1)
        _held += 1
    try:
        yield
    finally:
        with _lock:
            _held -= 1
            if _held == 0:
                torch.set_num_threads(_saved)


def with_compute_threads(fn):
    """Run `fn(model, ...)` under `compute_threads(model)`."""
    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        with compute_threads(model):
            return fn(model, *args, **kwargs)
    return wrapper
