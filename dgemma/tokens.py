"""Per-id display strings and the chat rendering of prompts and raw context."""

from __future__ import annotations

import re

_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
REPLACEMENT = "\ufffd"


def _display(piece: str | None) -> str:
    if piece is None:
        return REPLACEMENT
    byte = _BYTE.match(piece)
    if byte:
        # A lone byte of a multi-byte character cannot be shown by itself.
        value = int(byte.group(1), 16)
        return chr(value) if 0x20 <= value < 0x7F or value == 0x0A else REPLACEMENT
    return piece.replace("▁", " ")


def display_strings(tokenizer, vocab_size: int) -> tuple[str, ...]:
    """What each id shows as on a canvas: specials as their token text, the rest as text."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    pieces += [None] * (vocab_size - len(pieces))
    return tuple(_display(p) for p in pieces)


def frame_texts(trace, token_strings) -> list[str]:
    """One raw string per step: the canvas joined from per-id strings, no decoding per frame."""
    return ["".join(token_strings[i] for i in row) for row in trace.ids.tolist()]


def _renderer(tokenizer, processor):
    # The real checkpoint's template may live on the processor; tiny ones keep it on the tokenizer.
    return processor if getattr(processor, "chat_template", None) else tokenizer


def prompt_ids(dm, prompt: str, thinking: bool, with_bos: bool = True) -> list[int]:
    """The chat-templated user turn plus generation prompt, through the model's own template."""
    encoded = _renderer(dm.tokenizer, dm.processor).apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True,
        return_dict=True, enable_thinking=thinking)
    ids = encoded["input_ids"]
    ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
    bos = dm.tokenizer.bos_token_id
    if not with_bos and ids and ids[0] == bos:
        ids = ids[1:]
    return ids


def context_ids(dm, text: str) -> list[int]:
    """Raw context with no chat framing; it opens the sequence, so it carries the only BOS."""
    return [dm.tokenizer.bos_token_id] + list(dm.tokenizer.encode(text, add_special_tokens=False))
