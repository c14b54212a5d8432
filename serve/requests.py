"""An OpenAI chat request into the engine's run: messages, knobs, constraint, choices, advanced options,
context, image.

A strict OpenAI client sends OpenAI's fields and gets the defaults for the rest; this pack's client
sends every knob in the `dgemma` object. Every field is checked for its exact JSON type (no "false"
taken as true, no 1.5 as a seed), and a field the server does not implement is refused by name
(serve/fields.py); refusals are InputErrors naming the field, raised before any model work.
"""

from __future__ import annotations

import base64
import binascii
import math
import reprlib
from dataclasses import dataclass, field

import numpy as np

from ..dgemma.denoising.resume import AUTO, WINDOW_KNOBS, Advanced
from ..dgemma.errors import InputError
from ..dgemma.inputs.knobs import KNOBS, SEED_MAX, knobs_from
from ..dgemma.inputs.pictures import MAX_PIXELS, read_picture
from ..dgemma.readouts.logprobs import MAX_TOP
from ..dgemma.readouts.wire import EXTENSION
from ..dgemma.steps.schedulers import Scheduling
from .fields import unsupported
from .messages import turns_of
from .structured import constraint_of

MAX_IMAGE_VALUES = 4 * 4096 * 4096
MAX_N = 16         # choices per request, denoised as one batch
MAX_STOPS, MAX_STOP_CHARS = 4, 200
EXTENSION_FIELDS = ("knobs", "advance_context", "context", "image", "advanced", "constraint")
ADVANCED_FIELDS = ("scheduler", "start_step", "end_step", "pins", "resume")
CONTEXT_FIELDS = ("text", "onto", "image")
_REPR = reprlib.Repr()  # bounded: a client's huge or deep value shows as its first few items
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 40, 40


class UnknownModel(InputError):
    """The request names a model this server does not serve (OpenAI's 404 model_not_found)."""


@dataclass
class Job:
    """What one request asks the engine to run: `n` choices, seeds knobs.seed, seed+1, ..."""

    prompt: str
    knobs: object
    options: dict = field(default_factory=dict)  # context, image, advanced, advance_context, constraint
    stream: bool = False
    n: int = 1
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives per answer token, when log-probabilities were asked for
    chat: tuple | None = None    # the conversation (dgemma.inputs.chat.Message), when more than one user turn
    constraint_field: str | None = None  # the request field the constraint came from
    warnings: list = field(default_factory=list)  # fields ignored under --lenient


def show(value) -> str:
    """A short, bounded rendering of a client's value for an error message."""
    return f"{_REPR.repr(value)} ({type(value).__name__})"


