"""The one door to the engine for code that may hold a local or a remote model.

A model payload that carries a `backend` (a remote model does) is run by it; any other is run
here, by this process's engine. Both give the same RunResult and feed the same on_frame.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .denoising.context import encode_context
from .denoising.run import Request, generate, prepare, run_batch
from .inputs.knobs import num_blocks
from .steps.schedulers import Scheduling


@runtime_checkable
class Backend(Protocol):
    """What runs a model's requests: this process's engine (`LocalBackend`), this pack's server
    (remote.pack.PackBackend) or a text dialect's server (remote.text.TextBackend; the dialects and how
    each is recognised: remote/dialects.py). Optional, read with getattr below: `plan(model, knobs)` and
    `readings` (what its stream leaves unknown)."""

    def check(self, model, prompt, knobs, context=None, image=None, advanced=None, *, constraint=None,
              advance_context=False, should_cancel=None):
        """Every check that needs no model work, before any event or progress is shown: the checked request
        that `run_checked` runs as it is (`should_cancel` stops a constraint's compile)."""

    def run_checked(self, requests, *, on_frame=None, on_settled=None, should_cancel=None, max_batch=None) -> list:
        """Checked requests of one model: their RunResults, in order. `on_frame(index, frame)` reports each
        step, `on_settled(index)` each item that finished or paused."""

    def run(self, model, prompt, knobs, **options):
        """One run (the options of `generate`): a RunResult, each step given to `on_frame`."""

    def encode(self, model, text, onto=None, should_cancel=None, image=None):
        """`text` (and `image`) as a KV context, onto `onto` when given."""


class LocalBackend:
    """This process's engine: its checked request is `run.Request`, and a list runs as batches."""

    def check(self, dm, prompt, knobs, context=None, image=None, advanced=None, *, constraint=None,
              advance_context=False, should_cancel=None) -> Request:
        return prepare(dm, prompt, knobs, context=context, image=image, advance_context=advance_context,
                       advanced=advanced, constraint=constraint, should_cancel=should_cancel)

    def run_checked(self, requests, *, on_frame=None, on_settled=None, should_cancel=None, max_batch=None) -> list:
        return run_batch(requests, on_frame=on_frame, should_cancel=should_cancel, max_batch=max_batch,
                         on_settled=on_settled)

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
