"""The full-fidelity dialect: this pack's own server, which streams every step as the trace stores it.

The client rebuilds the very Frames, CanvasTrace, CanvasState and RunConfig a local run of the
same checkpoint and seed gives; KV contexts and paused canvases stay on the server, by handle.
"""

from __future__ import annotations

import base64
import dataclasses

from ..dgemma.denoising.resume import WINDOW_KNOBS, Advanced, check_continues
from ..dgemma.denoising.run import RunResult, check_turn
from ..dgemma.errors import Cancelled, InputError
from ..dgemma.inputs.knobs import check_knob
from ..dgemma.inputs.tokens import check_text
from ..dgemma.inputs.vision import check_image_tensor
from ..dgemma.readouts.wire import EXTENSION, FRAME, WireError, obj, result_parts, row_frame, step_row
from ..dgemma.readouts.wire import text as text_field
from .access import summary
from .checked import Checked, RemoteBackend
from .http import Interrupted, RemoteError, RemoteRefusal
from .model import RemoteContext, RemoteResume
from .verify import Asked, check_echo, check_ids, check_step, made_context

CHAT = "/v1/chat/completions"


def image_json(image) -> dict:
    data = image.detach().to("cpu").float().numpy().astype("<f4")
    return {"shape": list(data.shape), "data": base64.b64encode(data.tobytes()).decode("ascii")}


def constraint_json(constraint) -> dict:
    """The body's constraint field (none for no constraint): the server compiles it as a local run would."""
    if constraint is None or not constraint.active:
        return {}
    return {"constraint": {"kind": constraint.kind, "text": constraint.text}}


def refused(err: RemoteRefusal) -> Exception:
    """A server's 400 naming a field is the engine's InputError; anything else stays a RemoteError."""
    return InputError(err.param, err.message) if err.status == 400 and err.param else err


