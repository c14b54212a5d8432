"""Per-id display strings and the chat rendering of prompts and raw context."""

from __future__ import annotations

import hashlib
import re
import threading
import weakref

import numpy as np

from ..errors import InputError

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


def decoding_table(tokenizer, vocab_size: int) -> dict:
    """What a client needs to read ids as `decode(skip_special_tokens=True)` reads them, beside the display
    strings: each byte-fallback token's byte, and the ids decoding skips."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    byte_ids = [[i, int(m.group(1), 16)] for i, p in enumerate(pieces) if p and (m := _BYTE.match(p))]
    return {"bytes": byte_ids, "skipped": sorted(i for i in tokenizer.all_special_ids if 0 <= i < vocab_size)}


def decoded_as_tokenizer(ids, strings, byte_of: dict, skipped: frozenset) -> str:
    """The text `ids` decode to, from display strings: skipped ids dropped, and each run of byte tokens joined
    as the byte-fallback decoder joins it (UTF-8, or one U+FFFD per byte when the run is not UTF-8)."""
    out, run = [], bytearray()

    def flush():
        if run:
            try:
                out.append(run.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(REPLACEMENT * len(run))
            run.clear()

    for i in ids:
        if i in skipped:
            continue
        if i in byte_of:
            run.append(byte_of[i])
            continue
        flush()
        out.append(strings[i])
    flush()
    return "".join(out).strip()


_TABLES: dict = {}  # (id of a strings tuple, transform) -> (the tuple, its table); a few models' worth


def string_table(token_strings, transform=None):
    """The per-id strings (each through `transform`) as a numpy object array, which an array of ids indexes in
    one call; made once per table. None for a table that is not a tuple (a remote text engine's pieces)."""
    if not isinstance(token_strings, tuple):
        return None
    key = (id(token_strings), transform)
    found = _TABLES.get(key)
    if found is None or found[0] is not token_strings:
        table = np.empty(len(token_strings), dtype=object)
        table[:] = token_strings if transform is None else [transform(s) for s in token_strings]
        if len(_TABLES) >= 8:
            _TABLES.clear()
        found = _TABLES[key] = (token_strings, table)
    return found[1]


def frame_texts(trace, token_strings) -> list[str]:
    """One raw string per step: the canvas joined from per-id strings, no decoding per frame."""
    table = string_table(token_strings)
    if table is None:
        return ["".join(map(token_strings.__getitem__, row)) for row in trace.ids.tolist()]
    return ["".join(row) for row in table[trace.ids].tolist()]


def _renderer(tokenizer, processor):
    # The real checkpoint's template may live on the processor; tiny ones keep it on the tokenizer.
    return processor if getattr(processor, "chat_template", None) else tokenizer


# A private-use character no chat template emits: marks where the user's text goes.
_SLOT = "\ue000"


def check_text(name: str, text) -> str:
    """Refuse text that is not a str or cannot be encoded as UTF-8 (lone surrogates)."""
    if not isinstance(text, str):
        raise InputError(name, f"{name} must be text, got {type(text).__name__}; give a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise InputError(name, f"{name} holds {text[err.start:err.end]!r} at character {err.start}, which is not "
                               "valid Unicode text (a lone surrogate); remove it or paste the text again") from None
    return text


# Per tokenizer: a private Rust tokenizer whose special-token switch is set once and never again.
_LITERAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LITERAL_LOCK = threading.Lock()


def _literal_backend(tokenizer):
    """A private copy of a fast tokenizer's Rust tokenizer with `encode_special_tokens` on for good.

    transformers applies split_special_tokens by flipping a flag on the one shared Rust tokenizer,
    which races between threads (and leaves the flag set for the next caller); the copy is never
    flipped and the shared one never set. None for a Python tokenizer, whose switch is per call.
    """
    shared = getattr(tokenizer, "backend_tokenizer", None)
    if shared is None:
        return None
    with _LITERAL_LOCK:
        copy = _LITERAL.get(tokenizer)
        if copy is None:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(shared.to_str())  # about 1 s and 70 MB at a 262k vocabulary
            copy.no_truncation()
            copy.no_padding()
            copy.encode_special_tokens = True
            _LITERAL[tokenizer] = copy
    return copy


def literal_ids(tokenizer, text: str) -> list[int]:
    """User text as text: strings such as "<turn|>" stay characters and never become control ids."""
    backend = _literal_backend(tokenizer)
    if backend is None:
        return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    return backend.encode(text, add_special_tokens=False).ids


def render_turn(tokenizer, processor, content, thinking: bool, source: str) -> str:
    """One user turn and the generation prompt through the checkpoint's template, as text."""
    return render_chat(tokenizer, processor, [{"role": "user", "content": content}], thinking, source)


def render_chat(tokenizer, processor, messages: list, thinking: bool, source: str) -> str:
    """Messages and the generation prompt through the checkpoint's template, as text.

    transformers renders templates in jinja's sandbox; a template that reaches outside it (for
    `os`, say) is refused by name instead of ending in jinja's SecurityError.
    """
    from jinja2.exceptions import SecurityError

    try:
        return _renderer(tokenizer, processor).apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, enable_thinking=thinking)
    except SecurityError as err:
        raise ValueError(f"the chat template of {source!r} reaches outside jinja's sandbox ({err}); a template "
                         "that does that is unsafe, so the checkpoint is refused; restore its original "
                         "chat_template.jinja") from None


