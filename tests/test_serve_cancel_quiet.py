"""A client that goes away mid-stream cancels its run, and the server's stderr stays clean: no
"Future exception was never retrieved" traceback for the cancelled run."""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

from remote_server import served
from serve_client import health

JSON = {"Content-Type": "application/json"}


def _drop_after(url: str, path: str, body: dict, lines: int) -> None:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers=JSON)
    response = conn.getresponse()
    for _ in range(lines):
        response.fp.readline()
    conn.sock.close()
    conn.close()


def _idle(url: str) -> None:
    deadline = time.monotonic() + 60
    while health(url)["busy"] and time.monotonic() < deadline:
        time.sleep(0.1)


def test_a_cancelled_stream_leaves_no_traceback_on_stderr():
    long_run = {"confidence": 0.0, "num_inference_steps": 1000, "gen_length": 2000}
    with served() as (url, proc):
        _drop_after(url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                                  "dgemma": {"knobs": long_run}}, 6)
        _idle(url)
        _drop_after(url, "/v1/dgemma/decide", {"prompt": "What is 3+4?", "options": ["six", "seven"], "samples": 2,
                                               "stream": True, "knobs": {"num_inference_steps": 1000,
                                                                         "confidence": 0.0}}, 4)
        _idle(url)
        time.sleep(1.0)  # the finished futures are collected, where asyncio would log what nobody read
        assert health(url)["status"] == "ok"
        proc.terminate()
        output = proc.stdout.read()
    assert "never retrieved" not in output and "Traceback" not in output, output[-3000:]


def test_usage_says_the_answers_tokens_per_forward(demo_model):
    from diffusiongemma.dgemma import Knobs
    from diffusiongemma.dgemma.denoising.run import generate

    body = {"messages": [{"role": "user", "content": "What is 3+4?"}], "seed": 7}
    local = generate(demo_model, "What is 3+4?", Knobs(seed=7)).state
    with served() as (url, _):
        from serve_client import ask

        status, answer, _ = ask(url, "POST", "/v1/chat/completions", body)
    assert status == 200 and answer["usage"]["tokens_per_forward"] == local.tokens_per_forward


def test_turn_closed_by_eos_only_when_an_eos_token_was_seen(demo_model):
    import dataclasses

    from diffusiongemma.dgemma import Knobs
    from diffusiongemma.dgemma.denoising.run import generate
    from diffusiongemma.dgemma.readings import Readings

    state = generate(demo_model, "What is 3+4?", Knobs(seed=7)).state
    assert state.turn_closed and "turn closed by EOS" in str(state)
    remote = dataclasses.replace(state, readings=Readings("vllm engine", unknown={"ids": "text only"}))
    assert "by EOS" not in str(remote) and "no EOS token seen" in str(remote)
