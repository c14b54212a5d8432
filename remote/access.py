"""Which token a workflow may read, where it may be sent, and how secrets are kept out of messages.

A workflow is shared and may be hostile: it names the URL and the token's environment variable.
So which variables it may name, and whether a token may cross plain http, are set by the user
in the ComfyUI process's environment, never by a workflow input.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from urllib.parse import urlsplit

from ..dgemma.errors import InputError, short

TOKEN_VARS = "DGEMMA_REMOTE_TOKEN_VARS"        # more variable names token_env may read, comma-separated
ALLOW_HTTP = "DGEMMA_REMOTE_ALLOW_HTTP_TOKEN"  # "1": a token may go over plain http to another machine
PREFIX = "DGEMMA_"
MIN_TOKEN = 8  # shorter tokens are guessable, and could not be told apart from text when they are hidden
HIDDEN = "[redacted]"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,15}://)[^/?#\s@]*@")
TOKEN_RULE = (f"token_env may name a variable starting with {PREFIX}, or one listed (comma-separated) in "
              f"{TOKEN_VARS} in ComfyUI's environment")


def token_names() -> set[str]:
    return {n.strip() for n in os.environ.get(TOKEN_VARS, "").split(",") if n.strip()}


def token_of(token_env: str) -> str:
    """The bearer token in the variable `token_env` names ("" for none), once the name is allowed."""
    if not token_env:
        return ""
    if not _NAME.fullmatch(token_env) or not (token_env.startswith(PREFIX) or token_env in token_names()):
        raise InputError("token_env", f"token_env {short(token_env)} is not a variable this loader may read: "
                                      f"{TOKEN_RULE}. Put the token in DGEMMA_REMOTE_TOKEN, say, and name that")
    token = os.environ.get(token_env, "")
    if token and not (token.isascii() and token.isprintable() and " " not in token):
        raise InputError("token_env", f"the token in {token_env} has characters an HTTP header cannot carry "
                                      "(spaces, control or non-ASCII characters); use a random ASCII token")
    if token and len(token) < MIN_TOKEN:
        raise InputError("token_env", f"the token in {token_env} has {len(token)} characters; use a random one of "
                                      f"at least {MIN_TOKEN} (python -c \"import secrets; "
                                      "print(secrets.token_urlsafe(24))\") on the server and here")
    return token


def is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def checked_url(url: str, token: str = "", token_env: str = ""):
    """The URL's parts; refuses another scheme, URL credentials and a token over plain http to another host.

    Credentials in the URL are refused rather than sent as Basic auth: the URL is a workflow input,
    saved in the workflow and in every picture's metadata, which is what token_env exists to avoid.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing it refuses a bad port
    except ValueError as err:
        raise InputError("url", f"url {short(redact(url))} is not a URL ({err}); give http://host:port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c in url for c in "\r\n\t "):
        raise InputError("url", f"url {short(redact(url))} must be http://host:port or https://host:port")
    if "@" in parts.netloc:
        raise InputError("url", f"url {short(redact(url))} carries credentials (user:password@); remove them, and "
                                "put the server's bearer token in an environment variable named in token_env")
    if token and parts.scheme == "http" and not is_loopback(parts.hostname) and os.environ.get(ALLOW_HTTP) != "1":
        raise InputError("url", f"url {short(url)} is plain http to another machine, and the token in {token_env} "
                                f"would cross the network readable; use https://, or set {ALLOW_HTTP}=1 in "
                                "ComfyUI's environment if that network is trusted")
    return parts


def hide(text: str, token: str) -> str:
    """`text` with the token (as written, and as JSON escapes it) replaced."""
    if not token:
        return text
    for form in {token, json.dumps(token)[1:-1]}:
        text = text.replace(form, HIDDEN)
    return text


def redact(text, token: str = "", limit: int = 600) -> str:
    """The one filter for every URL or server text that becomes a message: URL credentials stripped,
    the token hidden, cut to `limit` characters."""
    text = hide(_USERINFO.sub(r"\1", str(text)), token)
    return text if len(text) <= limit else text[:limit] + "…"
