"""Connect to a remote engine: check /health and /v1/models, find its dialect (remote/dialects.py), build
the model payload. The card comes from a server that may be hostile: it is bounded before it is read.
"""

from __future__ import annotations

from ..dgemma.readouts.wire import OWNER, WireError, text, value
from .access import token_of
from .dialects import DIALECTS, dialect_of, listed
from .http import Remote, RemoteError, RemoteRefusal
from .model import RemoteModel

CARD_TIMEOUT = 10.0        # seconds for /health and /v1/models


def not_a_diffusion_engine(url: str, card: dict) -> RemoteError:
    """The refusal of a plain OpenAI server, naming the card it showed and what each dialect looks for."""
    seen = f"{str(card.get('id', ''))[:80]!r} owned by {str(card.get(OWNER, ''))[:40]!r}"
    marks = ", ".join(d.mark for d in DIALECTS.values())
    return RemoteError(f"{url}/v1/models lists {seen}: no DiffusionGemma engine's card ({marks}), and a plain OpenAI "
                       "server sends no denoising steps; serve the model with "
                       f"{listed(d.serve_with for d in DIALECTS.values())}")


def connect(url: str, token_env: str = "", model_id: str = "", should_cancel=None) -> RemoteModel:
    """The served model at `url` (the first listed, or `model_id`), with the token read from `token_env`.
    `should_cancel` is checked while waiting for the server (it may raise, or return True)."""
    remote = Remote(url, token_of(token_env), token_env)
    try:
        remote.call("GET", "/health", timeout=CARD_TIMEOUT, should_cancel=should_cancel)
        models = remote.call("GET", "/v1/models", timeout=CARD_TIMEOUT, should_cancel=should_cancel)
    except RemoteRefusal as err:
        if err.status == 401:
            hint = f"set {token_env} to the server's token" if token_env else "name the env var holding the token"
            raise RemoteError(f"{remote.url} refused the token ({err.message}); {hint}") from None
        raise
    try:
        card = pick(remote, models, model_id)
        dialect = dialect_of(card)
        if dialect is None:
            raise not_a_diffusion_engine(remote.url, card)
        return dialect.model(remote, card, should_cancel)
    except WireError as err:
        raise RemoteError(remote.redact(f"{remote.url} sent a bad model description, refused: {err}")) from None


def pick(remote: Remote, models: dict, model_id: str) -> dict:
    cards = value(models, "data", "/v1/models ")
    if not isinstance(cards, list) or len(cards) > 1000:
        raise WireError("/v1/models data", "a list of model cards", cards)
    cards = [c for c in cards if isinstance(c, dict) and (not model_id or c.get("id") == model_id)]
    if not cards:
        raise RemoteError(remote.redact(f"{remote.url}/v1/models lists no model"
                                        f"{' named ' + repr(model_id[:200]) if model_id else ''}"))
    text(cards[0], "id", 256, "card.")
    return cards[0]
