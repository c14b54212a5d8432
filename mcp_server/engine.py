"""The server's engine state: one loaded model, its encoded contexts, and at most one run.

Everything here is synchronous and meant for a worker thread; the tools in `server.py` wrap it.
A second run while one is busy is refused at once (not queued), so an agent never waits
silently behind a long generation: it can wait for the first result or call cancel_run.
"""

from __future__ import annotations

import secrets
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..dgemma.context import encode_context
from ..dgemma.demo import DEMO_DIR, DEMO_NAME
from ..dgemma.knobs import Knobs
from ..dgemma.loading import load_model
from ..dgemma.run import prepare
from ..dgemma.run import run as run_request


class Busy(ValueError):
    """Refused because another run holds the model."""


@dataclass
class Run:
    """The run in progress: what it is, how far it got, and its cancel switch."""

    tool: str
    steps_done: int = 0
    cancel: threading.Event = field(default_factory=threading.Event)


def resolve_model(choice: str) -> str:
    """The demo's name means the shipped demo folder; folders and hub ids go to the loader as given."""
    return str(DEMO_DIR) if choice == DEMO_NAME else choice


class Engine:
    """One model at a time, the context handles encoded with it, and the one-run rule."""

    def __init__(self, default_model: str = DEMO_NAME, dm=None):
        self.default_model = default_model
        self.dm = dm
        self.choice = dm.source if dm is not None else None
        self.contexts: dict[str, object] = {}
        self.run: Run | None = None
        self._lock = threading.Lock()

    @contextmanager
    def claim(self, tool: str):
        """Hold the model for one run; refuse clearly when another run holds it."""
        with self._lock:
            if self.run is not None:
                raise Busy(f"a {self.run.tool} call is in progress ({self.run.steps_done} steps done); one run "
                           "at a time per model: wait for its result or call cancel_run")
            self.run = Run(tool)
        try:
            yield self.run
        finally:
            with self._lock:
                self.run = None

    def cancel(self) -> dict:
        """Ask the run in progress to stop before its next step."""
        with self._lock:
            run = self.run
            if run is None:
                return {"cancelled": False, "message": "no run is in progress"}
            if run.tool == "load_model":  # loading has no step boundary to stop at
                return {"cancelled": False, "tool": run.tool, "message": "loading a model cannot be cancelled; "
                        "it ends on its own"}
            run.cancel.set()
            return {"cancelled": True, "tool": run.tool, "steps_done": run.steps_done,
                    "message": f"the {run.tool} run stops before its next step"}

    def load(self, model: str, quant: str, device: str, dtype: str, local_files_only: bool) -> dict:
        with self.claim("load_model"):
            dm = load_model(resolve_model(model), quant=quant, dtype=dtype, device=device,
                            local_files_only=local_files_only)
            # Handles belong to the model that encoded them; a new model makes them unusable.
            self.dm, self.choice = dm, model
            self.contexts.clear()
        return self.status()

    def model(self):
        """The loaded model, loading the default one on first use (the caller holds the claim)."""
        if self.dm is None:
            self.dm = load_model(resolve_model(self.default_model))
            self.choice = self.default_model
        return self.dm

    def context(self, handle: str):
        if handle not in self.contexts:
            raise ValueError(f"context handle {handle!r} is unknown; encode the context first with the encode tool "
                             f"(handles are dropped when another model is loaded), known: {sorted(self.contexts)}")
        return self.contexts[handle]

    def encode(self, text: str, onto: str = "") -> dict:
        with self.claim("encode") as run:
            base = self.context(onto) if onto else None
            cache = encode_context(self.model(), text, onto=base, should_cancel=run.cancel.is_set)
            handle = "ctx-" + secrets.token_hex(4)
            self.contexts[handle] = cache
        return {"handle": handle, "length": cache.length, "onto": onto or None, **cache.summary()}

    def generate(self, prompt: str, knobs: dict, context_text: str = "", context_handle: str = "",
                 on_frame=None, on_start=None):
        """Validate like the nodes, then run; returns (model, RunResult), or raises Cancelled.

        `on_start(request)` hears the checked request before the first step."""
        knobs = Knobs(**knobs)
        with self.claim("generate") as run:
            dm = self.model()
            context = self.context(context_handle) if context_handle else None
            if context_text:
                context = encode_context(dm, context_text, onto=context, should_cancel=run.cancel.is_set)

            def frame(f):
                run.steps_done += 1
                if on_frame is not None:
                    on_frame(f, run.steps_done)

            request = prepare(dm, prompt, knobs, context=context)
            if on_start is not None:
                on_start(request)
            result = run_request(request, on_frame=frame, should_cancel=run.cancel.is_set)
        return dm, result

    def status(self) -> dict:
        dm = self.dm
        out = {"loaded": dm is not None, "model": self.choice, "default_model": self.default_model,
               "busy": self.run.tool if self.run is not None else None,
               "contexts": {h: c.length for h, c in list(self.contexts.items())}}  # a worker may add one meanwhile
        if dm is not None:
            out.update(dm.describe(), memory=memory(dm), canvas_length=dm.canvas_length, vocab_size=dm.vocab_size)
        return out


def memory(dm) -> dict:
    """Bytes held by the weights per device, and the GPU's allocator view when there is one."""
    import torch

    per_device: dict[str, int] = {}
    for tensor in list(dm.model.parameters()) + list(dm.model.buffers()):
        key = str(tensor.device)
        per_device[key] = per_device.get(key, 0) + tensor.numel() * tensor.element_size()
    out = {"weights_bytes": per_device}
    if torch.cuda.is_available():
        out["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
        out["cuda_reserved_bytes"] = torch.cuda.memory_reserved()
    return out
