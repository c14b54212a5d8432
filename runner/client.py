"""Submit an API graph to a running ComfyUI and follow it over the websocket (stdlib only)."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid


class Socket:
    """The client side of RFC 6455, enough to read ComfyUI's JSON events."""

    def __init__(self, url: str, timeout: float):
        parts = urllib.parse.urlparse(url)
        self.sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           ).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("the server closed the websocket handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket refused: {head.splitlines()[0].decode(errors='replace')}")

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("websocket closed")
            data += chunk
        return data

    def _send(self, opcode: int, payload: bytes = b"") -> None:
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def messages(self):
        """Yield each text message as parsed JSON; binary previews are skipped."""
        buffer, kind = b"", None
        while True:
            first, second = self._exact(2)
            length = second & 0x7F
            if length == 126:
                length = struct.unpack(">H", self._exact(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(length)
            opcode = first & 0x0F
            if opcode == 8:
                return
            if opcode == 9:
                self._send(10, payload)
                continue
            if opcode in (1, 2):
                buffer, kind = payload, opcode
            elif opcode == 0:
                buffer += payload
            if first & 0x80 and kind == 1:
                yield json.loads(buffer.decode("utf-8"))

    def close(self) -> None:
        try:
            self._send(8)
        except OSError:
            pass  # the server is already gone
        finally:
            self.sock.close()


def check_server_url(server) -> str:
    """The server's base URL; refuses what urllib would misread (no scheme, no host)."""
    parts = urllib.parse.urlparse(server if isinstance(server, str) else "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--server {server!r} is not a URL like http://127.0.0.1:8188; give the scheme and host "
                         "of the running ComfyUI")
    if parts.scheme == "https":
        raise ValueError(f"--server {server!r}: https is not supported by this client; use the server's "
                         "http:// address")
    return server.rstrip("/")


def _follow(ws, prompt_id: str, on_event) -> int:
    """Pass the prompt's events on until it finishes; its exit code (0 done, 1 failed, 6 interrupted)."""
    code = 0
    for message in ws.messages():
        kind, data = message.get("type"), message.get("data", {})
        if data.get("prompt_id", prompt_id) != prompt_id:
            continue
        on_event(kind, data)
        if kind == "execution_error":
            code = 1
        elif kind == "execution_interrupted":
            code = 6
        elif kind == "executing" and data.get("node") is None and "prompt_id" in data:
            return code
    raise ConnectionError("the server closed the websocket")


def refusal_text(reply) -> str:
    """ComfyUI's refusal of a prompt (its JSON, or any text) as lines a person reads: the prompt's error, then
    each node's, under the input it names, each said once."""
    if isinstance(reply, str):
        try:
            reply = json.loads(reply)
        except ValueError:
            return f"refused: {reply.strip()[:1000]}"
    if not isinstance(reply, dict):
        return f"refused: {str(reply)[:1000]}"
    top = reply.get("error") if isinstance(reply.get("error"), dict) else {}
    lines = [f"refused: {_said(top) or 'the server refused the prompt'}"]
    for node_id, node in (reply.get("node_errors") or {}).items():
        for error in node.get("errors", []) if isinstance(node, dict) else []:
            name = (error.get("extra_info") or {}).get("input_name")
            line = f"  node {node_id} ({node.get('class_type', '?')})" + (f" {name}" if name else "") + \
                f": {_said(error, name)}"
            if line not in lines:
                lines.append(line)
    return "\n".join(lines)


def _said(error: dict, name: str | None = None) -> str:
    message, details = str(error.get("message", "")).strip(), str(error.get("details", "")).strip()
    return f"{message}: {details}" if details and details != name and details not in message else message


def submit(graph: dict, server: str, timeout: float, on_event) -> tuple[int, dict]:
    """Queue `graph`, pass every event of it to `on_event`, return (exit code, history outputs).

    Exit codes: 0 done, 1 the prompt failed, 2 refused by the server, 3 no answer or connection lost,
    6 interrupted.
    """
    client_id = uuid.uuid4().hex
    try:
        ws = Socket(server.replace("http", "ws", 1) + f"/ws?clientId={client_id}", timeout)
    except OSError as err:
        print(f"cannot reach ComfyUI at {server} ({err}); is it running, and is the address right?",
              file=sys.stderr)
        return 3, {}
    try:
        body = json.dumps({"prompt": graph, "client_id": client_id}).encode()
        request = urllib.request.Request(f"{server}/prompt", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                reply = json.load(response)
        except urllib.error.HTTPError as err:
            print(refusal_text(err.read().decode(errors="replace")), file=sys.stderr)
            return 2, {}
        if reply.get("node_errors"):
            print(refusal_text(reply), file=sys.stderr)
            return 2, {}
        prompt_id = reply["prompt_id"]
        code = _follow(ws, prompt_id, on_event)
    except TimeoutError:
        print(f"no event for {timeout} s; giving up on the prompt", file=sys.stderr)
        return 3, {}
    except OSError as err:
        print(f"lost the connection to ComfyUI at {server} before the prompt finished ({err}); its outputs "
              "are unknown, see the ComfyUI console", file=sys.stderr)
        return 3, {}
    finally:
        ws.close()
    try:
        with urllib.request.urlopen(f"{server}/history/{prompt_id}", timeout=timeout) as response:
            history = json.load(response).get(prompt_id, {})
    except (OSError, ValueError) as err:
        print(f"the prompt ran but its outputs could not be read from {server}/history ({err})", file=sys.stderr)
        return 3, {}
    return code, history.get("outputs", {})
