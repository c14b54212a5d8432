"""The two text dialects: the Unsloth shim's `diffusion_frame` steps, and vLLM's one chunk per canvas.

Neither stream carries token ids, entropy, or the schedule's t and T; the shim's frames are
llama.cpp's argmax canvas as text (no committed mask), vLLM's one committed canvas each. Each
backend declares what its stream leaves unknown and which knobs reach the engine (a
`dgemma.readings.Readings` on the run's trace, state and config); the live view paints the text
each frame shows, cut into word pieces whose ids index the model's own table (remote/textstream.py).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import uuid

import numpy as np

from ..dgemma.denoising.run import RunResult, check_turn
from ..dgemma.errors import Cancelled, InputError
from ..dgemma.inputs.knobs import num_blocks
from ..dgemma.inputs.vision import check_image_tensor
from ..dgemma.payloads import CanvasState, RunConfig
from ..dgemma.readings import Readings
from ..dgemma.readouts.wire import CANVAS_RUN, EXTENSION, FRAME, MAX_LEN, STEPS_RUN, TIMINGS, VLLM_ARGS, VLLM_MAX_STEPS
from .access import summary
from .checked import Checked, RemoteBackend
from .http import Interrupted, RemoteError, RemoteRefusal
from .model import RemoteModel
from .pack import CHAT, refused
from .textstream import CANVAS_MAX, SHIM_BLOCK, STEPS_MAX, PieceTable, TextStream, whole

# The shim reports an engine failure or an overlong conversation inside an ordinary answer.
ERROR_MARKS = ("\n[engine error: ", "\n[This conversation needs")
DELIMITERS = ("<|channel>", "<channel|>")
SCHEDULE = ("num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence")
COMMON_UNKNOWN = {
    "ids": "the stream carries text, not token ids: ids here number word pieces of that text",
    "entropy": "the stream carries no entropy",
    "t": "the engine's schedule is not streamed", "T": "the engine's schedule is not streamed",
    "stop": "the stream does not say which positions the adaptive stop committed",
}


def text_model(url: str, card: dict, backend, canvas: int | None) -> RemoteModel:
    """A text-dialect model run by `backend`; `canvas` is the card's canvas size, None when the card gives none."""
    max_len = card.get(MAX_LEN)
    return RemoteModel(url=url, model_id=str(card.get("id", ""))[:200], dialect=backend.dialect, canvas_length=canvas,
                       max_positions=whole(max_len, MAX_LEN, 0, 10**8, url) if max_len else 0,
                       token_strings=PieceTable(), source=f"{url} ({str(card.get('id', ''))[:200]})",
                       quant="unknown", device="remote", dtype="unknown", vision=backend.sees_images,
                       backend=backend)


