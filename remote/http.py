"""HTTP to a remote engine with the standard library: JSON calls, and an SSE stream that can be cut.

The stream is read on a helper thread so the caller can check for an interrupt between chunks
(every `POLL` seconds) and close the connection at once; a server that dies or goes silent is
an error naming the URL, never a hang. Nothing is retried.
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading
from urllib.parse import urlsplit

POLL = 0.02          # seconds between interrupt checks while waiting for the next chunk
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 600.0  # a silent server (no chunk for this long) is an error
_END = object()


class RemoteError(RuntimeError):
    """The remote engine could not be reached, refused, or broke off."""


class RemoteRefusal(RemoteError):
    """An HTTP error answer (status, the server's message and the field it names)."""

    def __init__(self, url: str, status: int, message: str, param: str | None = None):
        super().__init__(f"{url} answered {status}: {message}")
        self.status, self.message, self.param = status, message, param


class Interrupted(Exception):
    """The caller's cancel check asked the stream to stop; the connection is closed."""


class Remote:
    """One server: its base URL and the bearer token (held in memory only)."""

    def __init__(self, url: str, token: str = ""):
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r} must be http://host:port or https://host:port")
        self.url, self.parts, self.token = url.rstrip("/"), parts, token

    def _connection(self, timeout: float):
        cls = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        return cls(self.parts.hostname, self.parts.port, timeout=timeout)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _open(self, method: str, path: str, body=None, timeout: float = READ_TIMEOUT):
        conn = self._connection(CONNECT_TIMEOUT)
        data = None if body is None else json.dumps(body).encode()
        try:
            conn.connect()
            conn.sock.settimeout(timeout)
            conn.request(method, self.parts.path + path, body=data, headers=self._headers())
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise RemoteError(f"cannot reach {self.url}{path}: {err}") from None
        if response.status >= 400:
            text = response.read().decode("utf-8", "replace")
            conn.close()
            raise _refusal(self.url + path, response.status, text)
        return conn, response

    def call(self, method: str, path: str, body=None, timeout: float = READ_TIMEOUT):
        """A JSON request and its JSON answer."""
        conn, response = self._open(method, path, body, timeout)
        try:
            return json.loads(response.read())
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise RemoteError(f"{self.url}{path} sent a broken answer: {err}") from None
        finally:
            conn.close()

    def stream(self, path: str, body: dict, should_cancel=None):
        """Yield each SSE `data:` payload (parsed JSON) until [DONE]; `should_cancel` cuts the stream."""
        conn, response = self._open("POST", path, body)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(response, lines), daemon=True).start()
        try:
            while True:
                item = _next(lines, should_cancel)
                if item is _END:
                    raise RemoteError(f"{self.url}{path} closed the stream before it ended")
                if isinstance(item, BaseException):
                    raise RemoteError(f"{self.url}{path} broke off the stream: {item}")
                if item == "[DONE]":
                    return
                yield json.loads(item)
        finally:
            _close(conn)


def _next(lines: queue.Queue, should_cancel):
    """The next item, checking for an interrupt before each wait (it may raise, or return True)."""
    while True:
        if should_cancel is not None and should_cancel():
            raise Interrupted()
        try:
            return lines.get(timeout=POLL)
        except queue.Empty:
            pass


def _pump(response, lines: queue.Queue) -> None:
    """Read SSE lines on a helper thread; ends with _END, or the error that stopped it."""
    try:
        for raw in response:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("data:"):
                lines.put(line[5:].strip())
        lines.put(_END)
    except BaseException as err:  # noqa: B036 - handed to the reading thread, which raises it
        lines.put(err)


def _close(conn) -> None:
    """Close at once, also when the helper thread is blocked reading."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


def _refusal(url: str, status: int, text: str) -> RemoteRefusal:
    try:
        err = json.loads(text).get("error") or {}
        message = err.get("message") if isinstance(err, dict) else str(err)
        param = err.get("param") if isinstance(err, dict) else None
    except (ValueError, AttributeError):
        message, param = text.strip()[:500], None
    return RemoteRefusal(url, status, message or text.strip()[:500], param)
