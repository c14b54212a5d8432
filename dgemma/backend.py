"""The one door to the engine for code that may hold a local or a remote model.

A model payload that carries a `backend` (a remote model does) is run by it; any other is run
here, by this process's engine. Both give the same RunResult and feed the same on_frame.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .context import encode_context
from .errors import InputError
from .guide import guide_plan
from .knobs import num_blocks
from .run import generate, prepare, run_batch
from .schedulers import Scheduling


@runtime_checkable
class Backend(Protocol):
    """What runs a model's requests: this process's engine (`LocalBackend`), this pack's server
    (remote.pack.PackBackend) or a text dialect's server (remote.text.TextBackend; the dialects and how
    each is recognised: remote/dialects.py). Optional, read with getattr below: `plan(model, knobs)`,
    `readings` (what its stream leaves unknown) and `takes_constraints`."""

    def check(self, model, prompt, knobs, context=None, image=None, advanced=None):
        """Every check that needs no model work, before any event or progress is shown."""

    def run(self, model, prompt, knobs, **options):
        """One run (the options of `generate`): a RunResult, each step given to `on_frame`."""

    def encode(self, model, text, onto=None, should_cancel=None, image=None):
        """`text` (and `image`) as a KV context, onto `onto` when given."""


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


def backend_of(model) -> Backend:
    return getattr(model, "backend", None) or LOCAL


def plan_of(model, knobs, advanced=None) -> tuple:
    """(blocks, steps per block) a run plans: upper bounds for the live view, None where a remote engine
    fixes them itself and says so only while it runs."""
    engine = backend_of(model)
    if hasattr(engine, "plan"):
        return engine.plan(model, knobs)
    scheduling = advanced.scheduling if advanced is not None else Scheduling()
    return num_blocks(knobs.gen_length, model.canvas_length), scheduling.steps(knobs)


def readings_of(model):
    """The readings a model's engine declares before it runs (readings.Readings); None: every one exact."""
    return getattr(backend_of(model), "readings", None)


def run_items(model, items, *, on_frame=None, on_settled=None, should_cancel=None, max_batch=None) -> list:
    """Run list items, each (prompt, knobs, options of `generate`), on one model: as batches in this
    process; one after another on a remote model. `on_frame(index, frame)`, `on_settled(index)`."""
    engine = backend_of(model)
    if engine is LOCAL:
        requests = [prepare(model, prompt, knobs, **options) for prompt, knobs, options in items]
        return run_batch(requests, on_frame=on_frame, should_cancel=should_cancel, max_batch=max_batch,
                         on_settled=on_settled)
    results = []
    for index, (prompt, knobs, options) in enumerate(items):
        told = None if on_frame is None else (lambda frame, index=index: on_frame(index, frame))
        results.append(engine.run(model, prompt, knobs, on_frame=told, should_cancel=should_cancel, **options))
        if on_settled is not None:
            on_settled(index)
    return results


def constraint_options(model, constraint, gen_length: int, should_cancel=None) -> dict:
    """The run options a constraint adds, checked (compiled) before any work: none when it is empty."""
    if constraint is None or not getattr(constraint, "active", True):
        return {}
    engine = backend_of(model)
    if engine is LOCAL:
        guide_plan(model, constraint, gen_length, should_cancel)
    elif not getattr(engine, "takes_constraints", False):  # its server compiles and checks the constraint
        raise InputError("constraint", f"{model} is a remote model whose server cannot constrain answers; use this "
                                       "pack's server (python -m serve) or DGemmaLoader, or leave constraint empty")
    return {"constraint": constraint}
