"""An OpenAI chat request into the engine's run: prompt, knobs, advanced options, context, image.

A strict OpenAI client sends only `messages` (and maybe `seed`, `max_tokens`) and gets the
defaults; this pack's client sends every knob in the `dgemma` object. Refusals are InputErrors
naming the field, raised before any model work.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field

import numpy as np

from ..dgemma.errors import InputError
from ..dgemma.knobs import knobs_from
from ..dgemma.resume import AUTO, Advanced
from ..dgemma.schedulers import Scheduling

MAX_MESSAGES = 64
MAX_PROMPT_CHARS = 200_000  # the engine refuses a turn over its token limit; this bounds the text first
MAX_IMAGE_VALUES = 4 * 4096 * 4096


@dataclass
class Job:
    """What one request asks the engine to run."""

    prompt: str
    knobs: object
    options: dict = field(default_factory=dict)  # context, image, advanced, advance_context


def _need(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise InputError(name, msg)


def _text_of(content) -> tuple[str, list]:
    """(text, image parts) of a message's content: a string, or OpenAI content parts."""
    if isinstance(content, str):
        return content, []
    _need(isinstance(content, list), "messages", f"a message's content must be text or a list of parts, got "
                                                 f"{type(content).__name__}")
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        _need(kind in ("text", "image_url"), "messages", f"content parts must be text or image_url, got {kind!r}")
        if kind == "text":
            _need(isinstance(part.get("text"), str), "messages", "a text part needs a string 'text'")
            texts.append(part["text"])
        else:
            images.append(part.get("image_url"))
    return "".join(texts), images


def prompt_of(body: dict) -> tuple[str, list]:
    """The one user turn this engine runs; earlier turns belong in a KV context."""
    messages = body.get("messages")
    _need(isinstance(messages, list) and 0 < len(messages) <= MAX_MESSAGES, "messages",
          f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    _need(len(messages) == 1 and isinstance(messages[0], dict) and messages[0].get("role") == "user", "messages",
          "this server runs one user turn: send exactly one message with role 'user'; encode earlier turns "
          "or a system text as a KV context (POST /v1/dgemma/contexts)")
    text, images = _text_of(messages[0].get("content"))
    _need(len(text) <= MAX_PROMPT_CHARS, "messages", f"the prompt is {len(text)} characters, over the limit "
                                                     f"of {MAX_PROMPT_CHARS}; shorten it")
    return text, images


def image_tensor(spec):
    """A float32 [B, H, W, C] tensor from {"shape", "data": base64 of little-endian float32}."""
    import torch

    _need(isinstance(spec, dict) and isinstance(spec.get("shape"), list) and isinstance(spec.get("data"), str),
          "image", "image must be {'shape': [B, H, W, C], 'data': base64 float32}")
    shape = spec["shape"]
    _need(len(shape) == 4 and all(isinstance(n, int) and n > 0 for n in shape), "image",
          f"image shape must be four positive integers, got {shape}")
    _need(int(np.prod(shape)) <= MAX_IMAGE_VALUES, "image", f"image {shape} is over {MAX_IMAGE_VALUES} values")
    raw = base64.b64decode(spec["data"], validate=True)
    _need(len(raw) == 4 * int(np.prod(shape)), "image", f"image data is {len(raw)} bytes; shape {shape} needs "
                                                        f"{4 * int(np.prod(shape))}")
    return torch.from_numpy(np.frombuffer(raw, "<f4").astype(np.float32).reshape(shape))


def url_images(parts: list):
    """OpenAI image_url parts (data: URLs of PNG/JPEG) as one batch; remote URLs are not fetched."""
    import torch
    from PIL import Image

    arrays = []
    for part in parts:
        url = part.get("url") if isinstance(part, dict) else None
        _need(isinstance(url, str) and url.startswith("data:image/") and ";base64," in url, "image",
              "image_url must be a data: URL (data:image/png;base64,...); the server fetches nothing")
        picture = Image.open(io.BytesIO(base64.b64decode(url.split(";base64,", 1)[1]))).convert("RGB")
        arrays.append(np.asarray(picture, np.float32) / 255.0)
    _need(len({a.shape for a in arrays}) == 1, "image", "images of one turn must share a size")
    return torch.from_numpy(np.stack(arrays))


def knobs_of(body: dict, ext: dict):
    """Knobs: the dgemma object's, else the OpenAI fields a strict client may send, else defaults."""
    values = dict(ext.get("knobs") or {})
    if "seed" not in values and isinstance(body.get("seed"), int):
        values["seed"] = body["seed"]
    tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if "gen_length" not in values and tokens is not None:
        values["gen_length"] = tokens
    thinking = (body.get("chat_template_kwargs") or {}).get("enable_thinking")
    if "thinking" not in values and thinking is not None:
        values["thinking"] = thinking
    return knobs_from(values)


def advanced_of(spec, resumes) -> Advanced:
    _need(isinstance(spec, dict), "advanced", "advanced must be an object")
    sched = spec.get("scheduler") or {}
    _need(isinstance(sched, dict), "scheduler", "scheduler must be an object with a name and its knobs")
    try:
        scheduling = Scheduling(**sched)
    except TypeError as err:
        raise InputError("scheduler", f"scheduler has an unknown field ({err})") from None
    handle = spec.get("resume")
    resume = resumes.get("canvas_state", handle) if handle is not None else None
    return Advanced(scheduling, spec.get("start_step", AUTO), spec.get("end_step", 1024), spec.get("pins", ""), resume)


def job_of(body, contexts, resumes) -> Job:
    """The run a chat request asks for; every field checked, nothing run."""
    _need(isinstance(body, dict), "body", f"the body must be a JSON object, got {type(body).__name__}")
    ext = body.get("dgemma") or {}
    _need(isinstance(ext, dict), "dgemma", "dgemma must be an object")
    prompt, parts = prompt_of(body)
    options = {"advance_context": bool(ext.get("advance_context", False))}
    if ext.get("context") is not None:
        options["context"] = contexts.get("context", ext["context"])
    if ext.get("image") is not None:
        options["image"] = image_tensor(ext["image"])
    elif parts:
        options["image"] = url_images(parts)
    if ext.get("advanced") is not None:
        options["advanced"] = advanced_of(ext["advanced"], resumes)
    return Job(prompt, knobs_of(body, ext), options)
