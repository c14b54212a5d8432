"""A plain http.client caller for the server tests: it sends exactly the headers it is given."""

from __future__ import annotations

import http.client
import json
import socket
from urllib.parse import urlsplit

JSON = {"Content-Type": "application/json"}


def ask(url: str, method: str, path: str, body=None, headers: dict | None = None):
    """(status, parsed JSON or text, headers). A dict body is sent as JSON with Content-Type application/json
    unless `headers` names another; bytes go as they are."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    if isinstance(body, (dict, list)):
        body, headers = json.dumps(body).encode(), {**JSON, **(headers or {})}
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        text = response.read().decode("utf-8", "replace")
        try:
            answer = json.loads(text)
        except ValueError:
            answer = text
        return response.status, answer, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def raw_exchange(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` on a fresh socket and read until the server closes or the answer's head and body are in."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk
            head, _, body = out.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                return out


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def health(url: str) -> dict:
    status, answer, _ = ask(url, "GET", "/health")
    assert status == 200, answer
    return answer
