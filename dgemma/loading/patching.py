"""How the pack changes another library's behaviour: one lock, one scoped swap, one log line per patch.

Every patch (the list is in dgemma/loading/patches.py) edits module-global attributes of an installed
library, never its files. A patch for the length of a block uses `swap`; a patch installed for good
checks whether it is in place, and installs it under `LOCK`. `note_once` says once per process
whether each patch applied.
"""

from __future__ import annotations

import contextlib
import logging
import threading

log = logging.getLogger("dgemma")

# Held by a swap for its whole block: the attributes are module-global, and two overlapping swaps of
# one attribute would restore each other's value. Reentrant, so a load's nested swaps share it.
LOCK = threading.RLock()
_noted: set[str] = set()


@contextlib.contextmanager
def swap(target, **attributes):
    """`target`'s attributes set to the given values for the length of the block, then restored, under LOCK."""
    with LOCK:
        originals = {name: getattr(target, name) for name in attributes}
        for name, value in attributes.items():
            setattr(target, name, value)
        try:
            yield
        finally:
            for name, value in originals.items():
                setattr(target, name, value)


def note_once(name: str, applied: bool, why: str) -> None:
    """Log whether the patch `name` applied, and why, the first time it is asked (no lock: a step asks)."""
    if name in _noted:
        return
    _noted.add(name)
    log.info("patch %s: %s (%s)", name, "applied" if applied else "not applied", why)
