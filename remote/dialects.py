"""The remote dialects: how each recognises a server's model card, and the model it builds to run there.

A dialect is one row of `DIALECTS`: its name, how sure it is that a card is its engine's (`SIGNED`:
the engine's own mark; `HINTED`: only a name or a field suggests it; 0: not its), the model payload
it builds (whose `backend` runs there, a `dgemma.backend.Backend`), and the words the loader's
tooltip, the refusal of other servers and the README's table use. `dialect_of` picks the surest; on
a tie, the first registered. How to add one: docs/architecture.md.

The model card and the token table come from a server that may be hostile: each number is
range-checked, each text bounded and redacted, before it becomes part of a payload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..dgemma.readouts.wire import CARD_CANVAS, EXTENSION, NAME_LIMIT, OWNER, WireError, flag, integer, obj, text, value
from .http import Remote
from .model import RemoteModel
from .pack import PackBackend
from .text import FramesBackend, VllmBackend, text_model
from .textstream import CANVAS_MAX, whole

SIGNED, HINTED = 2, 1
DIFFUSION_NAMES = ("diffusiongemma", "diffusion-gemma", "diffusion_gemma")
MAX_POSITIONS = 2**24      # the model's context window (the real model's: 16384)
MAX_VOCAB = 2**20          # ids (the real model's: 262,144)
TOKEN_CHARS = 256          # characters one id shows as (the real model's longest: 16)
TOKENS_TIMEOUT = 60.0      # seconds for the token table (a few MB)


@dataclass(frozen=True)
class Dialect:
    """One kind of server: how its card is recognised, the model built from it, and how it is described."""

    name: str
    recognise: Callable[[dict], int]   # card -> SIGNED, HINTED or 0
    model: Callable[..., RemoteModel]  # (remote, card, should_cancel) -> the payload whose backend runs there
    server: str                        # what serves it (the README table's first column)
    carries: str                       # what its stream carries (the loader's tooltip)
    mark: str                          # what of its card is looked for (the refusal of any other server)
    serve_with: str                    # how to serve a model in it (the refusal's fix)


DIALECTS: dict[str, Dialect] = {}


def register(dialect: Dialect) -> Dialect:
    """Add (or replace) a dialect; connecting tries it from then on."""
    DIALECTS[dialect.name] = dialect
    return dialect


def dialect_of(card: dict) -> Dialect | None:
    """The dialect surest that `card` is its engine's; None: the card is no diffusion engine's."""
    sure = [(d.recognise(card), d) for d in DIALECTS.values()]
    best = max(sure, key=lambda pair: pair[0], default=(0, None))
    return best[1] if best[0] > 0 else None


def owner(card: dict) -> str:
    return str(card.get(OWNER, "")).lower()


def card_canvas(url: str, card: dict) -> int | None:
    """The canvas size a text dialect's card gives (range-checked); None when it gives none."""
    first, second = CARD_CANVAS
    size = card.get(first, card.get(second))
    return None if size is None else whole(size, "the card's canvas size", 1, CANVAS_MAX, url)


def text_dialect(backend) -> Callable[..., RemoteModel]:
    """The model builder of a text dialect run by `backend` (a remote.text.TextBackend class)."""
    return lambda remote, card, should_cancel: text_model(remote.url, card, backend(remote),
                                                          card_canvas(remote.url, card))


def pack_model(remote: Remote, card: dict, should_cancel) -> RemoteModel:
    """This pack's server: the card's engine facts and the model's whole token table."""
    info, w = obj(card, EXTENSION, "card."), f"card.{EXTENSION}."
    canvas, vocab = integer(info, "canvas_length", 1, CANVAS_MAX, w), integer(info, "vocab_size", 1, MAX_VOCAB, w)
    positions = integer(info, "max_positions", 1, MAX_POSITIONS, w)
    names = {n: remote.redact(text(info, n, NAME_LIMIT, w)) if n in info else d
             for n, d in (("model_source", ""), ("quant", "none"), ("device", "?"), ("dtype", "unknown"))}
    table = remote.call("GET", "/v1/dgemma/tokens", timeout=TOKENS_TIMEOUT, should_cancel=should_cancel)
    strings = value(table, "token_strings", "/v1/dgemma/tokens ")
    if not isinstance(strings, list) or len(strings) != vocab:
        raise WireError("token_strings", f"a list of vocab_size = {vocab} texts",
                        len(strings) if isinstance(strings, list) else strings)
    if not all(isinstance(s, str) and len(s) <= TOKEN_CHARS for s in strings):
        bad = next(s for s in strings if not (isinstance(s, str) and len(s) <= TOKEN_CHARS))
        raise WireError("token_strings", f"texts of at most {TOKEN_CHARS} characters", bad)
    return RemoteModel(url=remote.url, model_id=card["id"], dialect=PackBackend.dialect, canvas_length=canvas,
                       max_positions=positions, token_strings=tuple(strings), source=names["model_source"],
                       quant=names["quant"], device=f"remote {names['device']}", dtype=names["dtype"],
                       vision=flag(info, "vision", w) if "vision" in info else False, backend=PackBackend(remote),
                       decoding=decoding_of(table.get("decoding"), vocab))


def decoding_of(found, vocab: int):
    """The token table's decoding facts (byte tokens, ids decoding skips), checked; None when not sent."""
    if found is None:
        return None
    bytes_, skipped = (found.get(k) if isinstance(found, dict) else None for k in ("bytes", "skipped"))
    if not _ints(bytes_, 256, lambda p: isinstance(p, list) and len(p) == 2 and _int(p[0], vocab) and
                 _int(p[1], 256)):
        raise WireError("decoding.bytes", "at most 256 [id, byte] pairs", bytes_)
    if not _ints(skipped, vocab, lambda i: _int(i, vocab)):
        raise WireError("decoding.skipped", f"ids below vocab_size {vocab}", skipped)
    return {int(i): int(b) for i, b in bytes_}, frozenset(skipped)


def _ints(items, most: int, good) -> bool:
    return isinstance(items, list) and len(items) <= most and all(good(x) for x in items)


def _int(v, below: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < below


def _pack_card(card: dict) -> int:
    return SIGNED if isinstance(card.get(EXTENSION), dict) else 0


def _shim_card(card: dict) -> int:
    if owner(card) == "unsloth":
        return SIGNED
    names = f"{card.get('id', '')} {card.get('root', '')}".lower()
    return HINTED if CARD_CANVAS[0] in card or any(n in names for n in DIFFUSION_NAMES) else 0


def _vllm_card(card: dict) -> int:
    return SIGNED if owner(card) in ("vllm", "sglang") else 0


register(Dialect(PackBackend.dialect, _pack_card, pack_model, server="this pack's `python -m serve`",
                 carries="every step in full", mark="no dgemma card", serve_with="python -m serve"))
register(Dialect(FramesBackend.dialect, _shim_card, text_dialect(FramesBackend),
                 server="llama.cpp's visual server through Unsloth's shim", carries="step text only",
                 mark="not Unsloth's shim, no DiffusionGemma in its name", serve_with="Unsloth's shim"))
register(Dialect(VllmBackend.dialect, _vllm_card, text_dialect(VllmBackend), server="vLLM (and SGLang)",
                 carries="one text per canvas", mark="not vLLM or SGLang", serve_with="vLLM"))


def listed(words) -> str:
    """`a`, `a or b`, `a, b or c`."""
    words = list(words)
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def carried() -> str:
    """What each dialect's stream carries, for the loader's `dialect` output."""
    return f"What the server's stream carries: {listed(f'{d.name} ({d.carries})' for d in DIALECTS.values())}."
