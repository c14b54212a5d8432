"""HTTP to a remote engine with the standard library: JSON calls, and an SSE stream that can be cut.

Every wait (connect, send, the answer's headers, its body, the next chunk) happens on a helper
thread while the caller checks for an interrupt every `POLL` seconds and closes the connection at
once. Everything read is bounded (a line, an answer, the events of a run); a server that dies,
goes silent, redirects or answers out of shape is an error naming the URL, never a hang. Nothing
is retried, and the token never reaches a message (`access.redact`).
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import threading

from .access import checked_url, hide, redact, summary

POLL = 0.02              # seconds between interrupt checks while waiting
CONNECT_TIMEOUT = 10.0   # to open the connection
READ_TIMEOUT = 600.0     # the longest wait for an answer's headers, and the longest silence inside a stream
LINE_LIMIT = 4 * 2**20   # one SSE line: a step at the real canvas is ~10 kB, a run's end under 1 MB
ANSWER_LIMIT = 32 * 2**20  # one JSON answer: the real model's token table is ~5.6 MB
ERROR_LIMIT = 64 * 2**10   # an error answer's body: only its message is shown
EVENTS = 100_000         # SSE events of one stream when the caller names no cap
_END = object()


class RemoteError(RuntimeError):
    """The remote engine could not be reached, refused, or broke off."""


class RemoteRefusal(RemoteError):
    """An HTTP error answer (status, the server's message and the field it names), already redacted."""

    def __init__(self, url: str, status: int, message: str, param: str | None = None):
        super().__init__(f"{url} answered {status}: {message}")
        self.status, self.message, self.param = status, message, param


class Interrupted(Exception):
    """The caller's cancel check asked the request to stop; the connection is closed."""


class Remote:
    """One server: its base URL and the bearer token (held in memory only)."""

    def __init__(self, url: str, token: str = "", token_env: str = ""):
        url = url.rstrip("/")
        self.parts = checked_url(url, token, token_env)
        self.url, self.token = url, token

    def redact(self, text) -> str:
        return redact(text, self.token)

    def error(self, path: str, what: str) -> RemoteError:
        return RemoteError(self.redact(f"{self.url}{path} {what}"))

    def _connection(self, timeout: float):
        cls = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        return cls(self.parts.hostname, self.parts.port, timeout=timeout)

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    def _start_hint(self, err: BaseException) -> str:
        """What to do when nothing listens at the address: start this pack's server there."""
        if not isinstance(err, ConnectionRefusedError):
            return ""
        port = self.parts.port or 80
        flag = "" if port == 8190 else f" --port {port}"
        return f"; nothing listens there: start this pack's server with `python -m serve{flag}`, or give the URL " \
               "of a running one"

    def _open(self, method: str, path: str, body, should_cancel, timeout: float):
        """Connect, send and wait for the headers on a helper thread; the connection and a 2xx response."""
        conn, stop = self._connection(CONNECT_TIMEOUT), threading.Event()
        data = None if body is None else json.dumps(body).encode()

        def send():
            conn.connect()
            if stop.is_set():  # cancelled while connecting: send nothing
                raise Interrupted()
            conn.sock.settimeout(timeout)
            conn.request(method, self.parts.path + path, body=data, headers=self._headers())
            return conn.getresponse()

        try:
            response = _on_helper(send, conn, stop, should_cancel)
        except (OSError, http.client.HTTPException) as err:
            _close(conn)
            raise RemoteError(self.redact(f"cannot reach {self.url}{path}: {err}{self._start_hint(err)}")) from None
        try:
            if 300 <= response.status < 400:
                where = response.getheader("Location", "nowhere")
                raise self.error(path, f"answered {response.status}, redirecting to {where}; give the final URL")
            if response.status >= 400:
                text = self._read(conn, response, path, should_cancel, ERROR_LIMIT, cut=True)
                raise _refusal(self.url + path, response.status, text, self.token)
        except BaseException:
            _close(conn)
            raise
        return conn, response

    def _read(self, conn, response, path, should_cancel, limit: int, cut: bool = False) -> str:
        """The body, at most `limit` bytes (more is an error, or cut off when `cut`), token hidden."""
        stop = threading.Event()
        try:
            data = _on_helper(lambda: response.read(limit + 1), conn, stop, should_cancel)
        except (OSError, http.client.HTTPException) as err:
            raise self.error(path, f"broke off its answer: {err}") from None
        if len(data) > limit and not cut:
            raise self.error(path, f"sent an answer over {limit // 2**20} MiB; is it this pack's server, a "
                                   "diffusion_frame shim or vLLM?")
        return hide(data[:limit].decode("utf-8", "replace"), self.token)

    def call(self, method: str, path: str, body=None, timeout: float = READ_TIMEOUT, should_cancel=None,
             limit: int = ANSWER_LIMIT) -> dict:
        """A JSON request and its answer, a JSON object."""
        conn, response = self._open(method, path, body, should_cancel, timeout)
        try:
            answer = self._json(self._read(conn, response, path, should_cancel, limit), path)
        finally:
            _close(conn)
        if not isinstance(answer, dict):
            raise self.error(path, f"answered a JSON {type(answer).__name__} where an object belongs")
        return answer

    def _json(self, text: str, path: str):
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as err:
            raise self.error(path, f"sent a broken answer: {str(err)[:200]}") from None

    def stream(self, path: str, body: dict, should_cancel=None, max_events: int = EVENTS):
        """Yield each SSE `data:` payload (parsed JSON) until [DONE]; `should_cancel` cuts the stream;
        more than `max_events` events is an error."""
        conn, response = self._open("POST", path, body, should_cancel, READ_TIMEOUT)
        lines: queue.Queue = queue.Queue(maxsize=16)  # bounded: a fast server waits for a slow reader
        stop = threading.Event()
        threading.Thread(target=_pump, args=(self, path, response, lines, stop, max_events), daemon=True).start()
        try:
            while True:
                item = _next(lines, should_cancel)
                if item is _END:
                    raise self.error(path, "closed the stream before it ended")
                if isinstance(item, RemoteError):
                    raise item
                if isinstance(item, BaseException):
                    raise self.error(path, f"broke off the stream: {item}")
                if item == "[DONE]":
                    return
                yield self._json(item, path)
        finally:
            stop.set()
            _close(conn)


def _on_helper(work, conn, stop: threading.Event, should_cancel):
    """`work()` run on a helper thread, checking `should_cancel` meanwhile: a cancel (True, or an
    exception it raises) sets `stop`, closes the connection, which ends any wait of `work`, and raises."""
    box: queue.Queue = queue.Queue(maxsize=1)

    def run():
        try:
            box.put((True, work()))
        except BaseException as err:  # noqa: B036 - handed to the waiting thread, which raises it
            box.put((False, err))

    threading.Thread(target=run, daemon=True).start()
    try:
        ok, value = _next(box, should_cancel)
    except BaseException:
        stop.set()
        _close(conn)
        raise
    if not ok:
        raise value
    return value


def _next(items: queue.Queue, should_cancel):
    """The next item, checking for an interrupt before each wait (it may raise, or return True)."""
    while True:
        if should_cancel is not None and should_cancel():
            raise Interrupted()
        try:
            return items.get(timeout=POLL)
        except queue.Empty:
            pass


def _pump(remote: Remote, path: str, response, lines: queue.Queue, stop: threading.Event, max_events: int) -> None:
    """Read SSE lines on a helper thread, each at most LINE_LIMIT bytes; hands on each `data:` payload
    (token hidden), then _END, or the error that stopped it."""

    def put(item) -> None:
        while not stop.is_set():
            try:
                return lines.put(item, timeout=POLL)
            except queue.Full:
                pass

    events, others = 0, 0
    try:
        while not stop.is_set():
            raw = response.readline(LINE_LIMIT + 1)
            if not raw:
                return put(_END)
            if len(raw) > LINE_LIMIT:
                return put(remote.error(path, f"sent a line over {LINE_LIMIT // 2**20} MiB; the longest a "
                                              "run needs is under 1 MB"))
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("data:"):
                events += 1
                if events > max_events:
                    return put(remote.error(path, f"sent more than {max_events} events for one run"))
                put(hide(line[5:].strip(), remote.token))
            else:
                others += 1
                if others > 2 * max_events + 16:  # the blank line after each event, and a few comments
                    return put(remote.error(path, f"sent more than {others - 1} lines that are not events"))
    except BaseException as err:  # noqa: B036 - handed to the reading thread, which raises it
        put(err)


def _close(conn) -> None:
    """Close at once, also when the helper thread is blocked reading."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    conn.close()


def _refusal(url: str, status: int, text: str, token: str) -> RemoteRefusal:
    """The error answer's status and a summary of its message (and the field it names), from an
    OpenAI-style error object or the text; never the body itself, which may echo the token encoded."""
    try:
        err = json.loads(text).get("error") or {}
        message = err.get("message") if isinstance(err, dict) else err
        param = err.get("param") if isinstance(err, dict) else None
    except (ValueError, AttributeError, RecursionError):
        message, param = None, None
    message = summary(message if isinstance(message, str) and message else text.strip(), token) or "(no message)"
    return RemoteRefusal(url, status, message, param if isinstance(param, str) and len(param) <= 64 else None)