class PackBackend(RemoteBackend):
    """Runs, encodes and checks on the pack's server at `remote`."""

    dialect = "pack"
    takes_constraints = True  # the server compiles the constraint and checks it before its first step

    def __init__(self, remote):
        self.remote = remote

    def check_inputs(self, model, prompt, knobs, context=None, image=None, advanced=None) -> None:
        """The checks that need no model; the server makes the rest before its first step."""
        check_turn(prompt, knobs)
        if context is not None and not (isinstance(context, RemoteContext) and context.model is model):
            raise InputError("context", "the KV context was not encoded on this remote model; encode it with a "
                                        "DGemmaEncode wired to the same remote loader")
        if image is not None:
            check_image_tensor("image", image)
            if not model.vision:
                raise InputError("image", f"{model} takes no images; leave image unwired")
        if context is None and image is None and not prompt.strip():
            raise InputError("prompt", "prompt is empty; type a prompt, or give an encoded KV context for a "
                                       "pure-injection run")
        if advanced is not None:
            self._check_advanced(model, prompt, context, advanced)

    def _check_advanced(self, model, prompt, context, advanced) -> None:
        if not isinstance(advanced, Advanced):
            raise InputError("advanced", f"advanced must be an Advanced, got {type(advanced).__name__}")
        for name in WINDOW_KNOBS:
            check_knob(name, getattr(advanced, name), WINDOW_KNOBS)
        resume = advanced.resume
        if resume is None:
            return
        if not isinstance(resume, RemoteResume):
            raise InputError("canvas_state", "canvas_state comes from a run on another model; wire the same model "
                                             "into both samplers")
        check_continues(resume, model, prompt, context)

    def body(self, model, prompt, knobs, context, image, advance_context, advanced, constraint=None) -> dict:
        ext = {"knobs": knobs.asdict(), "advance_context": advance_context, **constraint_json(constraint)}
        if context is not None:
            ext["context"] = context.handle
        if image is not None:
            ext["image"] = image_json(image)
        if advanced is not None:  # start_step goes as asked: auto (-1) is resolved by the server's own resume
            sched = advanced.scheduling
            ext["advanced"] = {"scheduler": {"name": sched.name, **dict(sched.settings)},
                               "start_step": advanced.start_step, "end_step": advanced.end_step, "pins": advanced.pins,
                               "resume": advanced.resume.handle if advanced.resume is not None else None}
        return {"model": model.model_id, "stream": True, "messages": [{"role": "user", "content": prompt}],
                EXTENSION: ext}

    def run_one(self, req: Checked, on_frame=None, should_cancel=None) -> RunResult:
        return self.run(req.model, req.prompt, req.knobs, on_frame=on_frame, should_cancel=should_cancel,
                        **req.options)

    def run(self, model, prompt, knobs, *, context=None, image=None, on_frame=None, should_cancel=None,
            advance_context=False, advanced=None, constraint=None) -> RunResult:
        """One run on the server; each streamed step reaches `on_frame` as the Frame a local run gives.
        Every step and the result are checked against the request (remote/verify.py) before use."""
        resume = advanced.resume if advanced is not None else None
        rows, final, L = list(resume.recorded.rows) if resume is not None else [], None, model.canvas_length
        asked = Asked(prompt, knobs, context, image is not None, advanced, advance_context, L, constraint)
        body = self.body(model, prompt, knobs, context, image, advance_context, advanced, constraint)
        new = 0
        try:
            for chunk in self.remote.stream(CHAT, body, should_cancel, asked.max_events):
                if not isinstance(chunk, dict):
                    raise WireError("event", "a JSON object", chunk)
                if "error" in chunk:
                    raise self._stopped(chunk["error"], new)
                if chunk.get("type") == FRAME:
                    rows.append(self._step(chunk, rows, asked, model))
                    new += 1
                    if on_frame is not None:
                        on_frame(row_frame(rows[-1], L))
                elif EXTENSION in chunk:
                    if final is not None:
                        raise WireError(EXTENSION, "one result per run", "a second one")
                    final = obj(chunk, EXTENSION)
            if final is None:
                raise RemoteError(f"{self.remote.url} ended the stream without the run's result (its card says "
                                  "this pack's server; if another engine now serves that port, load it again)")
            return self._result(model, asked, final, rows)
        except Interrupted:
            raise Cancelled(new) from None
        except RemoteRefusal as err:
            raise refused(err) from None
        except WireError as err:
            raise self.bad(err) from None

    def _step(self, chunk: dict, rows: list, asked: Asked, model):
        """One step chunk as a checked row; a frame without this pack's object is another engine's."""
        if EXTENSION not in chunk:
            raise self._other_dialect(FRAME)
        row = step_row(obj(chunk, EXTENSION), model.canvas_length, len(model.token_strings))
        check_step(row, rows[-1] if rows else None, asked)
        return row

    def _other_dialect(self, what: str) -> RemoteError:
        return RemoteError(f"{self.remote.url}'s card says {self.dialect} (this pack's server), but its stream "
                           f"carries {what} {EXTENSION} frames; the run is refused: the card and the stream must "
                           "come from one engine (check what serves that port, and load it again)")

    def bad(self, err: WireError) -> RemoteError:
        return RemoteError(self.remote.redact(f"{self.remote.url} sent a bad answer, refused: {err}"))

    def _stopped(self, err, steps: int) -> Exception:
        """The error a server ended its stream with: a field's refusal, or a failure after some steps."""
        message = summary(err.get("message") if isinstance(err, dict) else err, self.remote.token)
        param = err.get("param") if isinstance(err, dict) else None
        if isinstance(param, str) and 0 < len(param) <= 64:
            return InputError(param, message)
        return RemoteError(f"{self.remote.url} stopped the run after {steps} steps: {message}")

    def _result(self, model, asked: Asked, final, rows) -> RunResult:
        strings = model.token_strings
        state, trace, config, recorded = result_parts(final, rows, model.canvas_length, strings, len(strings))
        check_echo(config, state, asked)
        check_ids(state, rows, strings, asked.constraint, model.decoding)
        handle, made = text_field(final, "resume", 128, none=True), obj(final, "context", none=True)
        if handle is not None and asked.advanced is None:
            raise WireError("resume", "null for a run without a window", handle)
        if made is not None and not asked.advance_context:
            raise WireError("context", "null (advance_context was off)", made)
        if handle is not None:
            keep = RemoteResume(model, handle, asked.prompt, asked.context, recorded, state.paused)
            state = dataclasses.replace(state, resume=keep)
        new_context = made_context(model, made, model.max_positions) if made is not None else None
        return RunResult(state.text, state, trace, config, new_context)

    def encode(self, model, text, onto=None, should_cancel=None, image=None) -> RemoteContext:
        check_text("text", text)
        if onto is not None and not (isinstance(onto, RemoteContext) and onto.model is model):
            raise InputError("context", "the KV context to continue was not encoded on this remote model")
        body = {"text": text, "onto": onto.handle if onto is not None else None,
                "image": image_json(image) if image is not None else None}
        try:
            made = self.remote.call("POST", "/v1/dgemma/contexts", body, should_cancel=should_cancel)
            return made_context(model, made, model.max_positions)
        except Interrupted:
            raise Cancelled(0) from None
        except RemoteRefusal as err:
            raise refused(err) from None
        except WireError as err:
            raise self.bad(err) from None
