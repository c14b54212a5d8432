"""POST /v1/dgemma/decide: each option's probability as the answer (dgemma/denoising/decide.py), as JSON.

Body: {"prompt": str, "options": [str, ...], "samples": int, "knobs": {seed, num_inference_steps, t_min,
t_max, entropy_bound, confidence}, "context": handle, "image": {"shape", "data"} or a data: URL, "trace":
bool, "stream": bool}. The answer is the decision's own JSON (what the MCP tool and the node give for the
same seed) and the run id of the answer block's run. With "stream" it comes as server-sent events: one
`dgemma.decide.progress` per chunk of the draws' reads and per step of the answer block (`done`, `total`,
and the step's frame as the chat stream sends it), then the decision (`dgemma.decide`), then [DONE].
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dgemma.denoising.decide import KNOB_NAMES
from ..dgemma.errors import InputError
from ..dgemma.inputs.knobs import Knobs
from .messages import MAX_PROMPT_CHARS
from .requests import image_tensor, url_images

FIELDS = ("prompt", "options", "samples", "knobs", "context", "image", "trace", "stream")


@dataclass(frozen=True)
class DecideJob:
    prompt: str
    options: list
    samples: int
    knobs: Knobs
    context: object = None
    image: object = None
    trace: bool = True
    stream: bool = False


def _need(cond: bool, name: str, message: str) -> None:
    if not cond:
        raise InputError(name, message)


def job_of(body, contexts) -> DecideJob:
    """The decision a request asks for; every field checked, nothing run."""
    _need(isinstance(body, dict), "body", f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    _need(not unknown, unknown[0] if unknown else "body", f"{str(unknown[0])[:40]!r} is not a field of a decide "
                                                          f"request; its fields are {', '.join(FIELDS)}"
          if unknown else "")
    prompt = body.get("prompt", "")
    _need(isinstance(prompt, str) and len(prompt) <= MAX_PROMPT_CHARS, "prompt",
          f"prompt must be text of at most {MAX_PROMPT_CHARS} characters")
    knobs = body.get("knobs") or {}
    _need(isinstance(knobs, dict), "knobs", "knobs must be an object")
    extra = sorted(set(knobs) - set(KNOB_NAMES))
    _need(not extra, "knobs", f"{str(extra[0])[:40]!r} is not a knob of decide; it takes {', '.join(KNOB_NAMES)} "
                              "(the answer slot is one canvas, thinking off)" if extra else "")
    trace = body.get("trace", True)
    _need(isinstance(trace, bool), "trace", f"trace must be true or false, got {trace!r}")
    stream = body.get("stream", False)
    _need(isinstance(stream, bool), "stream", f"stream must be true or false, got {stream!r}")
    image = body.get("image")
    if isinstance(image, str):
        image = url_images([{"url": image}])
    elif image is not None:
        image = image_tensor(image)
    context = contexts.get("context", body["context"]) if body.get("context") is not None else None
    return DecideJob(prompt, body.get("options"), body.get("samples", 8), Knobs(**knobs), context, image, trace,
                     stream)
