"""The constraint as one step of the block loop: a Viterbi over (position x automaton state).

Each step, every position offers a few candidate tokens: the model's top-k by this step's logits,
the token the step proposed there (favoured by a large bonus, so the constraint changes the
model's choice only where it must), and the previous step's valid path (so a valid canvas always
exists). Pinned positions offer only their pin. The most probable path the automaton accepts,
from the state the earlier blocks left and ending where an answer can still close in the
positions left, replaces the proposed tokens; at a block's last step it fills the whole canvas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..inputs.knobs import num_blocks
from .automaton import DONE, START

TOP_K = 8
BONUS = 1.0e4   # per kept proposal: outweighs any difference of logits
BEAM = 64       # states kept per position (the previous path's state always among them)


@dataclass(frozen=True, eq=False)
class GuidePlan:
    """A constraint checked and compiled for one request: each run starts its own `Guide` from it."""

    automaton: object
    constraint: object
    canvas_length: int
    blocks: int
    shape: object = None  # a one_value.OneValue: the canvas holds the value, the answer is its JSON

    def start(self) -> Guide:
        return Guide(self)


class Guide:
    """One run's constraint state: `apply` makes a step's canvas valid; `verdict` reads the answer."""

    def __init__(self, plan: GuidePlan):
        self.automaton, self.constraint, self.shape = plan.automaton, plan.constraint, plan.shape
        self.L, self.blocks = plan.canvas_length, plan.blocks
        self._starts: dict[int, int | None] = {0: START}
        self._path: tuple[int, list[int]] | None = None  # (block, tokens) of the last valid path
        self.broken: str | None = None
        self.changed = 0
        self._at = None  # (block, start state, previous path, k) of the step launched, until it is chosen
        self.candidates = None  # (L, k + 2) ids on the device: every token `choose` can put at each position

    def start_state(self, block: int, done_ids) -> int | None:
        """The automaton's state after the blocks before `block` (their host ids; memoised per block)."""
        if block not in self._starts:
            state = START
            for ids in done_ids[:block]:
                state = None if state is None else self.automaton.run(state, ids.tolist())
            self._starts[block] = state
        return self._starts[block]

    @torch.no_grad()
    def launch(self, block: int, done_ids, canvas, logits) -> torch.Tensor | None:
        """A step's device part: (1, n) uint8 holding each position's top-k ids and scores under `logits` (1, L, V)
        and the scores of its `canvas` token and of the last valid path's, all `choose` reads on the host after
        the step's one copy; None when the constraint cannot be held any more."""
        state = self.start_state(block, done_ids)
        self._at = None
        if state is None or self.broken:
            self.broken = self.broken or "an earlier block left the constraint"
            return None
        previous = self._previous(block, state)
        scores = logits[0].float()
        values, ids = scores.topk(min(TOP_K, scores.shape[-1]), dim=-1)
        before = torch.as_tensor(previous).to(canvas.device, non_blocking=True)
        extra = scores.gather(-1, torch.stack([canvas[0], before], dim=-1))
        self._at = (block, state, previous, ids.shape[-1])
        self.candidates = torch.cat([ids, canvas[0, :, None], before[:, None]], dim=-1)  # what `choose` picks from
        return torch.cat([ids.to(torch.int32).view(torch.float32), values, extra], dim=-1).view(torch.uint8).reshape(
            1, -1)

    def choose(self, ids: np.ndarray, proposed: np.ndarray, pinned, rows, last: bool) -> tuple:
        """A step's host part: (the canvas's ids after the constraint, the positions it changed), from the step's
        `ids`, what it holds committed (`proposed`), its pins and the bytes `launch` made."""
        unchanged = np.zeros(len(ids), bool)
        if self._at is None:
            return ids, unchanged
        block, state, previous, k = self._at
        table = rows.view(np.float32).reshape(len(ids), 2 * k + 2)
        options = candidates(table[:, :k].view(np.int32).tolist(), table[:, k:2 * k].tolist(), ids.tolist(),
                             previous, table[:, 2 * k:].tolist(), proposed.tolist(),
                             None if pinned is None else pinned.tolist())
        left = (self.blocks - block - 1) * self.L
        path = viterbi(self.automaton, state, options, left, previous)
        if path is None:
            self.broken = "no valid path through the pinned tokens: the pins and the constraint disagree"
            return ids, unchanged
        self._path = (block, path)
        write = True if last else proposed | (unchanged if pinned is None else pinned)
        out = np.where(write, np.asarray(path, ids.dtype), ids)
        changed = out != ids
        self.changed += int(changed.sum())
        return out, changed

    def _previous(self, block: int, state: int) -> list[int]:
        if self._path is not None and self._path[0] == block:
            return self._path[1]
        return self.automaton.shortest(state, self.L)

    def verdict(self, raw_ids, paused: bool = False) -> dict:
        """Whether the answer satisfies the constraint and, if not, why; for canvas_state."""
        state = None if paused else self.automaton.run(START, raw_ids)
        ok = state == DONE and not self.broken
        reason = ""
        if self.broken:
            reason = self.broken
        elif paused:
            reason = "the run paused before its answer was finished; resume it to finish the answer"
        elif state is None:
            reason = "the answer left the constraint"
        elif state != DONE:
            need = self.automaton.dist.get(state, math.inf)
            reason = (f"gen_length ran out before the answer could end (it needs at least {need} more tokens); "
                      "raise gen_length")
        shape = {} if self.shape is None else {"answered_as_value": True}
        return {**self.constraint.summary(), "satisfied": ok, "reason": reason, "changed_positions": self.changed,
                **shape}

    def answer(self, text: str) -> str:
        """The answer text: the canvas's own, or for a schema of one value, that value's JSON."""
        return text if self.shape is None else self.shape.answer(text)


