"""The two text dialects: the Unsloth shim's `diffusion_frame` steps, and vLLM's one chunk per canvas.

Neither stream carries ids, committed masks or entropy. The live view paints the text each frame
shows (split into word pieces kept in the model's own append-only table); the trace says what it
cannot know: entropy is NaN, and the committed mask is all-false for shim steps (unknown) and
all-true for a vLLM canvas (vLLM sends a canvas once it is committed).
"""

from __future__ import annotations

import base64
import io
import re
import threading

import numpy as np

from ..dgemma.errors import InputError
from ..dgemma.loop import Cancelled
from ..dgemma.payloads import CanvasState, RunConfig
from ..dgemma.run import RunResult, check_turn
from ..dgemma.trace import Recorder
from ..dgemma.vision import check_image_tensor
from .http import Interrupted, RemoteError, RemoteRefusal
from .model import RemoteModel
from .pack import CHAT, refused

PIECE = re.compile(r"<\|?[a-z_]+\|?>|\s?[^\s<]{1,7}|\s|<")  # markup whole; words in pieces the view shows whole
VLLM_PER_REQUEST = {"num_inference_steps": "diffusion_max_steps"}  # the knobs vLLM takes per request (vllm_xargs)
FIXED_AT_LAUNCH = ("t_min", "t_max", "entropy_bound", "confidence")  # generation_config.json on the server


class PieceTable:
    """id -> display text for text-only streams; append-only, so an id once shown never changes."""

    def __init__(self):
        self._pieces, self._ids, self._lock = [""], {"": 0}, threading.Lock()

    def __getitem__(self, i):
        return self._pieces[i]

    def __len__(self) -> int:
        return len(self._pieces)

    def ids(self, text: str, length: int) -> np.ndarray:
        """`text` as `length` piece ids: word pieces in order, the overflow joined into the last."""
        pieces = PIECE.findall(text)
        if len(pieces) > length:
            pieces = pieces[:length - 1] + ["".join(pieces[length - 1:])]
        with self._lock:
            for p in pieces:
                if p not in self._ids:
                    self._ids[p] = len(self._pieces)
                    self._pieces.append(p)
            out = [self._ids[p] for p in pieces]
        return np.array(out + [0] * (length - len(out)), np.int32)


def text_model(url: str, card: dict, dialect: str, backend) -> RemoteModel:
    return RemoteModel(url=url, model_id=str(card.get("id", "")), dialect=dialect,
                       canvas_length=int(card.get("diffusion_canvas") or 256),
                       max_positions=int(card.get("max_model_len") or 0), token_strings=PieceTable(),
                       source=f"{url} ({card.get('id', '')})", quant="unknown", device="remote", dtype="unknown",
                       vision=True, backend=backend)


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


class TextStream:
    """Collects one text-dialect stream into rows, the answer, the thought and the server's numbers."""

    def __init__(self, model, knobs, on_frame):
        self.model, self.on_frame, self.last_block = model, on_frame, 0
        self.recorder = Recorder(knobs, model.canvas_length, model.token_strings)
        self.content, self.reasoning, self.finish, self.usage, self.timings = [], [], None, {}, {}

    def frame(self, block: int, step: int, text: str, committed: bool) -> None:
        import torch

        L, self.last_block = self.model.canvas_length, block
        ids = torch.from_numpy(self.model.token_strings.ids(text, L))[None]
        mask = torch.full((1, L), committed)
        frame = self.recorder.add(block, step, ids, mask, torch.zeros((1, L), dtype=torch.bool),
                                  torch.full((1, L), float("nan")))
        if self.on_frame is not None:
            self.on_frame(frame)

    def take(self, chunk: dict) -> str:
        """Record the chunk's deltas and numbers; returns the new content it carried."""
        if "error" in chunk:
            raise RemoteError(f"{self.model.url} stopped the run: {chunk['error']}")
        self.usage = chunk.get("usage") or self.usage
        self.timings = chunk.get("timings") or self.timings
        new = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            thought = delta.get("reasoning_content") or delta.get("reasoning")
            if thought:
                self.reasoning.append(thought)
            if delta.get("content"):
                new += delta["content"]
            self.finish = choice.get("finish_reason") or self.finish
        self.content.append(new)
        return new


