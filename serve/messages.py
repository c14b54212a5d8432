"""OpenAI `messages` into what the engine runs: one user turn (text and pictures), or a conversation.

One user message is the run's turn, as a Sampler's prompt. Anything more (a system message,
earlier turns) is a conversation: rendered whole through the model's chat template
(`dgemma.inputs.chat`), encoded as a KV context, and answered after it. Roles the template has no place
for (tool results) and message fields it cannot express (a participant's `name`) are refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dgemma.errors import InputError
from ..dgemma.inputs.chat import Message
from ..dgemma.inputs.vision import MAX_IMAGES

MAX_MESSAGES = 64
MAX_PROMPT_CHARS = 200_000  # the engine refuses a turn over its token limit; this bounds the text first
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# Fields of a message that only pass when empty: what the template cannot write down.
EMPTY_ONLY = {"name": "the chat template has no place for a participant's name",
              "tool_calls": "tool calling is not implemented", "function_call": "function calling is not implemented",
              "audio": "audio is not implemented", "refusal": "a refusal is not a turn the template can write",
              "annotations": "annotations are not part of a turn", "tool_call_id": "tool calling is not implemented"}
IGNORED = ("reasoning_content",)  # an earlier turn's thought: the template leaves it out anyway


@dataclass(frozen=True)
class Turns:
    """The request's messages: `prompt` and `images` (image_url parts, in order); `chat` holds the
    whole conversation when it is more than one user message."""

    prompt: str
    images: list
    chat: tuple[Message, ...] | None = None


def _need(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise InputError(name, msg)


def _text_of(content, where: str) -> tuple[str, list]:
    """(text, image parts) of a message's content: a string, or OpenAI content parts."""
    if isinstance(content, str):
        return content, []
    _need(isinstance(content, list), "messages", f"{where}.content must be text or a list of parts, got "
                                                 f"{type(content).__name__}")
    texts, images = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        _need(kind in ("text", "image_url"), "messages", f"{where}: content parts must be text or image_url, got "
                                                         f"{str(kind)[:40]!r}")
        if kind == "text":
            _need(isinstance(part.get("text"), str), "messages", f"{where}: a text part needs a string 'text'")
            texts.append(part["text"])
        else:
            images.append(part.get("image_url"))
    return "".join(texts), images


def _message(message, i: int) -> tuple[Message, list]:
    where = f"messages[{i}]"
    _need(isinstance(message, dict), "messages", f"{where} must be an object with a role and content")
    role = message.get("role")
    _need(role not in ("tool", "function"), "messages", f"{where} has role {role!r}: tool results need tool "
                                                        "calling, which is not implemented")
    _need(role in ROLES, "messages", f"{where}.role must be system, developer, user or assistant, got "
                                     f"{str(role)[:40]!r}")
    for key, value in message.items():
        if key in ("role", "content") or key in IGNORED:
            continue
        _need(key in EMPTY_ONLY, "messages", f"{where} has an unknown field {str(key)[:40]!r}")
        _need(value in (None, [], ""), "messages", f"{where}.{key} is not supported here: {EMPTY_ONLY[key]}")
    _need(message.get("content") is not None, "messages", f"{where} has no content")
    text, images = _text_of(message["content"], where)
    _need(not images or role == "user", "image", f"{where}: only user messages may hold pictures")
    return Message(ROLES[role], text, len(images)), images


def turns_of(body: dict) -> Turns:
    """The request's messages, checked; nothing rendered yet (that needs the model's template)."""
    messages = body.get("messages")
    _need(isinstance(messages, list) and 0 < len(messages) <= MAX_MESSAGES, "messages",
          f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    read = [_message(m, i) for i, m in enumerate(messages)]
    chars = sum(len(m.text) for m, _ in read)
    _need(chars <= MAX_PROMPT_CHARS, "messages", f"the messages hold {chars} characters, over the limit of "
                                                 f"{MAX_PROMPT_CHARS}; shorten them")
    images = [part for _, parts in read for part in parts]
    _need(len(images) <= MAX_IMAGES, "image", f"{len(images)} images in one request, over the limit of {MAX_IMAGES}")
    # A trailing assistant message (a prefill to continue) would be answered as a new turn, empty: refused.
    _need(read[-1][0].role != "assistant", "messages", f"messages[{len(read) - 1}] is an assistant message at the "
                                                       "end; continuing an assistant's text is not supported: end "
                                                       "with the user's turn (to fix the answer's start, use "
                                                       "dgemma.advanced.pins)")
    if len(read) == 1:
        return Turns(read[0][0].text, images)
    return Turns(read[-1][0].text, images, tuple(m for m, _ in read))
