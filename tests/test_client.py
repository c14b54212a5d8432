"""`python -m headless --server`: submit, follow the websocket, report outputs (against a fake ComfyUI)."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading

from diffusiongemma.runner.client import submit

PROMPT_ID = "p-1"
EVENTS = [
    {"type": "status", "data": {"status": {}}},
    {"type": "execution_start", "data": {"prompt_id": PROMPT_ID}},
    {"type": "dgemma.step", "data": {"node": "2", "step": 0, "prompt_id": PROMPT_ID, "tokens": ["x" * 200] * 2}},
    {"type": "executing", "data": {"node": "2", "prompt_id": "someone-else"}},
    {"type": "execution_success", "data": {"prompt_id": PROMPT_ID}},
    {"type": "executing", "data": {"node": None, "prompt_id": PROMPT_ID}},
]


def _frame(payload: bytes) -> bytes:
    head = bytes([0x81, 126]) + len(payload).to_bytes(2, "big") if len(payload) > 125 else bytes([0x81, len(payload)])
    return head + payload


def _serve(server: socket.socket, events=EVENTS) -> None:
    """Answer the three requests a client makes: the websocket, POST /prompt, GET /history."""
    for _ in range(3):
        conn, _ = server.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(4096)
        line = request.split(b"\r\n", 1)[0].decode()
        if "/ws?" in line:
            key = [h.split(b": ")[1] for h in request.split(b"\r\n") if h.lower().startswith(b"sec-websocket-key")][0]
            accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            threading.Thread(target=_stream, args=(conn, events), daemon=True).start()
            continue
        body = {"prompt_id": PROMPT_ID, "number": 0, "node_errors": {}} if line.startswith("POST") else \
            {PROMPT_ID: {"outputs": {"3": {"text": ["seven"]}}, "status": {"status_str": "success"}}}
        data = json.dumps(body).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(data)).encode() + b"\r\nConnection: close\r\n\r\n" + data)
        conn.close()


def _stream(conn, events) -> None:
    """Send the events, then drop the connection (a server that stops mid-run sends no final event)."""
    import time

    time.sleep(0.2)  # after the client has posted its prompt
    for event in events:
        conn.sendall(_frame(json.dumps(event).encode()))
    time.sleep(0.2)
    conn.close()


def test_submit_follows_its_prompt_and_returns_the_outputs():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=_serve, args=(server,), daemon=True).start()
    seen = []
    code, outputs = submit({"1": {}}, f"http://127.0.0.1:{server.getsockname()[1]}", 10,
                           lambda kind, data: seen.append(kind))
    assert code == 0 and outputs == {"3": {"text": ["seven"]}}
    assert seen == ["status", "execution_start", "dgemma.step", "execution_success", "executing"]