def image_parts(image) -> list:
    """An IMAGE batch as OpenAI image_url parts (PNG data URLs)."""
    from PIL import Image

    parts = []
    for picture in image.detach().to("cpu").float().clamp(0, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray((picture[..., :3] * 255).round().astype(np.uint8)).save(buf, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


class TextBackend(RemoteBackend):
    """What both text dialects share: the request, the refusals, and the result they can honestly give."""

    dialect = "text"
    sees_images = False        # the request may carry pictures
    committed = False          # a frame's text is a committed canvas (vLLM), or says nothing of it
    canvas = ""                # what a frame shows, for captions and legends
    unknown: dict = {}         # readings the stream never carries, and why
    sent: dict = {}            # knob -> how it goes on the wire
    not_sent: dict = {}        # knob -> why it is not the run's setting

    def __init__(self, remote):
        self.remote = remote

    @property
    def readings(self) -> Readings:
        """What the stream leaves unknown, declared before a run (the live view reads it)."""
        url = self.remote.url if self.remote is not None else "?"
        return Readings(f"{self.dialect} engine at {url}", {**COMMON_UNKNOWN, **self.unknown}, self.canvas,
                        dict(self.sent), dict(self.not_sent))

    def check_inputs(self, model, prompt, knobs, context=None, image=None, advanced=None) -> None:
        check_turn(prompt, knobs)
        if not prompt.strip():
            raise InputError("prompt", "prompt is empty; type a prompt")
        if context is not None:
            raise InputError("context", f"{model} speaks {self.dialect}, which has no KV contexts; leave kv_cache "
                                        "unwired, or serve the model with this pack's server (python -m serve)")
        if image is not None:
            check_image_tensor("image", image)
            if not model.vision:
                raise InputError("image", f"{model} takes no pictures (the shim sends llama.cpp text only); leave "
                                          "image unwired, or serve the model with vLLM or python -m serve")
        if advanced is not None:
            raise InputError("advanced", f"{model} speaks {self.dialect}: windows, pins and resuming need this "
                                         "pack's server (python -m serve); use DGemmaSampler")

    def encode(self, model, text, onto=None, should_cancel=None, image=None):
        raise InputError("model", f"{model} speaks {self.dialect}, which keeps no KV contexts; serve the model "
                                  "with this pack's server (python -m serve) to encode context")

    def body(self, model, prompt, knobs, image) -> dict:
        content = prompt if image is None else [*image_parts(image), {"type": "text", "text": prompt}]
        return {"model": model.model_id, "stream": True, "messages": [{"role": "user", "content": content}],
                "seed": knobs.seed, "max_tokens": knobs.gen_length,
                "chat_template_kwargs": {"enable_thinking": knobs.thinking}}

    def plan(self, model, knobs) -> tuple:
        """(blocks, steps per block) the live view announces; None where only the engine knows."""
        return (num_blocks(knobs.gen_length, model.canvas_length) if model.canvas_length else None), None

    def run(self, model, prompt, knobs, *, context=None, image=None, on_frame=None, should_cancel=None,
            advance_context=False, advanced=None) -> RunResult:
        return self.run_one(self.check(model, prompt, knobs, context, image, advanced), on_frame, should_cancel)

    def run_one(self, req: Checked, on_frame=None, should_cancel=None) -> RunResult:
        model, prompt, knobs = req.model, req.prompt, req.knobs
        stream = TextStream(model, knobs, on_frame, self.most_blocks(knobs), self.committed)
        try:
            for chunk in self.remote.stream(CHAT, self.body(model, prompt, knobs, req.options["image"]),
                                            should_cancel):
                self.agree(chunk)
                self.take(stream, chunk)
        except Interrupted:
            raise Cancelled(len(stream.frames)) from None
        except RemoteRefusal as err:
            raise refused(err) from None
        return self.result(model, prompt, knobs, stream)

    def most_blocks(self, knobs) -> int:
        raise NotImplementedError

    def agree(self, chunk) -> None:
        """A stream in another dialect than the card's would read as an empty answer: refused by name."""
        other = None
        if isinstance(chunk, dict) and EXTENSION in chunk:
            other = "this pack's (dgemma)"
        elif isinstance(chunk, dict) and chunk.get("type") == FRAME and self.dialect != FRAME:
            other = FRAME
        if other is not None:
            raise RemoteError(f"{self.remote.url}'s card says {self.dialect}, but its stream carries {other} frames; "
                              "the run is refused: the card and the stream must come from one engine (check what "
                              "serves that port, and load it again)")

    def take(self, stream: TextStream, chunk: dict) -> None:
        raise NotImplementedError

    def wire(self, knobs) -> dict:
        """The knobs under their wire names (the first word of `sent`): the trace's scheduler config."""
        return {how.split(" ")[0]: getattr(knobs, name) for name, how in self.sent.items()}

    def finish(self, stream: TextStream, trace) -> tuple[dict, dict, dict]:
        """(state values, unknown readings, the engine's numbers) this dialect can honestly give."""
        raise NotImplementedError

    def result(self, model, prompt, knobs, stream: TextStream) -> RunResult:
        recorder = stream.recorder({name: getattr(knobs, name) for name in self.sent})
        trace = recorder.finish(run_id=uuid.uuid4().hex, scheduler=(f"remote {self.dialect}", self.wire(knobs)))
        values, unknown, reported = self.finish(stream, trace)
        reported = {**reported, "usage": stream.usage, TIMINGS: stream.timings}
        stopped = reported.get("stopped_early") or [False] * trace.num_blocks  # else unknown, and said so
        trace = dataclasses.replace(trace, block_stopped_early=tuple(stopped))
        declared = self.readings
        readings = dataclasses.replace(declared, unknown={**declared.unknown, **unknown}, reported=reported,
                                       warnings=self.warnings(knobs, stream))
        text = "".join(stream.content).strip()
        trace = dataclasses.replace(trace, readings=readings)
        state = CanvasState(text=text, raw_ids=(), answer_ids=(), thought="".join(stream.reasoning) or None,
                            turn_closed=stream.finish == "stop", answer_tokens=None,
                            stray_thought_delimiter=any(d in text for d in DELIMITERS), blocks=trace.num_blocks,
                            run_id=trace.run_id, readings=readings, **values)
        config = RunConfig(prompt=prompt, knobs=knobs, **model.describe(), run_id=trace.run_id, readings=readings)
        return RunResult(text, state, trace, config, None)

    def warnings(self, knobs, stream) -> tuple:
        return ()


def _completion(stream) -> str:
    n = stream.usage.get("completion_tokens")
    return f"the engine's completion_tokens ({n}) counts the thought too" if n is not None else (
        "the engine does not count the answer's tokens")


class FramesBackend(TextBackend):
    """llama.cpp's visual server through the Unsloth shim: one `diffusion_frame` text per step."""

    dialect, committed, canvas = FRAME, False, "argmax canvas"
    unknown = {"committed": "llama.cpp sends each step's argmax canvas as text (special tokens dropped), with no "
                            "committed mask: a frame is not the working canvas"}
    sent = {"seed": "seed", "gen_length": f"max_tokens (the shim runs ceil(max_tokens / {SHIM_BLOCK}) blocks)"}
    not_sent = {**{name: "the shim does not forward it: the engine's GGUF fixes it" for name in SCHEDULE},
                "thinking": "sent as chat_template_kwargs.enable_thinking, but the shim drops it: llama.cpp's "
                            "template thinks by default"}

    def plan(self, model, knobs) -> tuple:
        return self.most_blocks(knobs), None

    def most_blocks(self, knobs) -> int:
        return num_blocks(knobs.gen_length, SHIM_BLOCK)

    def take(self, stream, chunk) -> None:
        if not isinstance(chunk, dict) or chunk.get("type") != FRAME:
            new = stream.take(chunk)
            if new.startswith(ERROR_MARKS):  # the shim's in-band error channel: never an answer
                raise RemoteError(f"the diffusion_frame engine at {self.remote.url} answered with an error: "
                                  f"{summary(new, self.remote.token)}")
            return
        total = whole(chunk.get("total"), "a frame's total", 1, STEPS_MAX, self.remote.url)
        if stream.budget is not None and total != stream.budget:
            raise RemoteError(f"{self.remote.url} changed a frame's total from {stream.budget} to {total}")
        stream.budget = total
        text = chunk.get("text", "")
        if not isinstance(text, str):
            raise RemoteError(f"{self.remote.url} sent a frame's text as {type(text).__name__}")
        block = whole(chunk.get("block", 0), "a frame's block", 0, stream.blocks_max - 1, self.remote.url)
        stream.frame(block, whole(chunk.get("step", 0), "a frame's step", 0, total - 1, self.remote.url), text)

    def finish(self, stream, trace):
        said = "".join(stream.content)
        if not stream.frames and not said and not stream.reasoning:  # llama.cpp wedged by an earlier refusal
            raise RemoteError(f"{self.remote.url}: the engine returned an empty run; if it follows a refused "
                              "request, restart the shim")
        if not stream.frames:
            raise RemoteError(f"{self.remote.url} sent a plain chat stream ({len(said)} characters of answer, no "
                              "diffusion_frame chunk): it is not a DiffusionGemma diffusion engine; serve the model "
                              "with Unsloth's shim, vLLM or this pack's server (python -m serve)")
        early = [n < stream.budget for n in trace.steps_per_block]  # one frame per step: the engine's counts
        unknown = {"answer_tokens": _completion(stream)}
        if not all(early):
            unknown["converged"] = "a block ran all its steps, and the engine sends no committed mask"
        steps = stream.timings.get(STEPS_RUN, len(trace))
        steps = whole(steps, f"{TIMINGS}.{STEPS_RUN}", 0, stream.blocks_max * stream.budget, self.remote.url)
        if steps != len(trace):  # frames were not one per step: per-block counts and stops are not known
            why = f"the engine ran {steps} steps but sent {len(trace)} frames"
            unknown.update(steps=why, stopped_early=why, converged=why)
        canvas = self._canvas(stream, trace, unknown)
        reported = {"steps_per_block": stream.budget, "stopped_early": early, "canvas_length": canvas}
        converged = True if all(early) and "converged" not in unknown else None
        values = {"converged": converged, "committed_fraction": None, "steps_used": steps}
        return values, unknown, reported

    def _canvas(self, stream, trace, unknown: dict) -> int | None:
        canvas = stream.model.canvas_length
        if stream.timings.get(CANVAS_RUN) is not None:
            canvas = whole(stream.timings[CANVAS_RUN], f"{TIMINGS}.{CANVAS_RUN}", 1, CANVAS_MAX,
                           self.remote.url)
        if canvas is None:
            unknown["canvas_length"] = (f"neither the card nor the stream gives it; frames are shown "
                                        f"{trace.canvas_length} word pieces wide, inferred from the frames (not a "
                                        "token count)")
        return canvas

    def warnings(self, knobs, stream) -> tuple:
        if knobs.thinking:
            return ()
        got = " (and the answer came with a thought)" if stream.reasoning else ""
        return (f"thinking off was asked, but the shim drops it: llama.cpp's template thinks by default{got}",)


class VllmBackend(TextBackend):
    """vLLM (and SGLang): one chunk per committed canvas; per-request knobs go in `vllm_xargs`."""

    dialect, committed, canvas, sees_images = "vllm", True, "canvas text", True
    unknown = {"stopped_early": "vLLM streams one chunk per committed canvas, not its steps",
               "steps": "vLLM streams one chunk per committed canvas, not its steps",
               "converged": "vLLM reports no steps or stops",
               "answer_tokens": "vLLM's completion_tokens counts the thought and whole canvases"}
    sent = {"seed": "seed", "gen_length": "max_tokens",
            "num_inference_steps": f"{VLLM_ARGS}.{VLLM_MAX_STEPS} (an upper bound)",
            "thinking": "chat_template_kwargs.enable_thinking"}
    not_sent = {name: "fixed at vLLM's launch (its generation_config.json)"
                for name in ("t_min", "t_max", "entropy_bound", "confidence")}

    def body(self, model, prompt, knobs, image) -> dict:
        return {**super().body(model, prompt, knobs, image),
                VLLM_ARGS: {VLLM_MAX_STEPS: knobs.num_inference_steps},
                "stream_options": {"include_usage": True}}

    def most_blocks(self, knobs) -> int:
        return 2 * max(knobs.gen_length, SHIM_BLOCK)  # a chunk per canvas; counted generously, as tokens

    def take(self, stream, chunk) -> None:
        new = stream.take(chunk)
        if new:
            stream.frame(len(stream.frames), 0, new)

    def finish(self, stream, trace):
        unknown = {} if stream.model.canvas_length else {
            "canvas_length": "vLLM's card gives no canvas size, and its chunks are text"}
        values = {"converged": None, "committed_fraction": 1.0 if len(trace) else None, "steps_used": None}
        return values, unknown, {"canvas_length": stream.model.canvas_length}
