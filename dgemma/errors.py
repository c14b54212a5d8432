"""The engine's one error type for bad input (it names the input, so callers can add their hints), and the
two a cancel check raises: `Cancelled` between a run's steps, `LoadCancelled` between a load's tensors."""

from __future__ import annotations

import reprlib

from .paths import scrub

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
MAX_MESSAGE = 1000  # characters: a refusal is read by a person, and a value echoed in it is cut to fit


class InputError(ValueError):
    """What is wrong with input `name`, its value and the fix, in engine terms; never longer than MAX_MESSAGE
    (each message cuts the values it quotes; this is the backstop)."""

    def __init__(self, name: str, message: str):
        message = scrub(message)  # a refusal is shown to anyone the workflow or server is shared with
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE - 8] + "… (cut)"
        super().__init__(message)
        self.name = name


class Cancelled(Exception):
    """Raised between steps when the caller's cancel check asks the run to stop."""

    def __init__(self, steps_done: int):
        super().__init__(f"run cancelled after {steps_done} steps")
        self.steps_done = steps_done


class LoadCancelled(Exception):
    """Raised between two tensors when the caller's cancel check asks the load to stop."""


def short(value) -> str:
    """repr of a value read from a file or an input, cut so a huge one cannot flood the message."""
    return _repr.repr(value)


def require_type(name: str, value, cls, what: str) -> None:
    """Refuse a payload of the wrong kind (a string where a trace belongs, say) before any work."""
    if not isinstance(value, cls):
        raise InputError(name, f"{name} must be {what}, got {type(value).__name__}")
