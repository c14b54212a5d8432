"""A conversation through the model's own chat template: a system message, earlier turns, the last turn.

Each message's text is rendered as a private-use slot and tokenized into it as literal text, as
`tokens.prompt_ids` does for one turn, so only the template adds control tokens. A message the
template leaves out (it cannot express it) is refused by its index and role. The ids end with the
generation prompt: encoded as a KV context (`context.encode_chat`), the answer follows them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from .tokens import literal_ids, render_chat

FIRST_SLOT = 0xE001  # private-use characters no chat template emits; tokens._SLOT is U+E000


@dataclass(frozen=True)
class Message:
    """One message as the template takes it: its role, its text and how many images lead it."""

    role: str
    text: str
    images: int = 0


def _content(message: Message, slot: str):
    if not message.images:
        return f" {slot} "
    return [{"type": "image"}] * message.images + [{"type": "text", "text": f" {slot} "}]


def rendered(dm, messages, thinking: bool) -> tuple[str, list[str]]:
    """The template's text with one slot per message, and the slots."""
    from jinja2.exceptions import TemplateError

    slots = [chr(FIRST_SLOT + i) for i in range(len(messages))]
    chat = [{"role": m.role, "content": _content(m, s)} for m, s in zip(messages, slots)]
    try:
        text = render_chat(dm.tokenizer, dm.processor, chat, thinking, dm.source)
    except TemplateError as err:
        raise InputError("messages", f"the model's chat template refused the conversation: {str(err)[:200]}") \
            from None
    for i, (m, slot) in enumerate(zip(messages, slots)):
        if text.count(slot) != 1:
            raise InputError("messages", f"messages[{i}] (role {m.role!r}) is not in what the model's chat "
                                         f"template writes: it cannot express it here; leave it out")
    if [text.index(s) for s in slots] != sorted(text.index(s) for s in slots):
        raise InputError("messages", "the model's chat template reorders the messages; send them in the order "
                                     "it writes them")
    return text, slots


def chat_ids(dm, messages, thinking: bool, with_bos: bool = True) -> list[int]:
    """The conversation's ids, ending with the generation prompt (image placeholders not expanded)."""
    text, slots = rendered(dm, messages, thinking)
    tok, ids, rest = dm.tokenizer, [], text
    for message, slot in zip(messages, slots):
        padded = f" {slot} " in rest
        before, rest = rest.split(f" {slot} " if padded else slot)
        ids += tok.encode(before, add_special_tokens=False)
        ids += literal_ids(tok, message.text if padded else message.text.strip())
    ids += tok.encode(rest, add_special_tokens=False)
    if not with_bos and ids and ids[0] == tok.bos_token_id:
        ids = ids[1:]
    return ids
