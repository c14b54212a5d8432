"""The answer's token automaton: outlines-core's DFA, plus the thought channel before it and the end after it.

States are outlines-core's, plus three of ours: START (nothing written yet: the answer may begin,
or a thought channel may open), THOUGHT (inside the channel: anything but EOS, until it closes;
the thought is not constrained) and DONE (EOS written from an accepting state: what follows is
padding, never part of the answer). `dist` is the fewest tokens from a state to DONE, so a run
knows whether an answer can still end in the positions left.

outlines-core drops what follows a complete match inside an alternation: from `(six|sixteen)` it
builds no way past `six` to `sixteen`, as if the shorter answer ended the search. So the regex is
compiled with an end marker after it (a NUL byte, written by a token of our own that no model
writes): the only complete matches are whole answers plus the marker, and a state may end the
answer (take EOS) exactly where the marker token leads to an outlines-core final state.
"""

from __future__ import annotations

import math
from collections import deque

from . import store
from .budget import compile_index
from .vocab import token_bytes

START, THOUGHT, DONE = -1, -2, -3
END_BYTE = b"\x00"


class Automaton:
    """Token transitions of one constraint for one tokenizer; `next_state` is memoised.

    `finals` are the states where the answer may end: the end marker token `end` completes it there.
    """

    def __init__(self, index, eos_ids, channel_ids, pad_id: int, end: int):
        self.index = index
        self.initial = index.get_initial_state()
        transitions, complete = index.get_transitions(), frozenset(index.get_final_states())
        self.finals = frozenset(s for s, moves in transitions.items() if moves.get(end) in complete)
        self.eos = frozenset(eos_ids)
        self.open, self.close = channel_ids or (None, None)
        self.pad = pad_id
        self._memo: dict = {}
        self.dist, self.toward = _distances(transitions, self.finals, end)
        self.dist[DONE] = 0
        self.dist[START] = self.dist.get(self.initial, math.inf)
        self.dist[THOUGHT] = self.dist[START] + 1

    @classmethod
    def build(cls, constraint, dm, should_cancel=None) -> Automaton:
        """Read from the disk cache (`store`), else compiled by outlines-core in a child process within the
        budget (`budget.compile_index`) and kept there for the next process."""
        eos = int(dm.eos_ids[0])
        key = store.key_of(f"{dm.tokenizer_fingerprint}\n{eos}", constraint.kind, constraint.text)
        kept = store.load(key)
        if kept is None:
            kept = cls.compiled(constraint, dm, should_cancel)
            store.save(key, *kept)
        tok = dm.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else eos
        return cls(kept[0], dm.eos_ids, dm.channel_ids, pad, kept[1])

    @staticmethod
    def compiled(constraint, dm, should_cancel=None) -> tuple[store.Table, int]:
        """(the index as a table, the end marker's token id), compiled now."""
        pieces = token_bytes(dm.tokenizer)
        end = max(max(ids) for ids in pieces.values()) + 1  # an id past the vocabulary: never a model's token
        pieces[END_BYTE] = [*pieces.get(END_BYTE, []), end]
        index = compile_index(constraint.regex, int(dm.eos_ids[0]), pieces, constraint.costliest, should_cancel)
        return store.Table.of(index), end

    def next_state(self, state: int, token: int):
        """The state after writing `token` in `state`, or None where the constraint forbids it."""
        if state == DONE:
            return DONE
        if token in self.eos:
            return DONE if state in self.finals or (state == START and self.initial in self.finals) else None
        if state == THOUGHT:
            return self.initial if token == self.close else THOUGHT
        if state == START:
            if token == self.open:
                return THOUGHT
            state = self.initial
        key = (state, token)
        found = self._memo.get(key, key)
        if found is key:
            found = self._memo[key] = self.index.get_next_state(state, token)
        return found

    def run(self, state: int, ids):
        """The state after writing `ids`, or None once one is forbidden."""
        for token in ids:
            state = self.next_state(state, int(token))
            if state is None:
                return None
        return state

    def shortest(self, state: int, length: int) -> list[int]:
        """`length` tokens from `state` along a shortest way to DONE, padded after it."""
        out = []
        while len(out) < length:
            if state == DONE:
                out.append(self.pad)
                continue
            token, state = self.toward_token(state)
            out.append(token)
        return out

    def toward_token(self, state: int) -> tuple[int, int]:
        if state == THOUGHT:
            return self.close, self.initial
        if state == START:
            state = self.initial
        if state in self.finals:
            return next(iter(self.eos)), DONE
        token, nxt = self.toward[state]
        return token, nxt


def _distances(transitions: dict, finals, end: int) -> tuple[dict, dict]:
    """(fewest tokens to DONE per state, (token, next state) one step closer) by a backward search."""
    succ = {}
    for state, moves in transitions.items():
        ways: dict = {}  # next state -> the smallest token to it: outlines-core's maps iterate in a random order
        for token, nxt in moves.items():  # per process, and the way to the end must be the same in every one
            if token != end and token < ways.get(nxt, math.inf):
                ways[nxt] = token
        ways.pop(state, None)  # a loop never brings the end closer (EOS loops on accepting states too)
        succ[state] = ways
    before: dict = {}
    for state, ways in succ.items():
        for nxt in ways:
            before.setdefault(nxt, []).append(state)
    dist = {s: 1 for s in finals}
    queue = deque(finals)
    while queue:
        nxt = queue.popleft()
        for state in before.get(nxt, ()):
            if state not in dist:
                dist[state] = dist[nxt] + 1
                queue.append(state)
    toward = {}
    for state, ways in succ.items():
        if state in dist and state not in finals:
            nxt = min(ways, key=lambda s: (dist.get(s, math.inf), ways[s]))
            toward[state] = (ways[nxt], nxt)
    for state in transitions:
        dist.setdefault(state, math.inf)
    return dist, toward
