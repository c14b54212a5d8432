"""What each token id writes, as bytes: the vocabulary a token-level automaton is compiled over."""

from __future__ import annotations

import re

_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def token_bytes(tokenizer) -> dict[bytes, list[int]]:
    """{bytes: [ids]} of every ordinary token; control and added tokens never belong to an answer.

    SentencePiece pieces write `▁` as a space, and `<0xNN>` byte-fallback pieces write one byte. Ids are
    taken in order: the tokenizer's own order changes from process to process, and the automaton's
    choice among tokens that write the same bytes must not.
    """
    added = set(tokenizer.get_added_vocab().values()) | set(tokenizer.all_special_ids)
    out: dict[bytes, list[int]] = {}
    for piece, i in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1]):
        if i in added or not piece:
            continue
        out.setdefault(piece_bytes(piece), []).append(i)
    return out


def piece_bytes(piece: str) -> bytes:
    """What a vocabulary piece writes: `▁` as a space, a `<0xNN>` byte-fallback piece its one byte."""
    byte = _BYTE.match(piece)
    return bytes([int(byte.group(1), 16)]) if byte else piece.replace("▁", " ").encode("utf-8")
