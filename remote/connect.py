"""Connect to a remote engine: check /health and /v1/models, find its dialect, build the model payload."""

from __future__ import annotations

import os

from .http import Remote, RemoteError, RemoteRefusal
from .model import RemoteModel
from .pack import PackBackend
from .text import FramesBackend, VllmBackend, text_model

DIALECTS = ("pack", "diffusion_frame", "vllm")


def dialect_of(card: dict) -> str:
    """This pack's server describes itself; vLLM and SGLang sign their model cards; else the shim's frames."""
    if isinstance(card.get("dgemma"), dict):
        return "pack"
    if str(card.get("owned_by", "")).lower() in ("vllm", "sglang"):
        return "vllm"
    return "diffusion_frame"


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
    if dialect != "pack":
        backend = VllmBackend(remote) if dialect == "vllm" else FramesBackend(remote)
        return text_model(url, card, dialect, backend)
    info = card["dgemma"]
    strings = tuple(remote.call("GET", "/v1/dgemma/tokens")["token_strings"])
    return RemoteModel(url=url, model_id=card["id"], dialect=dialect, canvas_length=int(info["canvas_length"]),
                       max_positions=int(info["max_positions"]), token_strings=strings,
                       source=info.get("model_source", ""), quant=info.get("quant", "none"),
                       device=f"remote {info.get('device', '?')}", dtype=info.get("dtype", "unknown"),
                       vision=bool(info.get("vision")), backend=PackBackend(remote))
