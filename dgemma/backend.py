"""The one door to the engine for code that may hold a local or a remote model.

A model payload that carries a `backend` (a remote model does) is run by it; any other is run
here, by this process's engine. Both give the same RunResult and feed the same on_frame.
"""

from __future__ import annotations

from .context import encode_context
from .errors import InputError
from .guide import guide_for
from .run import generate, prepare


class LocalBackend:
    """This process's engine."""

    def check(self, dm, prompt, knobs, context=None, image=None, advanced=None) -> None:
        """Every check that needs no model work, before any event or progress is shown."""
        prepare(dm, prompt, knobs, context=context, image=image, advanced=advanced)

    def run(self, dm, prompt, knobs, **options):
        return generate(dm, prompt, knobs, **options)

    def encode(self, dm, text, onto=None, should_cancel=None, image=None):
        return encode_context(dm, text, onto=onto, should_cancel=should_cancel, image=image)


LOCAL = LocalBackend()


def backend_of(model):
    return getattr(model, "backend", None) or LOCAL


def constraint_options(model, constraint, gen_length: int) -> dict:
    """The run options a constraint adds, checked before any work: none when it is empty."""
    if constraint is None or not getattr(constraint, "active", True):
        return {}
    if backend_of(model) is not LOCAL:
        raise InputError("constraint", f"{model} is a remote model, and constrained answers run only in this "
                                       "process for now; load the model with DGemmaLoader, or leave constraint empty")
    guide_for(model, constraint, gen_length)
    return {"constraint": constraint}
