"""Cut the thought channel out of generated ids and read the run's honesty signals."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Excision:
    answer: tuple[int, ...]          # ids outside any channel, before the first EOS
    thoughts: tuple[tuple[int, ...], ...]
    turn_closed: bool                # an EOS id ended the turn outside an open channel
    stray_delimiter: bool            # a channel close with no open channel (dropped)
    answer_at: tuple[int, ...] = ()  # where each answer id sits in the ids


def excise(ids, channel_open: int, channel_close: int, eos_ids) -> Excision:
    """Scan ids left to right: channel spans become thoughts, the answer ends at the first EOS.

    A channel opened and never closed makes the whole rest thought, so the turn is not closed.
    """
    eos = set(eos_ids)
    answer: list[int] = []
    at: list[int] = []
    thoughts: list[list[int]] = []
    in_channel = closed = stray = False
    for index, tok in enumerate(ids):
        tok = int(tok)
        if in_channel:
            if tok == channel_close:
                in_channel = False
            else:
                thoughts[-1].append(tok)
        elif tok == channel_open:
            in_channel = True
            thoughts.append([])
        elif tok == channel_close:
            stray = True
        elif tok in eos:
            closed = True
            break
        else:
            answer.append(tok)
            at.append(index)
    return Excision(tuple(answer), tuple(tuple(t) for t in thoughts), closed, stray, tuple(at))


def thought_text(tokenizer, thoughts) -> str | None:
    """Decoded thought spans without their `thought` label; None when there is no content."""
    parts = []
    for span in thoughts:
        text = tokenizer.decode(list(span), skip_special_tokens=True).strip()
        if text.startswith("thought"):
            text = text[len("thought"):].strip()
        if text:
            parts.append(text)
    return "\n\n".join(parts) if parts else None
