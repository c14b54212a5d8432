"""Fake hostile servers for the remote loader's tests: a real HTTP server on loopback whose answers
the test writes byte by byte, a socket that accepts and never answers, and a pack-dialect server
that replays a stream recorded from `python -m serve` on the demo, as the test changes it."""

from __future__ import annotations

import functools
import http.client
import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

PROMPT = "What is 3+4?"


@contextmanager
def serving(answer):
    """An HTTP/1.0 server on loopback; `answer(handler)` writes each answer. Yields its URL and the
    requests it received: (method, path, headers, body)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def handle_one(self):
            length = int(self.headers.get("Content-Length") or 0)
            seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
            try:
                answer(self)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client hung up, as it should on a hostile answer

        do_GET = do_POST = handle_one

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def send(handler, body, status: int = 200, headers: dict | None = None, kind: str = "application/json") -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", kind)
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def send_events(handler, events) -> None:
    """An SSE answer without a length (HTTP/1.0: it ends when the connection closes)."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    for event in events:
        data = event if isinstance(event, str) else json.dumps(event)
        handler.wfile.write(f"data: {data}\n\n".encode())
        handler.wfile.flush()


@contextmanager
def silent():
    """A TCP socket on loopback that accepts connections and never answers; yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held, stop = [], threading.Event()

    def accept():
        sock.settimeout(0.05)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        sock.close()


def _get(url: str, method: str, path: str, body=None) -> bytes:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200, response.status
        return response.read()
    finally:
        conn.close()


@functools.lru_cache(maxsize=1)
def recording() -> dict:
    """A real run of `python -m serve` on the demo, once per test process: its model list, token table,
    and the stream (parsed events, then "[DONE]") answering what the remote Sampler sends for `knobs`."""
    from remote_server import served

    from diffusiongemma.dgemma.inputs.knobs import Knobs
    from diffusiongemma.remote.connect import connect

    knobs = dict(Knobs().asdict(), num_inference_steps=16, gen_length=32, seed=3, thinking=True)
    with served() as (url, _):
        model = connect(url)
        body = model.backend.body(model, PROMPT, Knobs(**knobs), None, None, False, None)
        text = _get(url, "POST", "/v1/chat/completions", body).decode()
        out = {"models": json.loads(_get(url, "GET", "/v1/models")), "knobs": knobs,
               "tokens": json.loads(_get(url, "GET", "/v1/dgemma/tokens"))}
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    out["events"] = [json.loads(e) for e in events[:-1]] + [events[-1]]
    return out


def pack_answer(models: dict, tokens: dict, events: list):
    """The `answer` of a pack-dialect server replaying these (possibly changed) answers."""
    def answer(handler):
        path = handler.path
        if path == "/health":
            send(handler, {"status": "ok", "busy": 0})
        elif path == "/v1/models":
            send(handler, models)
        elif path == "/v1/dgemma/tokens":
            send(handler, tokens)
        elif path == "/v1/chat/completions":
            send_events(handler, events)
        else:
            send(handler, {"error": {"message": "no such path"}}, status=404)
    return answer


def frames(rec):
    return [e for e in rec["events"] if isinstance(e, dict) and e.get("type") == "diffusion_frame"]


def final(rec):
    return next(e for e in rec["events"] if isinstance(e, dict) and "state" in e.get("dgemma", {}))["dgemma"]


def card(rec):
    return rec["models"]["data"][0]["dgemma"]


def step(rec, i=0):
    return frames(rec)[i]["dgemma"]