class TextBackend:
    """What both text dialects share: the request, the refusals, and the result they can honestly give."""

    dialect = "text"

    def __init__(self, remote):
        self.remote = remote

    def check(self, model, prompt, knobs, context=None, image=None, advanced=None) -> None:
        check_turn(prompt, knobs)
        if not prompt.strip():
            raise InputError("prompt", "prompt is empty; type a prompt")
        if context is not None:
            raise InputError("context", f"{model} speaks {self.dialect}, which has no KV contexts; leave kv_cache "
                                        "unwired, or serve the model with this pack's server (python -m serve)")
        if image is not None:
            check_image_tensor("image", image)
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

    def run(self, model, prompt, knobs, *, context=None, image=None, on_frame=None, should_cancel=None,
            advance_context=False, advanced=None) -> RunResult:
        self.check(model, prompt, knobs, context, image, advanced)
        stream = TextStream(model, knobs, on_frame)
        try:
            for chunk in self.remote.stream(CHAT, self.body(model, prompt, knobs, image), should_cancel):
                self.take(stream, chunk)
        except Interrupted:
            raise Cancelled(len(stream.recorder)) from None
        except RemoteRefusal as err:
            raise refused(err) from None
        return self.result(model, prompt, knobs, stream)

    def take(self, stream: TextStream, chunk: dict) -> None:
        raise NotImplementedError

    def settings(self, knobs) -> dict:
        return {"dialect": self.dialect, "unknown": ["entropy", "token ids"]}

    def result(self, model, prompt, knobs, stream: TextStream) -> RunResult:
        rec = stream.recorder
        if not len(rec):  # a server that sent no frame at all: the answer is still one canvas of text
            stream.frame(0, 0, "".join(stream.content), True)
        for _ in range(stream.last_block + 1 - len(rec.stopped_early)):
            rec.end_block(False)
        trace = rec.finish(scheduler=(f"remote {self.dialect}", self.settings(knobs)))
        text = "".join(stream.content).strip()
        state = CanvasState(text=text, raw_ids=tuple(trace.ids[-1].tolist()), answer_ids=(),
                            thought="".join(stream.reasoning) or None, turn_closed=stream.finish == "stop",
                            answer_tokens=int(stream.usage.get("completion_tokens") or
                                              stream.timings.get("predicted_n") or 0),
                            stray_thought_delimiter=False, converged=False,
                            committed_fraction=float(trace.committed[-1].mean()), steps_used=len(trace),
                            blocks=trace.num_blocks, run_id=trace.run_id)
        config = RunConfig(prompt=prompt, knobs=knobs, **model.describe(), run_id=trace.run_id)
        return RunResult(text, state, trace, config, None)


class FramesBackend(TextBackend):
    """llama.cpp's visual server through the Unsloth shim: one `diffusion_frame` text per step."""

    dialect = "diffusion_frame"

    def take(self, stream, chunk) -> None:
        if chunk.get("type") == "diffusion_frame":
            stream.frame(int(chunk.get("block", 0)), int(chunk.get("step", 0)), str(chunk.get("text", "")), False)
        else:
            stream.take(chunk)

    def settings(self, knobs) -> dict:
        return {**super().settings(knobs), "unknown": ["entropy", "token ids", "committed mask"],
                "sent": {"seed": knobs.seed, "max_tokens": knobs.gen_length}}


class VllmBackend(TextBackend):
    """vLLM (and SGLang): one chunk per committed canvas; per-request knobs go in `vllm_xargs`."""

    dialect = "vllm"

    def body(self, model, prompt, knobs, image) -> dict:
        xargs = {wire: getattr(knobs, name) for name, wire in VLLM_PER_REQUEST.items()}
        return {**super().body(model, prompt, knobs, image), "vllm_xargs": xargs,
                "stream_options": {"include_usage": True}}

    def take(self, stream, chunk) -> None:
        new = stream.take(chunk)
        if new:
            blocks = len(stream.recorder)
            stream.frame(blocks, 0, new, True)
            stream.recorder.end_block(False)

    def settings(self, knobs) -> dict:
        return {**super().settings(knobs), "sent": {"seed": knobs.seed, "max_tokens": knobs.gen_length,
                                                    **{w: getattr(knobs, n) for n, w in VLLM_PER_REQUEST.items()}},
                "fixed_at_launch": {name: "the server's generation_config.json" for name in FIXED_AT_LAUNCH}}
