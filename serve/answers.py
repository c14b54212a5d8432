"""A run's result as an OpenAI choice: the answer cut at a stop string, its finish reason, its token
counts and its log-probabilities.

completion_tokens counts what the model wrote for the choice: the tokens of the answer's text (up to
a stop string; padding inside the answer is not text) plus the thought's (also given as
reasoning_tokens); the canvas and the steps stay in
`dgemma` and `timings`. A logprob is the one the model gave the token at the step that committed
it (dgemma/readouts/logprobs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dgemma.constraints.vocab import piece_bytes
from ..dgemma.readouts.excision import excise

FLOOR = -9999.0  # OpenAI's value for a token the model gave no probability: JSON has no -Infinity


@dataclass(frozen=True)
class Answer:
    text: str
    thought: str | None
    finish: str
    completion_tokens: int
    reasoning_tokens: int
    logprobs: dict | None  # OpenAI's {"content": [...], "refusal": None}


def _cut(text: str, stops) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _tokens_for(tokenizer, ids, chars: int) -> int:
    """The fewest leading ids whose decoded, left-stripped text holds `chars` characters (binary search)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(list(ids[:mid]), skip_special_tokens=True).lstrip()) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _entry(tokenizer, token: int, value: float) -> dict:
    raw = piece_bytes(tokenizer.convert_ids_to_tokens(int(token)) or "")
    return {"token": raw.decode("utf-8", "replace"), "logprob": max(float(value), FLOOR), "bytes": list(raw)}


def _logprobs(tokenizer, captured, positions, tokens, top: int) -> dict:
    content = []
    for at, token in zip(positions, tokens):
        entry = _entry(tokenizer, token, captured.values[at])
        entry["top_logprobs"] = [_entry(tokenizer, t, v) for t, v in
                                 zip(captured.top_ids[at][:top], captured.top_values[at][:top])]
        content.append(entry)
    return {"content": content, "refusal": None}


def answer_of(dm, result, stops=(), top: int | None = None) -> Answer:
    """The choice a run gives: its text cut at the first stop string, and what the usage counts."""
    state = result.state
    opened, closed = dm.channel_ids or (-1, -1)
    cut = excise(state.raw_ids, opened, closed, dm.eos_ids)
    special = set(dm.tokenizer.all_special_ids)  # padding inside an answer is no part of its text
    kept_at = [i for i, t in zip(cut.answer_at, cut.answer) if t not in special]
    at, ids = kept_at, [state.raw_ids[i] for i in kept_at]
    text, finish, kept = state.text, "stop" if state.turn_closed else "length", len(ids)
    stop_at = _cut(text, stops)
    if stop_at is not None:
        text, finish = text[:stop_at], "stop"
        kept = _tokens_for(dm.tokenizer, ids, stop_at)
    reasoning = sum(len(t) for t in cut.thoughts)
    logprobs = None
    if top is not None and result.logprobs is not None:
        logprobs = _logprobs(dm.tokenizer, result.logprobs, at[:kept], ids[:kept], top)
    return Answer(text, state.thought, finish, kept + reasoning, reasoning, logprobs)


def usage(prompt_tokens: int, answers, states=()) -> dict:
    """OpenAI's usage: the prompt once, every choice's completion; with the runs' `states`, the answer tokens per
    decoder forward over all choices (the DiffusionGemma report's headline figure)."""
    completion = sum(a.completion_tokens for a in answers)
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
           "total_tokens": prompt_tokens + completion,
           "completion_tokens_details": {"reasoning_tokens": sum(a.reasoning_tokens for a in answers)}}
    forwards = sum(s.steps_used or 0 for s in states)
    if states and forwards and all(s.answer_tokens is not None for s in states):
        out["tokens_per_forward"] = sum(s.answer_tokens for s in states) / forwards
    return out
