"""Who may talk to a real `python -m serve`: the Host allow-list (DNS rebinding), the Origin check and
CORS, the JSON-only bodies, the bearer token, the CLI's checks, and connections that never finish."""

from __future__ import annotations

import select
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest
from remote_server import REPO, served
from serve_client import ask, health, raw_exchange, status_of

CHAT, CONTEXTS = "/v1/chat/completions", "/v1/dgemma/contexts"
RUN = {"messages": [{"role": "user", "content": "What is 3+4?"}]}
CORS_HEADERS = ("access-control-allow-origin", "access-control-allow-methods", "access-control-allow-headers")


@pytest.fixture(scope="module")
def server():
    with served() as (url, _):
        yield url


def port_of(url: str) -> int:
    return urlsplit(url).port


def test_only_loopback_names_pass_the_host_check(server):
    port = port_of(server)
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "::1", f"LOCALHOST:{port}"):
        assert ask(server, "GET", "/health", headers={"Host": host})[0] == 200, host
    for host in ("attacker.example", f"attacker.example:{port}", f"localhost.:{port}", f"127.0.0.1.nip.io:{port}",
                 "", f"localhost:{port}x", f"evil@localhost:{port}", "10.0.0.7"):
        for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", CHAT)):
            status, answer, headers = ask(server, method, path, RUN if method == "POST" else None, {"Host": host})
            assert status == 403 and "Host header" in answer["error"]["message"], (host, path, answer)
            assert "--allowed-host" in answer["error"]["message"]
    assert health(server)["started"] == 0


def test_allowed_host_adds_names_and_a_wildcard_bind_takes_ip_addresses():
    with served("--allowed-host", "box.lan") as (url, _):
        assert ask(url, "GET", "/health", headers={"Host": f"box.lan:{port_of(url)}"})[0] == 200
        assert ask(url, "GET", "/health", headers={"Host": "other.lan"})[0] == 403
    with served("--host", "0.0.0.0", env={"DGEMMA_SERVE_TOKEN": "s3cret"}) as (url, _):
        local = url.replace("0.0.0.0", "127.0.0.1")
        assert ask(local, "GET", "/health", headers={"Host": f"10.1.2.3:{port_of(url)}"})[0] == 200
        assert ask(local, "GET", "/health", headers={"Host": f"attacker.example:{port_of(url)}"})[0] == 403


def test_a_page_on_another_origin_is_refused_and_gets_no_cors(server):
    port = port_of(server)
    for origin in ("http://attacker.example", "http://127.0.0.1:1", f"http://localhost:{port}", "null"):
        for method, path, body in (("GET", "/v1/models", None), ("POST", CHAT, RUN), ("POST", CONTEXTS, {"text": "x"}),
                                   ("OPTIONS", CHAT, None)):
            headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
            status, answer, got = ask(server, method, path, body, {"Host": f"127.0.0.1:{port}", **headers})
            assert status == 403 and "--allow-origin" in answer["error"]["message"], (origin, method, path)
            assert not any(h in got for h in CORS_HEADERS), got
    same = f"http://127.0.0.1:{port}"
    assert ask(server, "GET", "/health", headers={"Host": f"127.0.0.1:{port}", "Origin": same})[0] == 200
    assert ask(server, "OPTIONS", CHAT)[0] == 405  # no preflight is ever answered without --allow-origin
    assert health(server)["started"] == 0


