"""What every remote backend shares: one check that leaves a small checked request, and the checked
requests run one after another on the server, each as its check left it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..dgemma.errors import InputError


@dataclass(frozen=True, eq=False)
class Checked:
    """One remote run as its backend's check left it: its inputs, as the backend's `run` takes them."""

    model: object
    prompt: str
    knobs: object
    options: dict  # context, image, advance_context, advanced, and the constraint when one is given


class RemoteBackend:
    """A backend whose runs happen on a server: `check_inputs` (the checks that need no model), `run_one`."""

    takes_constraints = False  # True where the server compiles and checks a constraint itself

    def check(self, model, prompt, knobs, context=None, image=None, advanced=None, *, constraint=None,
              advance_context=False, should_cancel=None) -> Checked:
        """Every check that needs no model work, before any event or progress is shown."""
        self.check_inputs(model, prompt, knobs, context, image, advanced)
        options = {"context": context, "image": image, "advance_context": advance_context, "advanced": advanced}
        if constraint is not None and getattr(constraint, "active", True):
            if not self.takes_constraints:
                raise InputError("constraint", f"{model} is a remote model whose server cannot constrain answers; "
                                               "use this pack's server (python -m serve) or DGemmaLoader, or leave "
                                               "constraint empty")
            options["constraint"] = constraint
        return Checked(model, prompt, knobs, options)

    def check_inputs(self, model, prompt, knobs, context=None, image=None, advanced=None) -> None:
        raise NotImplementedError

    def run_one(self, req: Checked, on_frame=None, should_cancel=None):
        raise NotImplementedError

    def run_checked(self, requests, *, on_frame=None, on_settled=None, should_cancel=None, max_batch=None) -> list:
        """Checked requests, one after another on the server (`max_batch` is this process's batches: unused)."""
        results = []
        for index, req in enumerate(requests):
            told = None if on_frame is None else functools.partial(on_frame, index)
            results.append(self.run_one(req, told, should_cancel))
            if on_settled is not None:
                on_settled(index)
        return results
