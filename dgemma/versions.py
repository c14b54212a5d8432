"""The transformers/diffusers versions this engine is tested with, and the API names that moved."""

from __future__ import annotations

import inspect
from importlib import metadata

# Oldest and newest releases the test suite runs on; DiffusionGemma first shipped in 5.11.
TRANSFORMERS_MIN, TRANSFORMERS_MAX = (5, 13), (5, 25)
DIFFUSERS_MIN = (0, 39)
FIX = 'pip install "transformers>=5.13,<5.26" "diffusers>=0.39" into the Python that runs ComfyUI'


def _release(dist: str) -> tuple[int, ...] | None:
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_versions() -> None:
    """Raise ImportError naming the fix when transformers or diffusers is outside the tested range."""
    tf = _release("transformers")
    df = _release("diffusers")
    if tf is None or not TRANSFORMERS_MIN <= tf[:2] <= TRANSFORMERS_MAX:
        found = "not installed" if tf is None else ".".join(map(str, tf))
        raise ImportError(f"DiffusionGemma needs transformers 5.13 to 5.25 (found {found}); {FIX}")
    if df is None or df[:2] < DIFFUSERS_MIN:
        found = "not installed" if df is None else ".".join(map(str, df))
        raise ImportError(f"DiffusionGemma needs diffusers 0.39 or newer (found {found}); {FIX}")


def cache_kw(fn) -> str:
    """transformers 5.24 renamed the cache argument `past_key_values` to `cache`."""
    return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"