def test_allow_origin_answers_preflight_and_responses_for_that_origin_only():
    page = "http://localhost:3000"
    with served("--allow-origin", page) as (url, _):
        status, _, headers = ask(url, "OPTIONS", CHAT, headers={
            "Origin": page, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
        assert status == 204 and headers["access-control-allow-origin"] == page
        assert "Content-Type" in headers["access-control-allow-headers"] and "POST" in headers[
            "access-control-allow-methods"]
        status, answer, headers = ask(url, "POST", CHAT, RUN, {"Origin": page})
        assert status == 200 and headers["access-control-allow-origin"] == page and headers["vary"] == "Origin"
        assert answer["choices"][0]["message"]["content"] == "seven"
        status, _, headers = ask(url, "POST", CHAT, RUN, {"Origin": "http://localhost:3001"})
        assert status == 403 and "access-control-allow-origin" not in headers


def test_post_bodies_must_be_json_and_others_are_refused_before_the_body_is_read(server):
    for kind in (None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/jsonp", "text/json", "application/json-seq"):
        headers = {"Content-Type": kind} if kind else {}
        for path in (CHAT, CONTEXTS):
            status, answer, _ = ask(server, "POST", path, b'{"messages": [{"role": "user", "content": "hi"}]}',
                                    headers)
            assert status == 415 and "Content-Type" in answer["error"]["message"], (kind, path, answer)
    for kind in ("application/json; charset=utf-8", "Application/JSON"):
        status, answer, _ = ask(server, "POST", CHAT, b'{"messages": [], "seed": 1}', {"Content-Type": kind})
        assert status == 400 and answer["error"]["param"] == "messages", (kind, answer)
    port = port_of(server)
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: text/plain\r\n"
            "Content-Length: 1000000\r\n\r\n").encode()
    assert status_of(raw_exchange(server, head)) == 415  # answered without waiting for the million bytes
    assert health(server)["started"] == 0


def test_the_token_scheme_is_case_insensitive_and_odd_headers_are_401_never_500():
    with served(env={"DGEMMA_SERVE_TOKEN": "s3cret"}) as (url, _):
        for given in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret "):
            assert ask(url, "GET", "/v1/models", headers={"Authorization": given})[0] == 200, given
        for given in ("Basic s3cret", "Bearer s3cret2", "s3cret", "Bearer", "Bearer s\u00e9cret"):
            assert ask(url, "GET", "/v1/models", headers={"Authorization": given})[0] == 401, given
        port = port_of(url)
        utf8 = f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer ".encode() + \
            "s3cr\u00e9t\u2603".encode() + b"\r\nConnection: close\r\n\r\n"
        assert status_of(raw_exchange(url, utf8)) == 401


def test_cli_ranges_are_checked_before_anything_loads():
    for args, flag in ((["--port", "70000"], "--port"), (["--port", "-1"], "--port"), (["--max-queue", "-1"],
                       "--max-queue"), (["--max-body-mb", "0"], "--max-body-mb"), (["--max-body-mb", "4096"],
                       "--max-body-mb"), (["--allow-origin", "attacker.example"], "--allow-origin"),
                       (["--allowed-host", "a/b"], "--allowed-host")):
        done = subprocess.run([sys.executable, "-m", "serve", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and f"argument {flag}:" in done.stderr, (args, done.stderr)


def test_an_unknown_model_is_one_clear_line_and_a_busy_port_is_found_before_loading():
    done = subprocess.run([sys.executable, "-m", "serve", "--model", "no-such-model", "--port", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("cannot load model 'no-such-model'") and len(done.stderr.splitlines()) == 1
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "serve", "--model", "/no/such/folder", "--port", str(port)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"port {port}" in done.stderr and "model" not in done.stderr, done.stderr


def test_the_context_store_keeps_the_last_32(server):
    handles = []
    for i in range(33):
        status, answer, _ = ask(server, "POST", CONTEXTS, {"text": f"note {i}"})
        assert status == 200, answer
        handles.append(answer["handle"])
    assert health(server)["contexts"] == 32
    run = {**RUN, "dgemma": {"context": handles[0]}}
    status, answer, _ = ask(server, "POST", CHAT, run)
    assert status == 400 and "not held" in answer["error"]["message"]
    assert ask(server, "POST", CHAT, {**RUN, "dgemma": {"context": handles[-1], "knobs": {"gen_length": 32}}})[0] == 200


def _half_sent(url: str, count: int, head: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection((urlsplit(url).hostname, port_of(url)), timeout=10)
        sock.sendall(head)
        socks.append(sock)
    return socks


def _wait_closed_by_server(socks: list[socket.socket], seconds: float) -> list[socket.socket]:
    """The sockets the server has not closed after `seconds`."""
    left, deadline = list(socks), time.monotonic() + seconds
    while left and time.monotonic() < deadline:
        readable, _, _ = select.select(left, [], [], 0.5)
        for sock in readable:
            try:
                gone = sock.recv(1024) == b""
            except OSError:
                gone = True
            if gone:
                left.remove(sock)
    return left


def test_half_sent_requests_and_slow_bodies_do_not_lock_the_server_out():
    """300 connections against a server allowed 256 open files: without a cap it could accept no more."""
    from diffusiongemma.serve.connections import HEADER_TIMEOUT

    with served(files=256) as (url, _):
        port = port_of(url)
        headers = _half_sent(url, 150, b"POST / HTTP/1.1\r\nHost: x")
        late = []
        bodies = _half_sent(url, 150, (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: "
                                       "application/json\r\nContent-Length: 100\r\n\r\n{").encode())
        try:
            assert health(url)["status"] == "ok"  # served at once (http.client would time out after 30 s)
            status, answer, _ = ask(url, "POST", CHAT, {**RUN, "max_tokens": 32})
            assert status == 200 and answer["choices"][0]["message"]["content"] == "seven"
            late = _half_sent(url, 5, b"GET /health HTTP/1.1\r\nHost: loc")  # the newest: not dropped
            left = _wait_closed_by_server(late, HEADER_TIMEOUT + 5)
            assert not left, f"{len(left)} unfinished headers outlived the header timeout"
        finally:
            for sock in headers + bodies + late:
                sock.close()
