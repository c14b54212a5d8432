"""Connect to a remote engine: check /health and /v1/models, find its dialect, build the model payload."""

from __future__ import annotations

import os

from .http import Remote, RemoteError, RemoteRefusal
from .model import RemoteModel
from .pack import PackBackend
from .text import FramesBackend, VllmBackend, text_model
from .textstream import CANVAS_MAX, whole

DIALECTS = ("pack", "diffusion_frame", "vllm")
DIFFUSION_NAMES = ("diffusiongemma", "diffusion-gemma", "diffusion_gemma")


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
    value = card.get("diffusion_canvas", card.get("canvas_length"))
    return None if value is None else whole(value, "the card's canvas size", 1, CANVAS_MAX, url)


def connect(url: str, token_env: str = "", model_id: str = "") -> RemoteModel:
    """The served model at `url` (the first listed, or `model_id`), with the token read from `token_env`."""
    token = os.environ.get(token_env, "") if token_env else ""
    remote = Remote(url, token)
    try:
        remote.call("GET", "/health", timeout=10)
        cards = remote.call("GET", "/v1/models", timeout=10).get("data") or []
    except RemoteRefusal as err:
        if err.status == 401:
            hint = f"set {token_env} to the server's token" if token_env else "name the env var holding the token"
            raise RemoteError(f"{url} refused the token ({err.message}); {hint}") from None
        raise
    cards = [c for c in cards if isinstance(c, dict) and (not model_id or c.get("id") == model_id)]
    if not cards:
        raise RemoteError(f"{url}/v1/models lists no model{' named ' + repr(model_id) if model_id else ''}")
    card = cards[0]
    dialect = dialect_of(card)
    if dialect is None:
        raise not_a_diffusion_engine(url, card)
    if dialect != "pack":
        backend = VllmBackend(remote) if dialect == "vllm" else FramesBackend(remote)
        return text_model(url, card, dialect, backend, card_canvas(url, card))
    info = card["dgemma"]
    strings = tuple(remote.call("GET", "/v1/dgemma/tokens")["token_strings"])
    return RemoteModel(url=url, model_id=card["id"], dialect=dialect, canvas_length=int(info["canvas_length"]),
                       max_positions=int(info["max_positions"]), token_strings=strings,
                       source=info.get("model_source", ""), quant=info.get("quant", "none"),
                       device=f"remote {info.get('device', '?')}", dtype=info.get("dtype", "unknown"),
                       vision=bool(info.get("vision")), backend=PackBackend(remote))
