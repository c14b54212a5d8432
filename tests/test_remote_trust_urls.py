"""The remote loader's URL and a server's error text: credentials only through token_env, and no part
of the token, in any encoding a server could echo it in, reaching a message."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest
from executor import call
from hostile_server import send, serving

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.remote.access import redact
from diffusiongemma.remote.http import RemoteError

Loader = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"]
SECRET = "tok-9f8e7d6c5b4a3210"


@pytest.mark.parametrize("tail", [f"?api_key={SECRET}", f"/v1?key={SECRET}", f"#token={SECRET}", "?", "#"])
def test_a_url_with_a_query_or_fragment_is_refused_by_name_before_any_traffic(tail):
    with serving(lambda h: send(h, {"status": "ok"})) as (url, seen):
        with pytest.raises(InputError) as caught:
            call(Loader, url=url + tail)
    message = str(caught.value)
    assert caught.value.name == "url" and "query string or fragment" in message and "token_env" in message
    assert SECRET not in message and url in message and seen == []


def test_urls_in_any_message_are_shown_without_credentials_query_or_fragment():
    shown = redact(f"cannot reach http://me:{SECRET}@h:1/v1?api_key={SECRET}#t={SECRET} now")
    assert shown == "cannot reach http://h:1/v1 now"


def header_echo(kind: str):
    """A server whose refusal quotes the Authorization header it got, encoded as `kind`."""
    def answer(handler):
        auth = handler.headers.get("Authorization", "")
        said = {"raw": auth, "base64": base64.b64encode(auth.encode()).decode(),
                "basic": base64.b64encode(f"user:{SECRET}".encode()).decode(), "url": quote(auth, safe=""),
                "half": SECRET[: len(SECRET) // 2], "b64 token": base64.b64encode(SECRET.encode()).decode(),
                "hex": SECRET.encode().hex()}[kind]
        send(handler, {"error": {"message": f"bad credentials {said}; see <html>{'x' * 5000}"}}, status=401)
    return answer


@pytest.mark.parametrize("kind", ["raw", "base64", "basic", "url", "half", "b64 token", "hex"])
def test_an_error_body_never_echoes_any_part_of_the_token_in_any_encoding(monkeypatch, kind):
    monkeypatch.setenv("DGEMMA_T", SECRET)
    with serving(header_echo(kind)) as (url, _):
        with pytest.raises(RemoteError) as caught:
            call(Loader, url=url, token_env="DGEMMA_T")
    message = str(caught.value)
    header = base64.b64encode(f"Bearer {SECRET}".encode()).decode()[12:-4]  # the characters of the token alone
    forms = [SECRET, quote(SECRET, safe=""), base64.b64encode(SECRET.encode()).decode().rstrip("="), header]
    pieces = {f[i:i + 6] for f in forms for i in range(len(f) - 5)}
    assert "refused the token" in message
    assert not [p for p in pieces if p in message], message
    assert len(message) < 500 and "x" * 300 not in message  # a bounded summary, not the body
