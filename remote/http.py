"""HTTP to a remote engine with the standard library: JSON calls, and an SSE stream that can be cut.

Every wait can be cut: connect, send, the answer's headers and a JSON body wait on a helper thread while
the caller checks for an interrupt every `POLL` seconds; a stream's lines are read by the caller while a
watcher makes that check. Either closes the connection at once. Everything read is bounded (a line, an
answer, the events of a run); a server that dies, goes silent, redirects or answers out of shape is an error
naming the URL, never a hang. Nothing is retried, and the token never reaches a message (`access.redact`).
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
        more than `max_events` events is an error. The lines are read in the caller's thread (a hand-off
        per line to a reader thread cost more than the parsing); a watcher closes the connection when
        `should_cancel` says so, which ends a blocked read at once."""
        conn, response = self._open("POST", path, body, should_cancel, READ_TIMEOUT)
        watch = _Watch(conn, should_cancel)
        try:
            for item in _events(self, path, response, max_events):
                watch.check()
                if item == "[DONE]":
                    return
                yield self._json(item, path)
                watch.check()  # before the next read blocks: a cancel made while handling this event
            watch.check()
            raise self.error(path, "closed the stream before it ended")
        except (OSError, http.client.HTTPException, ValueError) as err:
            watch.check()  # a cancel closed the connection under the read
            raise self.error(path, f"broke off the stream: {err}") from None
        finally:
            watch.stop()
            _close(conn)


class _Watch:
    """Checks `should_cancel` every POLL seconds on a helper thread while the reading thread may be blocked; a
    cancel (True, or an exception it raises) shuts the connection, and `check()` in the reading thread raises
    Interrupted or that exception."""

    def __init__(self, conn, should_cancel):
        self.conn, self.should_cancel, self.fired = conn, should_cancel, None
        self.done = threading.Event()
        if should_cancel is not None:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.done.wait(POLL):
            try:
                if not self.should_cancel():
                    continue
                self.fired = Interrupted()
            except BaseException as err:  # noqa: B036 - raised in the reading thread by check()
                self.fired = err
            _shut(self.conn)  # the read ends at once; the reading thread closes the rest (http.client is not
            return            # safe to close from two threads)

    def check(self) -> None:
        """In the reading thread, between lines: the watcher's cancel, or the caller's own check now."""
        if self.fired is not None:
            raise self.fired
        if self.should_cancel is not None and self.should_cancel():
            raise Interrupted()

    def stop(self) -> None:
        self.done.set()


def _on_helper(work, conn, stop: threading.Event, should_cancel):
    """`work()` run on a helper thread, checking `should_cancel` meanwhile: a cancel (True, or an
    exception it raises) sets `stop`, closes the connection, which ends any wait of `work`, and raises."""
    if should_cancel is None:  # nothing can cut the wait: no thread to start
        return work()
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


def _events(remote: Remote, path: str, response, max_events: int):
    """Each SSE `data:` payload (token hidden), each line at most LINE_LIMIT bytes, until the stream ends."""
    events, others = 0, 0
    while True:
        raw = response.readline(LINE_LIMIT + 1)
        if not raw:
            return
        if len(raw) > LINE_LIMIT:
            raise remote.error(path, f"sent a line over {LINE_LIMIT // 2**20} MiB; the longest a run needs is "
                                     "under 1 MB")
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            events += 1
            if events > max_events:
                raise remote.error(path, f"sent more than {max_events} events for one run")
            yield hide(line[5:].strip(), remote.token)
        else:
            others += 1
            if others > 2 * max_events + 16:  # the blank line after each event, and a few comments
                raise remote.error(path, f"sent more than {others - 1} lines that are not events")


def _shut(conn) -> None:
    """End any blocked read or write on the connection's socket."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _close(conn) -> None:
    """Close at once, also when the helper thread is blocked reading."""
    _shut(conn)
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
