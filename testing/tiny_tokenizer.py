"""A locally built Gemma-4-style tokenizer for the project's tiny checkpoints.

Ids below 115 hold the control tokens at the real Gemma 4 ids, so code that resolves them from
the tokenizer sees the same numbers; the chat template is Gemma 4's turn/channel format reduced
to text, images and thinking.
"""

from __future__ import annotations

import random

# Control tokens at their Gemma 4 ids; every other id below FIRST_ORDINARY is an unused slot.
NAMED_IDS = {
    0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>",
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>",
    50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>',
    98: "<|think|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>",
    107: "\n",
    108: "<|image>", 109: "<|image|>", 110: "<image|>",
    111: "<|audio>", 112: "<|audio|>", 113: "<audio|>", 114: "<|video|>",
}
FIRST_ORDINARY = 115
NEWLINE_ID = 107

EXTRA_SPECIAL = {
    "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>",
    "eoc_token": "<channel|>", "think_token": "<|think|>", "image_token": "<|image|>",
    "boi_token": "<|image>", "eoi_token": "<image|>", "audio_token": "<|audio|>",
    "boa_token": "<|audio>", "eoa_token": "<audio|>",
}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% set thinking = enable_thinking is defined and enable_thinking %}"
    "{% set has_system = messages and messages[0]['role'] == 'system' %}"
    "{% if thinking or has_system %}"
    "<|turn>system\n{% if thinking %}<|think|>\n{% endif %}"
    "{% if has_system %}{{ messages[0]['content'] | trim }}{% endif %}<turn|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] != 'system' %}"
    "{% set content = m['content'] %}"
    "{% if content is not string %}{% set ns = namespace(text='') %}{% for part in content %}"
    "{% if part['type'] == 'image' %}{% set ns.text = ns.text + '<|image|>' %}"
    "{% elif part['type'] == 'text' %}{% set ns.text = ns.text + (part['text'] | trim) %}{% endif %}"
    "{% endfor %}{% set content = ns.text %}{% endif %}"
    "{% if m['role'] == 'assistant' or m['role'] == 'model' %}"
    "{% set content = content.split('<channel|>')[-1] %}"
    "<|turn>model\n{{ content | trim }}<turn|>\n"
    "{% else %}"
    "<|turn>{{ m['role'] }}\n{{ content | trim }}<turn|>\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "<|turn>model\n{% if not thinking %}<|channel>thought\n<channel|>{% endif %}"
    "{% endif %}"
)

_SCRIPTS = [(0x0400, 0x04FF), (0x0600, 0x06FF), (0x0900, 0x097F), (0x0980, 0x09FF),
            (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x3040, 0x30FF), (0x0E00, 0x0E7F),
            (0x0370, 0x03FF), (0x0590, 0x05FF), (0x00C0, 0x017F), (0x0041, 0x007A)]


def _filler_pieces(count: int, seed: int) -> list[str]:
    """Distinct multilingual pieces that pad a vocabulary to the real model's size."""
    rng = random.Random(seed)
    pieces: list[str] = []
    seen: set[str] = set()
    while len(pieces) < count:
        lo, hi = rng.choice(_SCRIPTS)
        piece = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(2, 4)))
        if rng.random() < 0.3:
            piece = "▁" + piece
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    return pieces


def build_tokenizer(vocab_size: int | None = None, seed: int = 0):
    """Character-level Gemma tokenizer with byte fallback; `vocab_size` pads it with filler pieces."""
    from transformers import AddedToken
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    tokens = [NAMED_IDS.get(i, f"<unused{i}>") for i in range(FIRST_ORDINARY)]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["▁"] + [chr(c) for c in range(0x21, 0x7F)]
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size must be at least {len(tokens)}, got {vocab_size}")
        tokens += _filler_pieces(vocab_size - len(tokens), seed)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = GemmaTokenizer(vocab=vocab, merges=[], extra_special_tokens=EXTRA_SPECIAL)
    controls = [AddedToken(t, special=True, normalized=False)
                for i, t in enumerate(tokens[:FIRST_ORDINARY]) if i != NEWLINE_ID]
    tok.add_special_tokens({"additional_special_tokens": controls},
                           replace_extra_special_tokens=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def context_ids(dm, text: str) -> list[int]:
    """Raw context with no chat framing, as a KV context opens the sequence: the only BOS, then the text."""
    from ..dgemma.inputs.tokens import literal_ids

    return [dm.tokenizer.bos_token_id] + literal_ids(dm.tokenizer, text)
