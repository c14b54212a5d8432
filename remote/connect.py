"""Connect to a remote engine: check /health and /v1/models, find its dialect, build the model payload.

The model card and the token table come from a server that may be hostile: each number is
range-checked, each text bounded and redacted, before it becomes part of a payload.
"""

from __future__ import annotations

from ..dgemma.wire import NAME_LIMIT, WireError, flag, integer, obj, text, value
from .access import token_of
from .http import Remote, RemoteError, RemoteRefusal
from .model import RemoteModel
from .pack import PackBackend
from .text import FramesBackend, VllmBackend, text_model
from .textstream import CANVAS_MAX, whole

DIALECTS = ("pack", "diffusion_frame", "vllm")
DIFFUSION_NAMES = ("diffusiongemma", "diffusion-gemma", "diffusion_gemma")
MAX_POSITIONS = 2**24      # the model's context window (the real model's: 16384)
MAX_VOCAB = 2**20          # ids (the real model's: 262,144)
TOKEN_CHARS = 256          # characters one id shows as (the real model's longest: 16)
CARD_TIMEOUT = 10.0        # seconds for /health and /v1/models
TOKENS_TIMEOUT = 60.0      # seconds for the token table (a few MB)


def dialect_of(card: dict) -> str | None:
    """This pack's server describes itself; vLLM and SGLang sign their model cards; Unsloth's shim signs its
    own, or the card names DiffusionGemma. None: the card is no diffusion engine's."""
    if isinstance(card.get("dgemma"), dict):
        return "pack"
    owner = str(card.get("owned_by", "")).lower()
    if owner in ("vllm", "sglang"):
        return "vllm"
    names = f"{card.get('id', '')} {card.get('root', '')}".lower()
    if owner == "unsloth" or "diffusion_canvas" in card or any(n in names for n in DIFFUSION_NAMES):
        return "diffusion_frame"
    return None


def not_a_diffusion_engine(url: str, card: dict) -> RemoteError:
    """The refusal of a plain OpenAI server, naming the card it showed."""
    seen = f"{str(card.get('id', ''))[:80]!r} owned by {str(card.get('owned_by', ''))[:40]!r}"
    return RemoteError(f"{url}/v1/models lists {seen}: no DiffusionGemma engine's card (no dgemma card, not vLLM or "
                       "SGLang, not Unsloth's shim, no DiffusionGemma in its name), and a plain OpenAI server sends "
                       "no denoising steps; serve the model with python -m serve, Unsloth's shim or vLLM")


def card_canvas(url: str, card: dict) -> int | None:
    """The canvas size a text dialect's card gives (range-checked); None when it gives none."""
    size = card.get("diffusion_canvas", card.get("canvas_length"))
    return None if size is None else whole(size, "the card's canvas size", 1, CANVAS_MAX, url)


def connect(url: str, token_env: str = "", model_id: str = "", should_cancel=None) -> RemoteModel:
    """The served model at `url` (the first listed, or `model_id`), with the token read from `token_env`.
    `should_cancel` is checked while waiting for the server (it may raise, or return True)."""
    remote = Remote(url, token_of(token_env), token_env)
    try:
        remote.call("GET", "/health", timeout=CARD_TIMEOUT, should_cancel=should_cancel)
        listed = remote.call("GET", "/v1/models", timeout=CARD_TIMEOUT, should_cancel=should_cancel)
    except RemoteRefusal as err:
        if err.status == 401:
            hint = f"set {token_env} to the server's token" if token_env else "name the env var holding the token"
            raise RemoteError(f"{remote.url} refused the token ({err.message}); {hint}") from None
        raise
    try:
        card = pick(remote, listed, model_id)
        dialect = dialect_of(card)
        if dialect is None:
            raise not_a_diffusion_engine(remote.url, card)
        if dialect != "pack":
            backend = VllmBackend(remote) if dialect == "vllm" else FramesBackend(remote)
            return text_model(remote.url, card, dialect, backend, card_canvas(remote.url, card))
        return pack_model(remote, card, should_cancel)
    except WireError as err:
        raise RemoteError(remote.redact(f"{remote.url} sent a bad model description, refused: {err}")) from None


def pick(remote: Remote, listed: dict, model_id: str) -> dict:
    cards = value(listed, "data", "/v1/models ")
    if not isinstance(cards, list) or len(cards) > 1000:
        raise WireError("/v1/models data", "a list of model cards", cards)
    cards = [c for c in cards if isinstance(c, dict) and (not model_id or c.get("id") == model_id)]
    if not cards:
        raise RemoteError(remote.redact(f"{remote.url}/v1/models lists no model"
                                        f"{' named ' + repr(model_id[:200]) if model_id else ''}"))
    text(cards[0], "id", 256, "card.")
    return cards[0]



def pack_model(remote: Remote, card: dict, should_cancel) -> RemoteModel:
    info, w = obj(card, "dgemma", "card."), "card.dgemma."
    canvas, vocab = integer(info, "canvas_length", 1, CANVAS_MAX, w), integer(info, "vocab_size", 1, MAX_VOCAB, w)
    positions = integer(info, "max_positions", 1, MAX_POSITIONS, w)
    names = {n: remote.redact(text(info, n, NAME_LIMIT, w)) if n in info else d
             for n, d in (("model_source", ""), ("quant", "none"), ("device", "?"), ("dtype", "unknown"))}
    strings = value(remote.call("GET", "/v1/dgemma/tokens", timeout=TOKENS_TIMEOUT, should_cancel=should_cancel),
                    "token_strings", "/v1/dgemma/tokens ")
    if not isinstance(strings, list) or len(strings) != vocab:
        raise WireError("token_strings", f"a list of vocab_size = {vocab} texts",
                        len(strings) if isinstance(strings, list) else strings)
    if not all(isinstance(s, str) and len(s) <= TOKEN_CHARS for s in strings):
        bad = next(s for s in strings if not (isinstance(s, str) and len(s) <= TOKEN_CHARS))
        raise WireError("token_strings", f"texts of at most {TOKEN_CHARS} characters", bad)
    return RemoteModel(url=remote.url, model_id=card["id"], dialect="pack", canvas_length=canvas,
                       max_positions=positions, token_strings=tuple(strings), source=names["model_source"],
                       quant=names["quant"], device=f"remote {names['device']}", dtype=names["dtype"],
                       vision=flag(info, "vision", w) if "vision" in info else False, backend=PackBackend(remote))