def _need(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise InputError(name, msg)


def typed(obj: dict, key: str, kind, what: str, name: str | None = None):
    """obj[key] when it has exactly JSON type `kind` (a bool is no integer), None when absent or null."""
    value, name = obj.get(key), name or key
    if value is None:
        return None
    _need(isinstance(value, kind) and not (kind is int and isinstance(value, bool)), name,
          f"{name} must be {what}, got {show(value)}")
    return value


def only(obj: dict, allowed: tuple, name: str) -> None:
    unknown = sorted(k for k in obj if k not in allowed)
    _need(not unknown, name, f"{name} has an unknown field {show(unknown[0]) if unknown else ''}; its fields are "
                             f"{', '.join(allowed)}")


def _base64(data: str, name: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(name, f"{name} data is not valid base64; send the bytes base64-encoded") from None


def image_tensor(spec):
    """A float32 [B, H, W, C] tensor from {"shape", "data": base64 of little-endian float32}."""
    import torch

    _need(isinstance(spec, dict) and isinstance(spec.get("shape"), list) and isinstance(spec.get("data"), str),
          "image", "image must be {'shape': [B, H, W, C], 'data': base64 float32}")
    shape = spec["shape"]
    _need(len(shape) == 4 and all(type(n) is int and n > 0 for n in shape), "image",
          f"image shape must be four positive integers, got {show(shape)}")
    values = math.prod(shape)  # exact: no wrap-around for a hostile shape
    _need(values <= MAX_IMAGE_VALUES, "image", f"image shape {show(shape)} is over {MAX_IMAGE_VALUES} values")
    _need(len(spec["data"]) <= 4 * math.ceil(4 * values / 3) + 4, "image", f"image data is longer than shape "
                                                                          f"{shape} needs")
    raw = _base64(spec["data"], "image")
    _need(len(raw) == 4 * values, "image", f"image data is {len(raw)} bytes; shape {shape} needs {4 * values}")
    return torch.from_numpy(np.frombuffer(raw, "<f4").astype(np.float32).reshape(shape))


def url_images(parts: list):
    """OpenAI image_url parts (data: URLs of PNG/JPEG) as one batch; remote URLs are not fetched.

    Each picture's size is read from its header and the pixels of the whole turn share one budget.
    """
    import torch

    arrays, budget = [], MAX_PIXELS
    for part in parts:
        url = part.get("url") if isinstance(part, dict) else None
        _need(isinstance(url, str) and url.startswith("data:image/") and ";base64," in url, "image",
              "image_url must be a data: URL (data:image/png;base64,...); the server fetches nothing")
        pixels = read_picture(_base64(url.split(";base64,", 1)[1], "image"), "image", budget)
        budget -= pixels.shape[0] * pixels.shape[1]
        arrays.append(pixels)
    _need(len({a.shape for a in arrays}) == 1, "image", "images of one turn must share a size")
    return torch.from_numpy(np.stack(arrays))


def knobs_of(body: dict, ext: dict):
    """Knobs: the dgemma object's, else the OpenAI fields a strict client may send, else defaults."""
    values = dict(typed(ext, "knobs", dict, "an object of knob names and values", "knobs") or {})
    seed = typed(body, "seed", int, "an integer")
    if "seed" not in values and seed is not None:
        values["seed"] = seed
    for name in ("max_completion_tokens", "max_tokens"):
        tokens, spec = typed(body, name, int, "an integer"), KNOBS["gen_length"]
        _need(tokens is None or spec.lo <= tokens <= spec.hi, name, f"{name} must be from {spec.lo} to {spec.hi}, "
                                                                    f"got {show(tokens)}")
        if "gen_length" not in values and tokens is not None:
            values["gen_length"] = tokens
    kwargs = typed(body, "chat_template_kwargs", dict, "an object") or {}
    only(kwargs, ("enable_thinking",), "chat_template_kwargs")
    thinking = typed(kwargs, "enable_thinking", bool, "true or false", "chat_template_kwargs")
    if "thinking" not in values and thinking is not None:
        values["thinking"] = thinking
    return knobs_from(values)


def advanced_of(spec, resumes) -> Advanced:
    _need(isinstance(spec, dict), "advanced", f"advanced must be an object, got {show(spec)}")
    only(spec, ADVANCED_FIELDS, "advanced")
    sched = typed(spec, "scheduler", dict, "an object with a name and its knobs") or {}
    typed(sched, "name", str, "a scheduler name", "scheduler")
    try:
        scheduling = Scheduling(**sched)
    except TypeError as err:
        raise InputError("scheduler", f"scheduler has an unknown field ({err})") from None
    start, end = (typed(spec, name, int, "an integer") for name in ("start_step", "end_step"))
    pins = typed(spec, "pins", str, "text") or ""
    handle = typed(spec, "resume", str, "a canvas_state handle (text)")
    resume = resumes.get("canvas_state", handle) if handle is not None else None
    return Advanced(scheduling, AUTO if start is None else start, WINDOW_KNOBS["end_step"].default if end is None
                    else end, pins, resume)


def check_model(body: dict, served: str) -> None:
    """An absent model means the served one; any other name is OpenAI's model_not_found."""
    asked = typed(body, "model", str, "text (the served model's id)")
    if asked is not None and asked != served:
        raise UnknownModel("model", f"model {show(asked)} is not served here; this server serves {served!r}")


def job_of(body, contexts, resumes, served: str, lenient: bool = False) -> Job:
    """The run a chat request asks for; every field checked, nothing run."""
    _need(isinstance(body, dict), "body", f"the body must be a JSON object, got {type(body).__name__}")
    check_model(body, served)
    warnings = unsupported(body, lenient)
    stream = typed(body, "stream", bool, "true or false") or False
    ext = typed(body, EXTENSION, dict, "an object") or {}
    only(ext, EXTENSION_FIELDS, EXTENSION)
    turns = turns_of(body)
    options = {"advance_context": typed(ext, "advance_context", bool, "true or false") or False}
    context = typed(ext, "context", str, "a context handle (text)")
    if context is not None:
        options["context"] = contexts.get("context", context)
    parts = turns.images
    _need(ext.get("image") is None or not parts, "image", "send the image once: either dgemma.image or "
                                                          "image_url parts, not both")
    _need(ext.get("image") is None or turns.chat is None, "image", "with more than one message, send pictures as "
                                                                   "image_url parts of a user message")
    if ext.get("image") is not None:
        options["image"] = image_tensor(ext["image"])
    elif parts:
        options["image"] = url_images(parts)
    if ext.get("advanced") is not None:
        options["advanced"] = advanced_of(ext["advanced"], resumes)
    constraint, source = constraint_of(body, ext)
    if constraint is not None:
        options["constraint"] = constraint
    knobs = knobs_of(body, ext)
    n = choices_of(body, knobs, options)
    return Job(turns.prompt, knobs, options, stream, n, stops_of(body), logprobs_of(body), turns.chat, source,
               warnings)


def choices_of(body: dict, knobs, options: dict) -> int:
    n = typed(body, "n", int, "an integer")
    n = 1 if n is None else n
    _need(1 <= n <= MAX_N, "n", f"n must be from 1 to {MAX_N} (choices are denoised as one batch), got {show(n)}")
    _need(knobs.seed + n - 1 <= SEED_MAX, "n", f"choice i runs with seed + i, and seed {knobs.seed} + {n - 1} is "
                                               f"over {SEED_MAX}; lower the seed or n")
    advanced = options.get("advanced")
    _need(n == 1 or advanced is None or advanced.resume is None, "n", "a resumed run continues one canvas: send "
                                                                      "n 1 with dgemma.advanced.resume")
    return n


def stops_of(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    _need(isinstance(stops, list) and len(stops) <= MAX_STOPS, "stop", f"stop must be a string or a list of at "
                                                                       f"most {MAX_STOPS} strings, got {show(stop)}")
    for text in stops:
        _need(isinstance(text, str) and 0 < len(text) <= MAX_STOP_CHARS, "stop",
              f"each stop must be a string of 1 to {MAX_STOP_CHARS} characters, got {show(text)}")
    return tuple(stops)


def logprobs_of(body: dict) -> int | None:
    """None, or how many alternatives (top_logprobs) each answer token lists with its log-probability."""
    asked = typed(body, "logprobs", bool, "true or false") or False
    top = typed(body, "top_logprobs", int, "an integer")
    _need(top is None or 0 <= top <= MAX_TOP, "top_logprobs", f"top_logprobs must be from 0 to {MAX_TOP}, got "
                                                              f"{show(top)}")
    _need(top is None or asked, "top_logprobs", "top_logprobs needs logprobs: true")
    return (top or 0) if asked else None


def context_of(body, contexts) -> tuple[str, object, object]:
    """(text, the context to continue or None, image or None) of a contexts request."""
    _need(isinstance(body, dict), "body", f"the body must be a JSON object, got {type(body).__name__}")
    only(body, CONTEXT_FIELDS, "body")
    text = typed(body, "text", str, "text") or ""
    onto = typed(body, "onto", str, "a context handle (text)")
    image = image_tensor(body["image"]) if body.get("image") is not None else None
    return text, contexts.get("context", onto) if onto is not None else None, image