def candidates(top_ids, top_values, row, previous, extras, proposed, pins) -> list[list[tuple[int, float]]]:
    """Per position, (token, score) options: top-k, the proposal (with the bonus), the previous path."""
    out = []
    for i in range(len(top_ids)):
        if pins is not None and pins[i]:
            out.append([(row[i], 0.0)])
            continue
        options = dict(zip(top_ids[i], top_values[i]))
        options.setdefault(previous[i], extras[i][1])
        if proposed[i]:
            options[row[i]] = extras[i][0] + BONUS
        out.append(list(options.items()))
    return out


def viterbi(automaton, start: int, options, left: int, previous) -> list[int] | None:
    """The best-scoring token path the automaton accepts from `start`, ending within reach of DONE."""
    keep = _states_along(automaton, start, previous)
    layer, back = {start: 0.0}, []
    for i, choices in enumerate(options):
        nxt = _pruned(_advance(automaton.next_state, layer, choices), keep[i])
        back.append(nxt)
        layer = {s: entry[0] for s, entry in nxt.items()}
    ends = [s for s in layer if automaton.dist.get(s, math.inf) <= left]
    if not ends:
        return None
    state, path = max(ends, key=layer.__getitem__), []
    for nxt in reversed(back):
        _, state, token = nxt[state]
        path.append(token)
    return path[::-1]


def _advance(step, layer: dict, choices) -> dict:
    """One position: each reachable state's best (score, previous state, token)."""
    nxt: dict = {}
    for state, score in layer.items():
        for token, value in choices:
            new = step(state, token)
            if new is None:
                continue
            total = score + value
            best = nxt.get(new)
            if best is None or total > best[0]:
                nxt[new] = (total, state, token)
    return nxt


def _pruned(nxt: dict, keep) -> dict:
    """The BEAM best states, and the state the previous canvas reaches here."""
    if len(nxt) <= BEAM:
        return nxt
    ranked = sorted(nxt, key=lambda s: nxt[s][0], reverse=True)[:BEAM]
    if keep in nxt and keep not in ranked:
        ranked.append(keep)
    return {s: nxt[s] for s in ranked}


def _states_along(automaton, start: int, tokens) -> list:
    states, state = [], start
    for token in tokens:
        state = None if state is None else automaton.next_state(state, token)
        states.append(state)
    return states


class _Unconstrained:
    """No constraint: the step's canvas passes through untouched."""

    def launch(self, block, done_ids, canvas, logits):
        return None


UNCONSTRAINED = _Unconstrained()


def guide_for(dm, constraint, gen_length: int, should_cancel=None) -> GuidePlan | None:
    """The constraint compiled for a request (None for no constraint); refuses an answer that cannot fit,
    before any model work. `should_cancel` stops the constraint's compile."""
    from ..errors import InputError
    from .constraint import Constraint, automaton
    from .one_value import one_value

    if constraint is None:
        return None
    if not isinstance(constraint, Constraint):
        raise InputError("constraint", f"constraint must be a Constraint, got {type(constraint).__name__}")
    if not constraint.active:
        return None
    blocks = num_blocks(gen_length, dm.canvas_length)
    shape = one_value(constraint)
    found = automaton(dm, constraint if shape is None else shape.choice, should_cancel)
    need, positions = found.dist[START], blocks * dm.canvas_length
    if need == math.inf:
        raise InputError("constraint", "no answer this model's tokenizer can write satisfies the constraint; "
                                       "loosen it")
    if need > positions:
        raise InputError("constraint", f"the shortest answer the constraint allows takes {need} tokens with its "
                                       f"EOS, over the {positions} positions gen_length {gen_length} generates; "
                                       "raise gen_length or loosen the constraint")
    return GuidePlan(found, constraint, dm.canvas_length, blocks, shape)


def compiled_for(constraint):
    """The constraint the automaton is compiled from: a schema of one value compiles as its choice."""
    from .one_value import one_value

    shape = one_value(constraint)
    return constraint if shape is None else shape.choice


def needs_compile(dm, constraint) -> bool:
    """Whether a run with `constraint` waits for a compile (or a read from the disk cache) first."""
    from .constraint import held

    return constraint is not None and constraint.active and not held(dm, compiled_for(constraint))
