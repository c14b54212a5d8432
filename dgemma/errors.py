"""The engine's one error type for bad input: it names the input, so callers can add their hints."""


class InputError(ValueError):
    """What is wrong with input `name`, its value and the fix, in engine terms."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def require_type(name: str, value, cls, what: str) -> None:
    """Refuse a payload of the wrong kind (a string where a trace belongs, say) before any work."""
    if not isinstance(value, cls):
        raise InputError(name, f"{name} must be {what}, got {type(value).__name__}")
