"""What a pack server sends, checked against what was asked: a hostile server is refused, not recorded.

dgemma/readouts/wire.py checks each field's kind and range as it is read; here each step must sit inside
the run asked for, in order, and the run's end must echo the request (prompt, seed and knobs,
context, window) and its text must be what its ids spell.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..dgemma.constraints.one_value import one_value
from ..dgemma.inputs.knobs import num_blocks
from ..dgemma.inputs.tokens import REPLACEMENT, decoded_as_tokenizer
from ..dgemma.readouts.wire import WireError, integer, obj, short, text
from .model import RemoteContext

SLACK = 16  # events of a stream beside its steps: role, thought, answer, usage, end, error
_SPECIAL = re.compile(r"(?:<[^<>\s]{1,64}>)+")  # what a special token shows as; decoding may drop it


@dataclass(frozen=True)
class Asked:
    """What one run asked the server for."""

    prompt: str
    knobs: object
    context: object
    image: bool
    advanced: object
    advance_context: bool
    canvas_length: int
    constraint: object = None  # dgemma.constraints.constraint.Constraint, or None

    @property
    def constraint_summary(self) -> dict | None:
        return self.constraint.summary() if self.constraint is not None and self.constraint.active else None

    @property
    def blocks(self) -> int:
        return num_blocks(self.knobs.gen_length, self.canvas_length)

    @property
    def max_events(self) -> int:
        return self.knobs.num_inference_steps * self.blocks + SLACK


def check_step(row, previous, asked: Asked) -> None:
    """A streamed step inside the asked run (block, step) and after the one before it."""
    if row.block >= asked.blocks:
        raise WireError("block", f"below {asked.blocks} (gen_length {asked.knobs.gen_length} in blocks of "
                                 f"{asked.canvas_length})", row.block)
    if row.step >= asked.knobs.num_inference_steps:
        raise WireError("step", f"below num_inference_steps {asked.knobs.num_inference_steps}", row.step)
    if previous is not None and (row.block, row.step) <= (previous.block, previous.step):
        raise WireError("step", f"after block {previous.block} step {previous.step}", f"block {row.block} "
                                f"step {row.step}")


def check_echo(config, state, asked: Asked) -> None:
    """The run's config says what was asked: prompt, every knob, context, image, window, constraint."""
    sent = asked.knobs.asdict()
    for name, value in sent.items():
        if getattr(config.knobs, name) != value:
            raise WireError(f"config.{name}", f"{value!r} as asked", getattr(config.knobs, name))
    want = asked.context.summary() if asked.context is not None else None
    for name, got, expected in (("prompt", config.prompt, asked.prompt), ("context", config.context, want),
                                ("image", config.image is not None, asked.image),
                                ("advanced", config.advanced is not None, asked.advanced is not None),
                                ("constraint", config.constraint, asked.constraint_summary)):
        if got != expected:
            raise WireError(f"config.{name}", f"{short(expected)} as asked", got)
    if asked.advanced is not None:
        _check_window(config.advanced, asked.advanced)
    elif state.paused:
        raise WireError("state.paused", "false for a run without a window", True)
    if (state.constraint is not None) != (asked.constraint_summary is not None):
        raise WireError("state.constraint", "a verdict exactly when a constraint was asked", state.constraint)


def _check_window(record: dict, advanced) -> None:
    sched = advanced.scheduling
    want = {**dict(sched.settings), "scheduler": sched.name, "start_step": advanced.start,
            "end_step": advanced.end_step, "pins": advanced.pins}
    for name, value in want.items():
        if record.get(name) != value:
            raise WireError(f"config.advanced.{name}", f"{short(value)} as asked", record.get(name))
    if (record.get("resumed_from") is None) != (advanced.resume is None):
        raise WireError("config.advanced.resumed_from", "set exactly when a run is resumed",
                        record.get("resumed_from"))


def check_ids(state, rows, strings, constraint=None, decoding=None) -> None:
    """raw_ids are the last canvas of each block, the answer's ids come from them, the text spells them."""
    last = [r.ids.tolist() for r, nxt in zip(rows, [*rows[1:], None]) if nxt is None or nxt.block != r.block]
    if list(state.raw_ids) != [i for canvas in last for i in canvas]:
        raise WireError("state.raw_ids", "the last canvas of each block, as streamed", state.raw_ids)
    left = iter(state.raw_ids)
    if not all(any(i == j for j in left) for i in state.answer_ids):
        raise WireError("state.answer_ids", "ids taken in order from raw_ids", state.answer_ids)
    one = one_value(constraint) if constraint is not None and constraint.active else None
    said = one.written(state.text) if one is not None else state.text
    if not reads_as(said, state.answer_ids, strings, decoding):
        shown = "".join(strings[i] for i in state.answer_ids)
        raise WireError("state.text", f"what its answer_ids spell ({short(shown)})", state.text)


def reads_as(said: str, ids, strings, decoding=None) -> bool:
    """Whether `said` is what `ids` decode to: with the server's `decoding` facts (byte tokens, skipped ids)
    the ids are decoded exactly as the tokenizer decodes them, byte runs included; else `spells`."""
    if decoding is not None:
        exact = decoded_as_tokenizer(ids, strings, *decoding)
        if " ".join(said.split()) == " ".join(exact.split()):
            return True
    return spells(said, ids, strings)


def spells(said: str, ids, strings) -> bool:
    """Whether `said` can be what `ids` decode to (skipping special tokens, then stripped), read through
    the server's own table. The table cannot say which `<...>` tokens decoding skips, so they are
    removed from both sides, nor what a run of byte tokens (shown as U+FFFD) joins into, so each is a
    gap of at most one character; whitespace is compared collapsed. Everything else must be there,
    in order, and nothing more."""
    specials = sorted({strings[i] for i in ids if _SPECIAL.fullmatch(strings[i])}, key=len, reverse=True)

    def plain(text: str) -> str:
        for s in specials:
            text = text.replace(s, "")
        return " ".join(text.split())

    runs, slack, in_gap = [[]], 0, False
    for i in ids:
        s = strings[i]
        if REPLACEMENT in s or s in specials:
            if not in_gap:  # a gap may also hold the spaces either side of it, stripped from its neighbours
                runs.append([])
                slack += 2
            slack, in_gap = slack + (0 if s in specials else len(s)), True
        else:
            runs[-1].append(s)
            in_gap = False
    words, said = [plain("".join(r)) for r in runs], plain(said)
    if len(words) == 1:
        return said == words[0]
    if len(said) > sum(map(len, words)) + slack or not said.startswith(words[0]) or not said.endswith(words[-1]):
        return False
    at, end = len(words[0]), len(said) - len(words[-1])
    for word in words[1:-1]:
        at = said.find(word, at, end)
        if at < 0:
            return False
        at += len(word)
    return at <= end


def made_context(model, made, max_length: int) -> RemoteContext:
    """The context a server says it holds: a handle, a length within the model, its summary."""
    if not isinstance(made, dict):
        raise WireError("context", "an object with handle, length and summary", made)
    return RemoteContext(model, text(made, "handle", 128, "context."), integer(made, "length", 0, max_length,
                                                                               "context."),
                         obj(made, "summary", "context."))
