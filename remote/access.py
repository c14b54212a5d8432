"""Which token a workflow may read, where it may be sent, and how secrets are kept out of messages.

A workflow is shared and may be hostile: it names the URL and the token's environment variable.
So which variables it may name, and whether a token may cross plain http, are set by the user
in the ComfyUI process's environment, never by a workflow input.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import os
import re
from urllib.parse import quote, urlsplit

from ..dgemma.errors import InputError, short

TOKEN_VARS = "DGEMMA_REMOTE_TOKEN_VARS"        # more variable names token_env may read, comma-separated
ALLOW_HTTP = "DGEMMA_REMOTE_ALLOW_HTTP_TOKEN"  # "1": a token may go over plain http to another machine
PREFIX = "DGEMMA_"
MIN_TOKEN = 8  # shorter tokens are guessable, and could not be told apart from text when they are hidden
HIDDEN = "[redacted]"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,15}://)[^/?#\s@]*@")
_URL_TAIL = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]{0,15}://[^\s?#]*)[?#][^\s'\"]*")
_WORD = re.compile(r"[A-Za-z0-9+/=_\-.~%]+")
WINDOW = 6  # a run of this many characters of the token, in any encoding, is hidden with the word holding it
SUMMARY = 200  # characters of a server's error message that may be shown
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
    if "?" in url or "#" in url:  # a key in ?api_key= or #token= would be saved in the workflow and shown
        raise InputError("url", f"url {short(redact(url))} carries a query string or fragment (?… or #…); give "
                                "just http(s)://host:port[/path], and put a credential in an environment variable "
                                "named in token_env")
    if token and parts.scheme == "http" and not is_loopback(parts.hostname) and os.environ.get(ALLOW_HTTP) != "1":
        raise InputError("url", f"url {short(url)} is plain http to another machine, and the token in {token_env} "
                                f"would cross the network readable; use https://, or set {ALLOW_HTTP}=1 in "
                                "ComfyUI's environment if that network is trusted")
    return parts


@functools.lru_cache(maxsize=8)  # every line of a stream is filtered: the forms are made once per token
def encodings(token: str) -> frozenset[str]:
    """The token as a server could echo it: raw, JSON-escaped, URL-encoded, hex, and base64 (alone, and
    the part that stays the same whatever precedes it, as in a Basic or Bearer header encoded whole)."""
    raw = token.encode()
    forms = {token, json.dumps(token)[1:-1], quote(token, safe=""), raw.hex()}
    forms.add(base64.b64encode(raw).decode().rstrip("="))
    for lead in range(3):  # only the characters of whole 3-byte groups that hold the token's bytes alone
        coded = base64.b64encode(b"\0" * lead + raw).decode()
        forms.add(coded[(0, 2, 3)[lead]:4 * ((lead + len(raw)) // 3)])
    for form in list(forms):
        forms.add(form.replace("+", "-").replace("/", "_"))  # urlsafe base64
    return frozenset(f for f in forms if f)


def hide(text: str, token: str) -> str:
    """`text` with the token, in each of its encodings, replaced."""
    if not token:
        return text
    for form in sorted(encodings(token), key=len, reverse=True):
        text = text.replace(form, HIDDEN)
    return text


def hide_parts(text: str, token: str) -> str:
    """`text` with every word that holds WINDOW characters of the token, in any encoding, replaced:
    an error message must not leak part of a token either."""
    if not token:
        return text
    windows = {f[i:i + WINDOW] for f in encodings(token) for i in range(max(1, len(f) - WINDOW + 1))}
    size = min(len(w) for w in windows)
    return hide(_WORD.sub(lambda m: HIDDEN if any(m[0][i:i + size] in windows for i in range(len(m[0]) - size + 1))
                          else m[0], text), token)


def shown_url(text: str) -> str:
    """`text` with every URL's credentials, query string and fragment taken out."""
    return _URL_TAIL.sub(r"\1", _USERINFO.sub(r"\1", str(text)))


def redact(text, token: str = "", limit: int = 600) -> str:
    """The one filter for every URL or server text that becomes a message: URL credentials, query and
    fragment stripped, the token (and any part of it, in any encoding) hidden, cut to `limit` characters."""
    text = hide_parts(shown_url(text), token)
    return text if len(text) <= limit else text[:limit] + "…"


def summary(text: str, token: str) -> str:
    """A bounded, one-line summary of a server's error text: printable characters only, token hidden."""
    line = " ".join("".join(c if c.isprintable() else " " for c in str(text)[:4 * SUMMARY]).split())
    return redact(line, token, SUMMARY)