def check_template(tokenizer, processor, source: str) -> None:
    """Render a plain turn, with and without thinking, once at load: an unsafe template refuses the checkpoint."""
    for thinking in (False, True):
        render_turn(tokenizer, processor, f" {_SLOT} ", thinking, source)


def prompt_ids(dm, prompt: str, thinking: bool, with_bos: bool = True, images=None) -> list[int]:
    """The chat-templated user turn plus generation prompt, through the model's own template.

    Only the template adds control tokens: it is rendered around a slot, and the prompt is
    tokenized into the slot as literal text (stripped where the template trims it). `images` (an
    ImageInput) puts image parts before the text, as the diffusers pipeline does; the template's
    image placeholders are expanded to the processor's image blocks, never anything in the text.
    """
    slot = f" {_SLOT} "
    content = slot if images is None else [{"type": "image"}] * images.record["count"] + [
        {"type": "text", "text": slot}]
    rendered = render_turn(dm.tokenizer, dm.processor, content, thinking, dm.source)
    if rendered.count(_SLOT) != 1:
        raise ValueError("the model's chat template does not place the user's text exactly once; "
                         "check the checkpoint's chat_template")
    padded = slot in rendered
    before, after = rendered.split(slot if padded else _SLOT)
    text = prompt if padded else prompt.strip()
    tok = dm.tokenizer
    before_ids, after_ids = tok.encode(before, add_special_tokens=False), tok.encode(after, add_special_tokens=False)
    if images is not None:
        before_ids, after_ids = _expand(dm, images, before_ids, after_ids)
    ids = before_ids + literal_ids(tok, text) + after_ids
    if not with_bos and ids and ids[0] == tok.bos_token_id:
        ids = ids[1:]
    return ids


def _expand(dm, images, before: list[int], after: list[int]) -> tuple[list[int], list[int]]:
    from .vision import image_token_ids

    image_id, boi_id, eoi_id = image_token_ids(dm)
    placed = before.count(image_id) + after.count(image_id)
    if placed != images.record["count"]:
        raise InputError("image", f"the model's chat template placed {placed} image(s) for "
                                  f"{images.record['count']} given; this checkpoint's template cannot take images "
                                  "in a turn; unwire image or use a checkpoint whose template has image parts")
    whole = images.expand(before + [-1] + after, image_id, boi_id, eoi_id)  # -1 marks the slot: no id is negative
    cut = whole.index(-1)
    return whole[:cut], whole[cut + 1:]


def tokenizer_fingerprint(tokenizer) -> str:
    """The vocabulary's size and digest: a KV context encoded by another tokenizer is refused by it."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in vocab).encode("utf-8", "surrogatepass"))
    return f"{len(vocab)}:{digest.hexdigest()[:16]}"


def eos_ids(model, tokenizer) -> tuple[int, ...]:
    """The ids that end an answer: the generation config's EOS, the tokenizer's and the end of the turn."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    for token in (tokenizer.eos_token, "<turn|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if token else None
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(ids))


def channel_ids(tokenizer) -> tuple[int, int] | None:
    """(<|channel>, <channel|>): the thought channel's delimiters; None where the vocabulary has none."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|channel>", "<channel|>")]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        return None
    return ids[0], ids[1]
