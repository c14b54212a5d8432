"""The server's engine side: one model, the handles it keeps, and one run at a time.

Runs go through the engine's `prepare` and `run_batch` (a request's `n` choices are one batch) on a
single worker thread; each step is turned into its SSE chunk on that thread, so the event loop only
writes bytes. A conversation (a system message, earlier turns) is encoded as a KV context first.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

from ..dgemma.backend import backend_of
from ..dgemma.constraints.constraint import automaton
from ..dgemma.constraints.guide import compiled_for, needs_compile
from ..dgemma.denoising.context import encode_chat
from ..dgemma.denoising.run import prepare, run_batch
from ..dgemma.errors import InputError
from ..dgemma.inputs.chat import chat_ids
from ..dgemma.readouts.wire import BLOCKS_RUN, CANVAS_RUN, EXTENSION, FRAME, STEPS_RUN, result_json, step_json
from .structured import checked


class Handles:
    """Payloads kept for clients by opaque handle (KV contexts, resumable canvases), oldest dropped first."""

    def __init__(self, kind: str, limit: int):
        self.kind, self.limit = kind, limit
        self._items: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, item) -> str:
        handle = f"{self.kind}-{secrets.token_hex(8)}"
        with self._lock:
            self._items[handle] = item
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return handle

    def __len__(self) -> int:
        return len(self._items)

    def get(self, name: str, handle):
        with self._lock:
            item = self._items.get(handle) if isinstance(handle, str) else None
            if item is not None:
                self._items.move_to_end(handle)
        if item is None:
            raise InputError(name, f"{name} handle {str(handle)[:40]!r} is not held by this server (it keeps the "
                                   f"last {self.limit}); run the node that made it again")
        return item


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Engine:
    """One loaded model served to many clients, one run at a time, a bounded number waiting."""

    def __init__(self, dm, model_id: str, max_queue: int = 8):
        self.dm, self.model_id, self.max_queue = dm, model_id, max_queue
        self.backend = backend_of(dm)
        self.contexts = Handles("ctx", 32)
        self.resumes = Handles("state", 8)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dgemma-run")
        self.jobs = 0  # running + waiting
        self.started = 0  # runs and encodes admitted since the server started
        self.warmed = 0  # common constraints compiled (or read) at start
        self._lock = threading.Lock()

    def admit(self) -> bool:
        """Take a place in the queue, or refuse when it is full."""
        with self._lock:
            if self.jobs > self.max_queue:
                return False
            self.jobs += 1
            self.started += 1
            return True

    def release(self) -> None:
        with self._lock:
            self.jobs -= 1

    def info(self) -> dict:
        """The model card's engine facts: the model by its name only, never the server's checkpoint path."""
        dm = self.dm
        return {"canvas_length": dm.canvas_length, "max_positions": dm.max_positions, "vocab_size": dm.vocab_size,
                "vision": dm.image_processor is not None, "tokenizer_fingerprint": dm.tokenizer_fingerprint,
                "protocol": 1, **dm.describe(), "model_source": self.model_id}

    def frame_chunk(self, head: dict, steps: int):
        """on_frame(index, frame) of a job: the step of choice `index` as a diffusion_frame chunk (the shim's
        fields, plus the trace's)."""
        strings = self.dm.token_strings

        def chunk(index: int, frame) -> bytes:
            text = "".join(strings[i] for i in frame.ids.tolist())
            return sse({**head, "choices": [{"index": index, "delta": {}, "finish_reason": None}],
                        "type": FRAME, "block": frame.block, "step": frame.step, "total": steps,
                        "text": text, EXTENSION: step_json(frame)})
        return chunk

    def render(self, job) -> list[int] | None:
        """A conversation's ids through the model's template (None for one user turn); refusals before any run."""
        if job.chat is None:
            return None
        return chat_ids(self.dm, job.chat, job.knobs.thinking, with_bos=job.options.get("context") is None)

    def run(self, job, ids, on_frame, should_cancel, on_compile=None) -> tuple[list, list[dict], float, int]:
        """Run a job's choices as one batch on the worker thread, `ids` its rendered conversation (or None):
        (RunResults, their result_json, wall seconds, prompt tokens). `on_compile()` is called first when the
        job's constraint is not compiled yet, so a stream can say why its first step is late."""
        start = time.perf_counter()
        if on_compile is not None and needs_compile(self.dm, job.options.get("constraint")):
            on_compile()
        options, prompt, held = dict(job.options), job.prompt, 0
        if ids is not None:
            onto = options.get("context")
            context = encode_chat(self.dm, ids, options.pop("image", None), onto, should_cancel)
            options["context"], prompt = context, ""
            held = context.length - (onto.length if onto is not None else 0)
        knobs = [dataclasses.replace(job.knobs, seed=job.knobs.seed + i) for i in range(job.n)]
        requests = checked(job.constraint_field or "constraint", lambda: [
            prepare(self.dm, prompt, k, logprobs=job.logprobs, **options) for k in knobs])
        results = run_batch(requests, on_frame=on_frame, should_cancel=should_cancel)
        wall = time.perf_counter() - start
        return results, [self._meta(r) for r in results], wall, held + len(requests[0].turn)

    def warm(self, constraints) -> threading.Thread:
        """Compile the common constraints in the background (each made by a callable: making one writes its
        regex), or read them from the disk cache, so the first request that asks for one finds it compiled."""
        def compile_all():
            for make in constraints:
                try:
                    automaton(self.dm, compiled_for(make()))
                except (InputError, RuntimeError, OSError) as err:  # a request for it will say why
                    print(f"could not compile a common constraint at start: {err}", file=sys.stderr)
                self.warmed += 1

        thread = threading.Thread(target=compile_all, name="dgemma-warm", daemon=True)
        thread.start()
        return thread

    def _meta(self, result) -> dict:
        """A result's result_json, its resume and context kept under new handles."""
        resume = result.state.resume
        handle = self.resumes.put(resume) if resume is not None else None
        context = None
        if result.context is not None:
            context = {"handle": self.contexts.put(result.context), "length": result.context.length,
                       "summary": result.context.summary()}
        return result_json(result, handle, context)

    def encode(self, text, onto, image, should_cancel) -> dict:
        cache = self.backend.encode(self.dm, text, onto=onto, should_cancel=should_cancel, image=image)
        return {"handle": self.contexts.put(cache), "length": cache.length, "summary": cache.summary()}


def timings(state, canvas: int, wall: float) -> dict:
    """The llama.cpp-style timings block with the diffusion_* fields of the Unsloth shim."""
    ms = wall * 1000.0
    rate = lambda n: n / wall if wall > 0 else 0.0
    return {"predicted_n": state.answer_tokens, "predicted_ms": ms, "diffusion": True,
            STEPS_RUN: state.steps_used, BLOCKS_RUN: state.blocks, CANVAS_RUN: canvas,
            "diffusion_wall_ms": ms, "diffusion_effective_tok_s": rate(canvas * state.blocks),
            "diffusion_parallel_tok_s": rate(canvas * state.steps_used),
            "diffusion_output_tok_s": rate(state.answer_tokens)}
