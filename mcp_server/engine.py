"""The server's engine state: one loaded model, its encoded contexts, paused runs, and at most one run.

Everything here is synchronous and meant for a worker thread; the tools in `server.py` wrap it.
A second run while one is busy is refused at once (not queued), so an agent never waits
silently behind a long generation: it can wait for the first result or call cancel_run.
Paused runs hold tensors (canvas, self-conditioning logits, cache), so at most `max_paused`
are kept, the oldest freed first; the last few finished runs are kept for their run logs.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..dgemma.demo import DEMO_DIR, DEMO_NAME
from ..dgemma.denoising.context import encode_context
from ..dgemma.denoising.resume import Advanced
from ..dgemma.denoising.run import generate, prepare, run_batch
from ..dgemma.errors import InputError, short
from ..dgemma.inputs.knobs import Knobs
from ..dgemma.loading.load import load_model
from ..dgemma.steps.schedulers import Scheduling

MAX_PAUSED = 4   # paused runs kept; each holds a canvas x vocab logits tensor and a cache
MAX_RUNS = 8     # finished runs whose run logs stay readable as resources


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


@dataclass(frozen=True)
class Request:
    """One generate call, its arguments already typed: the turn, knobs and what an advanced run adds."""

    prompt: str
    knobs: dict
    context_text: str = ""
    context_handle: str = ""
    image: object = None
    scheduling: dict = field(default_factory=dict)   # Scheduling's arguments: name and its own knobs
    start_step: int | str = 0
    end_step: int = 1024
    pins: str = ""
    resume: str = ""
    constraint: object = None                         # a dgemma Constraint; None: unconstrained
    prompts: tuple = ()                               # several turns as one batch (then `prompt` is unused)


class Engine:
    """One model at a time, the context handles encoded with it, paused runs, and the one-run rule."""

    def __init__(self, default_model: str = DEMO_NAME, dm=None, max_paused: int = MAX_PAUSED,
                 image_dirs: tuple = ("input",)):
        self.default_model = default_model
        self.image_dirs = tuple(Path(d).expanduser().resolve() for d in image_dirs)
        self.dm = dm
        self.choice = dm.source if dm is not None else None
        self.contexts: dict[str, object] = {}
        self.paused: OrderedDict[str, object] = OrderedDict()   # handle -> Resume
        self.runs: OrderedDict[str, tuple] = OrderedDict()      # run_id -> (dm, RunResult) for run logs
        self.max_paused = max_paused
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
            self.paused.clear()
        return self.status()

    def model(self):
        """The loaded model, loading the default one on first use (the caller holds the claim)."""
        if self.dm is None:
            self.dm = load_model(resolve_model(self.default_model))
            self.choice = self.default_model
        return self.dm

    def context(self, handle: str, name: str = "context_handle"):
        if handle not in self.contexts:
            raise InputError(name, f"context handle {short(handle)} is unknown; encode the context first with the "
                                   "encode tool (handles are dropped when freed or when another model is loaded), "
                                   f"known: {short(sorted(self.contexts))}")
        return self.contexts[handle]

    def encode(self, text: str, onto: str = "", image=None) -> dict:
        with self.claim("encode") as run:
            base = self.context(onto, "onto") if onto else None
            cache = encode_context(self.model(), text, onto=base, should_cancel=run.cancel.is_set, image=image)
            handle = "ctx-" + secrets.token_hex(4)
            self.contexts[handle] = cache
        return {"handle": handle, "length": cache.length, "onto": onto or None, "summary": cache.summary()}

    def resumed(self, handle: str):
        if handle not in self.paused:
            held = short(sorted(self.paused)) if self.paused else "none"
            raise InputError("resume", f"resume handle {short(handle)} is unknown: it was never returned, was freed, "
                                       f"or was dropped when more than {self.max_paused} paused runs were kept or "
                                       f"another model was loaded; held: {held}")
        return self.paused[handle]

    def generate(self, req: Request, on_frame=None):
        """Validate like the nodes, then run; returns (model, RunResult, paused handle or None), or raises
        Cancelled."""
        knobs = Knobs(**req.knobs)
        scheduling = Scheduling(**req.scheduling)
        with self.claim("generate") as run:
            resume = self.resumed(req.resume) if req.resume else None
            dm = self.model()
            context = resume.context if resume is not None else \
                self.context(req.context_handle) if req.context_handle else None
            advanced = Advanced(scheduling, req.start_step, req.end_step, req.pins, resume)
            if req.context_text:
                context = encode_context(dm, req.context_text, onto=context, should_cancel=run.cancel.is_set)

            def frame(f):
                run.steps_done += 1
                if on_frame is not None:
                    on_frame(f, run.steps_done)

            result = generate(dm, req.prompt, knobs, context=context, image=req.image, on_frame=frame,
                              should_cancel=run.cancel.is_set, advanced=advanced, constraint=req.constraint)
            handle = self.keep(dm, result)
        return dm, result, handle

    def generate_many(self, req: Request, on_frame=None, on_settled=None):
        """Several prompts as one batch, item i with seed + i; returns (model, [(RunResult, paused handle)]),
        or raises Cancelled. A refusal names the item."""
        knobs = Knobs(**req.knobs)
        with self.claim("generate") as run:
            dm = self.model()
            context = self.context(req.context_handle) if req.context_handle else None
            advanced = Advanced(Scheduling(**req.scheduling), req.start_step, req.end_step, req.pins)
            if req.context_text:
                context = encode_context(dm, req.context_text, onto=context, should_cancel=run.cancel.is_set)
            requests = []
            for index, prompt in enumerate(req.prompts):
                mine = dataclasses.replace(knobs, seed=(knobs.seed + index) % 2**64)
                try:
                    requests.append(prepare(dm, prompt, mine, context=context, image=req.image, advanced=advanced,
                                            constraint=req.constraint, should_cancel=run.cancel.is_set))
                except InputError as err:
                    raise InputError(err.name, f"prompts item {index}: {err}") from None

            def frame(index, f):
                run.steps_done += 1
                if on_frame is not None:
                    on_frame(index, f, run.steps_done)

            results = run_batch(requests, on_frame=frame, should_cancel=run.cancel.is_set, on_settled=on_settled)
            return dm, [(result, self.keep(dm, result)) for result in results]

    def keep(self, dm, result) -> str | None:
        """Keep the run for its run log, and a paused run's resume data under a new handle (bounded)."""
        self.runs[result.config.run_id] = (dm, dataclasses.replace(result, state=dataclasses.replace(
            result.state, resume=None)))
        while len(self.runs) > MAX_RUNS:
            self.runs.popitem(last=False)
        if not result.state.paused:
            return None
        handle = "run-" + secrets.token_hex(4)
        self.paused[handle] = result.state.resume
        while len(self.paused) > self.max_paused:
            self.paused.popitem(last=False)
        return handle

    def free(self, handle: str) -> dict:
        """Forget a context handle or a paused run, releasing its tensors."""
        with self._lock:
            if handle in self.paused:
                return {"freed": True, "handle": handle, "kind": "paused run",
                        "bytes_freed": self.paused.pop(handle).nbytes}
            if handle in self.contexts:
                del self.contexts[handle]
                return {"freed": True, "handle": handle, "kind": "context"}
        return {"freed": False, "handle": handle}

    def status(self) -> dict:
        dm = self.dm
        paused = {h: {"prompt": r.prompt, "block": r.paused.block, "step": r.paused.step,
                      "scheduler": r.scheduler, "bytes": r.nbytes} for h, r in list(self.paused.items())}
        out = {"loaded": dm is not None, "model": self.choice, "default_model": self.default_model,
               "busy": self.run.tool if self.run is not None else None,
               "contexts": {h: c.length for h, c in list(self.contexts.items())},  # a worker may add one meanwhile
               "paused_runs": paused, "max_paused": self.max_paused, "model_info": {}}
        if dm is not None:
            out["model_info"] = {**dm.describe(), "memory": memory(dm), "canvas_length": dm.canvas_length,
                                 "vocab_size": dm.vocab_size}
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
