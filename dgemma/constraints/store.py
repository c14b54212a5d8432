"""Compiled token automata kept on disk, so a constraint compiles once per tokenizer, not once per process.

A file holds one constraint's transitions as plain int32 arrays behind a short JSON header; it is
never unpickled. Its name and its header carry the key (tokenizer fingerprint, constraint kind and
text digest, outlines-core version, this format's version), and the header a SHA-256 of the arrays.
A file is read only up to a size bound, and anything that does not check out (foreign key, wrong
length, digest, a state or token out of range) is ignored: the caller compiles and writes it again.
Writes go to a temporary file renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT = 1
MAGIC = b"DGEMMA-AUTOMATON\n"
ENV = "DGEMMA_CONSTRAINT_CACHE"
MAX_HEADER = 4096
MAX_ROWS = 4_000_000  # the compile's own bound on transitions (budget.MAX_TRANSITIONS)
MAX_BYTES = len(MAGIC) + 4 + MAX_HEADER + 4 * (3 * MAX_ROWS + MAX_ROWS)


def folder() -> Path:
    """Where automata are kept: $DGEMMA_CONSTRAINT_CACHE, else ~/.cache/dgemma-constraints."""
    given = os.environ.get(ENV)
    return Path(given) if given else Path.home() / ".cache" / "dgemma-constraints"


def _outlines_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("outlines-core")
    except PackageNotFoundError:
        return "unknown"


def key_of(fingerprint: str, kind: str, text: str) -> str:
    """The cache key: what decides the automaton (the tokenizer, the constraint, the compiler)."""
    digest = hashlib.sha256(f"{FORMAT}\n{_outlines_version()}\n{fingerprint}\n{kind}\n{text}".encode())
    return digest.hexdigest()


class Table:
    """outlines-core's Index read side over sorted arrays: what `Automaton` asks of an index."""

    def __init__(self, src, tok, dst, initial: int, finals):
        order = np.lexsort((tok, src))
        self.src, self.tok, self.dst = (np.ascontiguousarray(a[order], np.int32) for a in (src, tok, dst))
        self._keys = (self.src.astype(np.int64) << 32) | self.tok.astype(np.int64)
        self.initial, self.finals = int(initial), frozenset(int(s) for s in finals)

    @classmethod
    def of(cls, index) -> Table:
        moves = index.get_transitions()
        rows = [(s, t, n) for s, out in moves.items() for t, n in out.items()]
        src, tok, dst = (np.array(col, np.int64) for col in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 3
        return cls(src, tok, dst, index.get_initial_state(), index.get_final_states())

    def get_initial_state(self) -> int:
        return self.initial

    def get_final_states(self) -> frozenset:
        return self.finals

    def get_transitions(self) -> dict:
        out: dict = {}
        for s, t, n in zip(self.src.tolist(), self.tok.tolist(), self.dst.tolist()):
            out.setdefault(s, {})[t] = n
        return out

    def get_next_state(self, state: int, token: int):
        key = (int(state) << 32) | int(token)
        at = int(np.searchsorted(self._keys, key))
        return int(self.dst[at]) if at < len(self._keys) and int(self._keys[at]) == key else None


def save(key: str, table: Table, end: int) -> None:
    """Write atomically; a failure to write only costs the next process a compile."""
    finals = np.array(sorted(table.finals), np.int32)
    body = b"".join(a.astype("<i4").tobytes() for a in (table.src, table.tok, table.dst, finals))
    head = json.dumps({"key": key, "rows": len(table.src), "finals": len(finals), "initial": table.initial,
                       "end": end, "sha256": hashlib.sha256(body).hexdigest()}).encode()
    where = folder()
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".part-")
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + len(head).to_bytes(4, "little") + head + body)
        os.replace(tmp, where / f"{key}.automaton")
    except OSError:
        try:
            os.unlink(tmp)
        except (OSError, UnboundLocalError):
            pass


def load(key: str) -> tuple[Table, int] | None:
    """(the table, its end token) kept under `key`, or None when absent, foreign or damaged."""
    try:
        with open(folder() / f"{key}.automaton", "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    try:
        return _parsed(raw, key)
    except (ValueError, KeyError, TypeError, OverflowError):
        return None


def _parsed(raw: bytes, key: str) -> tuple[Table, int] | None:
    if len(raw) > MAX_BYTES or not raw.startswith(MAGIC):
        return None
    at = len(MAGIC) + 4
    size = int.from_bytes(raw[len(MAGIC):at], "little")
    if size > MAX_HEADER:
        return None
    head = json.loads(raw[at:at + size])
    rows, nfinals, initial, end = (head[k] for k in ("rows", "finals", "initial", "end"))
    if head["key"] != key or not _counts(rows, nfinals, initial, end):
        return None
    body = raw[at + size:]
    if len(body) != 4 * (3 * rows + nfinals) or hashlib.sha256(body).hexdigest() != head["sha256"]:
        return None
    ints = np.frombuffer(body, "<i4")
    src, tok, dst, finals = ints[:rows], ints[rows:2 * rows], ints[2 * rows:3 * rows], ints[3 * rows:]
    if (ints < 0).any() or (rows and int(tok.max()) > end):
        return None
    return Table(src, tok, dst, initial, finals.tolist()), end


def _counts(rows, nfinals, initial, end) -> bool:
    numbers = (rows, nfinals, initial, end)
    return all(type(v) is int and 0 <= v < 2**31 for v in numbers) and rows <= MAX_ROWS and nfinals <= MAX_ROWS
