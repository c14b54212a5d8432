"""Remote runs through a real `python -m serve` process on loopback: the same tokens, frames and
trace as local runs, through the very nodes; and the server's safety rules."""

from __future__ import annotations

import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import fakecomfy
import numpy as np
import pytest
import torch
from executor import call
from remote_server import served

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import Cancelled, InputError
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.nodes import host
from diffusiongemma.remote.connect import connect
from diffusiongemma.remote.http import RemoteError

Sampler, Denoise = NODE_CLASS_MAPPINGS["DGemmaSampler"], NODE_CLASS_MAPPINGS["DGemmaDenoise"]
Advanced, Encode = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"], NODE_CLASS_MAPPINGS["DGemmaEncode"]
KNOBS = dict(Knobs().asdict(), num_inference_steps=16, gen_length=32)  # short runs: the CPU is shared
JSON = {"Content-Type": "application/json"}
TRACE_ARRAYS = ("blocks", "steps", "ids", "committed_bits", "entropy", "stop_bits", "pinned_bits", "times",
                "knob_index")


@pytest.fixture(scope="module")
def server():
    with served() as (url, proc):
        yield url


@pytest.fixture(scope="module")
def remote(server):
    return connect(server)


def same_trace(a, b) -> None:
    for name in TRACE_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), name
    for name in ("knobs", "canvas_length", "scheduler_name", "context", "block_stopped_early", "knob_sets",
                 "scheduler_config"):
        assert getattr(a, name) == getattr(b, name), name


def same_outputs(local, remote) -> None:
    """text, canvas_state, canvas_trace, frames, images, run_config (and kv_cache summary) all equal."""
    assert local[0] == remote[0] and local[1] == remote[1]
    same_trace(local[2], remote[2])
    assert local[3] == remote[3]
    assert torch.equal(local[4], remote[4])
    assert local[5] == remote[5]
    if len(local) > 6:
        assert local[6].summary() == remote[6].summary()


def events_of(run) -> list:
    events = []
    host.listen(lambda name, data: events.append((name, data)))
    try:
        out = run()
    finally:
        host._listeners.clear()
    return out, events


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_remote_sampler_is_the_local_sampler(demo_model, remote, seed):
    knobs = dict(KNOBS, seed=seed, thinking=seed % 2 == 1)
    (local, _), local_events = events_of(lambda: call(Sampler, model=demo_model, prompt="What is 3+4?", **knobs))
    (far, _), far_events = events_of(lambda: call(Sampler, model=remote, prompt="What is 3+4?", **knobs))
    same_outputs(local, far)
    assert [e for e in local_events if e[0] == "dgemma.step"] == [e for e in far_events if e[0] == "dgemma.step"]
    assert len([e for e in far_events if e[0] == "dgemma.step"]) == local[1].steps_used


@pytest.mark.parametrize("seed", [4])
def test_remote_denoise_with_a_kv_context(demo_model, remote, seed):
    knobs = dict(KNOBS, seed=seed, gen_length=64)
    text = "Paris is the capital of France."
    (lctx,), _ = call(Encode, model=demo_model, text=text)
    (rctx,), _ = call(Encode, model=remote, text=text)
    assert lctx.summary() == rctx.summary()
    local, _ = call(Denoise, model=demo_model, prompt="What is 3+4?", kv_cache=lctx, **knobs)
    far, _ = call(Denoise, model=remote, prompt="What is 3+4?", kv_cache=rctx, **knobs)
    same_outputs(local, far)
    again_l, _ = call(Denoise, model=demo_model, prompt="", kv_cache=local[6], **knobs)  # the advanced context
    again_r, _ = call(Denoise, model=remote, prompt="", kv_cache=far[6], **knobs)
    same_outputs(again_l, again_r)


@pytest.mark.parametrize("seed", [6, 7])
def test_remote_advanced_windows_and_pins(demo_model, remote, seed):
    base = dict(KNOBS, seed=seed, gen_length=64, confidence=0.0, num_inference_steps=12, scheduler="entropy_bound",
                pins="The answer is ___.", start_step=0, end_step=5)
    outs = {}
    for name, model in (("local", demo_model), ("remote", remote)):
        first, _ = call(Advanced, model=model, prompt="What is 3+4?", **base)
        second, _ = call(Advanced, model=model, prompt="What is 3+4?", canvas_state=first[1],
                         **dict(base, start_step=5, end_step=1024, t_min=0.3))
        outs[name] = first, second
    for local, far in zip(outs["local"], outs["remote"]):
        same_outputs(local, far)
    assert outs["remote"][0][1].paused and outs["remote"][1][2].pinned is not None


def test_remote_advanced_other_scheduler(demo_model, remote):
    base = dict(KNOBS, seed=3, scheduler="block_refinement", temperature=0.5, pins="", start_step=0, end_step=1024)
    same_outputs(call(Advanced, model=demo_model, prompt="What is 2+2?", **base)[0],
                 call(Advanced, model=remote, prompt="What is 2+2?", **base)[0])


@pytest.mark.parametrize("seed", [8, 9])
def test_remote_image_run(demo_model, remote, seed):
    image = torch.rand((1, 40, 56, 3), generator=torch.Generator().manual_seed(seed))
    knobs = dict(KNOBS, seed=seed)
    local, _ = call(Sampler, model=demo_model, prompt="What is in the picture?", image=image, **knobs)
    far, _ = call(Sampler, model=remote, prompt="What is in the picture?", image=image, **knobs)
    same_outputs(local, far)
    assert far[5].image is not None


def test_refusals_come_back_as_the_engines_input_errors(remote):
    with pytest.raises(InputError, match="pins"):
        call(Advanced, model=remote, prompt="hi", pins="___{99999}", scheduler="entropy_bound", start_step=0,
             end_step=1024, **KNOBS)
    with pytest.raises(InputError, match="prompt is empty"):
        call(Sampler, model=remote, prompt="  ", **KNOBS)
    with pytest.raises(InputError, match="encoded on this remote model"):
        call(Denoise, model=remote, prompt="x", kv_cache="not a cache", **KNOBS)


def test_interrupt_closes_the_stream_and_stops_within_250_ms(tmp_path, remote):
    knobs = dict(KNOBS, confidence=0.0, num_inference_steps=400, gen_length=32)
    with fakecomfy.installed(tmp_path) as comfy:
        comfy.interrupt_after_steps = 3
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Sampler, model=remote, prompt="What is 2+2?", **knobs)
        assert len(comfy.steps()) == 3 and comfy.events[-1][1]["status"] == "interrupted"
    flag = threading.Event()
    frames = []

    def on_frame(frame):
        frames.append(time.perf_counter())
        if len(frames) == 2:
            flag.set()

    started = time.perf_counter()
    with pytest.raises(Cancelled):
        remote.backend.run(remote, "What is 2+2?", Knobs(**knobs), on_frame=on_frame, should_cancel=flag.is_set)
    assert time.perf_counter() - frames[1] < 0.25 and time.perf_counter() - started < 30
    assert busy(remote.url, until_idle=True) == 0  # the server stopped the run too


def busy(url: str, until_idle: bool = False) -> int:
    deadline = time.monotonic() + 5
    while True:
        with_health = json.loads(raw(url, "GET", "/health")[1])["busy"]
        if not until_idle or with_health == 0 or time.monotonic() > deadline:
            return with_health
        time.sleep(0.02)


def raw(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    json_type = {"Content-Type": "application/json"} if method == "POST" else {}
    try:
        conn.request(method, path, body=body, headers={**json_type, **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode(), dict(response.getheaders())
    finally:
        conn.close()


def test_a_client_that_disconnects_cancels_its_run(remote):
    parts = urlsplit(remote.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
            "dgemma": {"knobs": {"confidence": 0.0, "num_inference_steps": 1000, "gen_length": 2000}}}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=JSON)
    response = conn.getresponse()
    for _ in range(6):
        response.fp.readline()
    conn.sock.close()
    conn.close()
    t0 = time.monotonic()
    assert busy(remote.url, until_idle=True) == 0 and time.monotonic() - t0 < 2
    assert call(Sampler, model=remote, prompt="What is 3+4?", **dict(KNOBS, num_inference_steps=48))[0][0] == "seven"


def test_concurrent_clients_are_all_served_correctly(demo_model, remote):
    from diffusiongemma.dgemma.denoising.run import generate

    seeds = list(range(20, 28))
    knobs = {s: Knobs(seed=s, thinking=True, num_inference_steps=8) for s in seeds}
    want = {s: generate(demo_model, "What is 3+4?", knobs[s]).trace.ids for s in seeds}
    got, errors = {}, []

    def client(seed):
        try:
            got[seed] = remote.backend.run(remote, "What is 3+4?", knobs[seed]).trace.ids
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=client, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and all(np.array_equal(got[s], want[s]) for s in seeds)


def test_a_full_queue_answers_429_with_retry_after():
    with served("--max-queue", "0") as (url, _):
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        body = {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                "dgemma": {"knobs": {"confidence": 0.0, "num_inference_steps": 1000, "gen_length": 2000}}}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=JSON)
        response = conn.getresponse()
        response.fp.readline()
        status, text, headers = raw(url, "POST", "/v1/chat/completions",
                                    json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode())
        conn.close()
        assert status == 429 and headers["Retry-After"] == "1" and "busy" in text
        assert busy(url, until_idle=True) == 0


def test_bad_requests_get_4xx_with_a_reason_and_the_server_lives_on():
    with served("--max-body-mb", "1") as (url, _):
        chat = "/v1/chat/completions"
        cases = [(b"\xff\xfe garbage", 400, "not JSON"), (b"[1, 2]", 400, "JSON object"),
                 (b'{"messages": "hi"}', 400, "messages"), (b'{"messages": [{"role": "tool", "content": "x"}]}',
                                                              400, "role 'tool'"),
                 (json.dumps({"messages": [{"role": "user", "content": "x"}],
                              "dgemma": {"knobs": {"sed": 1}}}).encode(), 400, "sed is not a knob"),
                 (json.dumps({"messages": [{"role": "user", "content": "x"}], "seed": -3}).encode(), 400, "seed"),
                 (json.dumps({"messages": [{"role": "user", "content": "x"}],
                              "dgemma": {"image": {"shape": [1, 2, 2, 3], "data": "AAAA"}}}).encode(), 400, "bytes"),
                 (json.dumps({"messages": [{"role": "user", "content": "x"}],
                              "dgemma": {"context": "ctx-nope"}}).encode(), 400, "not held by this server"),
                 (b"x" * (2 * 2**20), 413, "Maximum request body size 1048576")]
        for body, status, reason in cases:
            got, text, _ = raw(url, "POST", chat, body)
            assert got == status and reason in json.loads(text)["error"]["message"], (body[:40], got, text)
        assert raw(url, "GET", "/nope")[0] == 404
        assert raw(url, "GET", "/health")[0] == 200


def test_a_token_is_required_when_set_and_never_leaves_the_env(monkeypatch):
    with served(env={"DGEMMA_SERVE_TOKEN": "s3cret-token"}) as (url, _):
        assert raw(url, "GET", "/health")[0] == 200
        status, text, headers = raw(url, "GET", "/v1/models")
        assert status == 401 and "bearer token" in text and headers["WWW-Authenticate"] == "Bearer"
        assert raw(url, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        with pytest.raises(RemoteError, match="set DGEMMA_TEST_TOKEN"):
            connect(url, "DGEMMA_TEST_TOKEN")
        monkeypatch.setenv("DGEMMA_TEST_TOKEN", "s3cret-token")
        model = connect(url, "DGEMMA_TEST_TOKEN")
        (text, state, trace, frames, images, config), _ = call(Sampler, model=model, prompt="What is 3+4?", **KNOBS)
        assert text and "s3cret" not in repr(model) + json.dumps(config.asdict())


def test_a_non_loopback_address_needs_a_token():
    import subprocess
    import sys

    from remote_server import REPO

    done = subprocess.run([sys.executable, "-m", "serve", "--host", "0.0.0.0", "--port", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "without a bearer token" in done.stderr


def test_a_server_that_dies_mid_run_is_a_clear_error():
    with served() as (url, proc):
        model = connect(url)
        seen = []

        def on_frame(frame):
            seen.append(frame)
            if len(seen) == 2:
                proc.kill()

        knobs = Knobs(confidence=0.0, num_inference_steps=1000)
        with pytest.raises(RemoteError, match=url):
            model.backend.run(model, "hi", knobs, on_frame=on_frame)
    with pytest.raises(RemoteError, match="cannot reach"):
        connect(url)


def test_a_strict_openai_client_gets_the_defaults_and_the_shims_stream_shape(remote):
    body = {"model": remote.model_id, "messages": [{"role": "user", "content": "What is 3+4?"}]}
    status, text, _ = raw(remote.url, "POST", "/v1/chat/completions", json.dumps(body).encode())
    answer = json.loads(text)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "seven"
    assert answer["choices"][0]["finish_reason"] == "stop" and answer["timings"]["diffusion_steps"] > 0
    status, text, headers = raw(remote.url, "POST", "/v1/chat/completions",
                                json.dumps({**body, "stream": True, "seed": 2}).encode())
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream") and events[-1] == "[DONE]"
    frames = [c for c in chunks if c.get("type") == "diffusion_frame"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"} and frames and chunks[1] is frames[0]
    assert all({"block", "step", "total", "text", "dgemma"} <= set(f) for f in frames)
    assert frames[0]["total"] == 48 and len(frames[0]["dgemma"]["ids"]) == remote.canvas_length
    tail = chunks[len(frames) + 1:]
    assert tail[0]["choices"][0]["delta"] == {"content": "seven"}
    assert tail[1]["choices"][0]["finish_reason"] == "stop"
    assert tail[2]["choices"] == [] and tail[2]["timings"]["diffusion_steps"] == len(frames)


def test_a_prompt_list_on_a_remote_model_runs_item_by_item_to_the_local_batchs_outputs(demo_model, remote):
    prompts = ["What is 3+4?", "What is 2+2?"]
    (local, _), local_events = events_of(lambda: call(Sampler, model=demo_model, prompt=prompts, **KNOBS))
    (far, _), far_events = events_of(lambda: call(Sampler, model=remote, prompt=prompts, **KNOBS))
    assert local[0] == far[0] == ["seven", "four"] and local[1] == far[1] and local[3] == far[3]

    def steps(events):
        return sorted((d["item"], d["block"], d["step"], d["tokens"]) for e, d in events if e == "dgemma.step")

    assert steps(local_events) == steps(far_events)
    assert far_events[-1][1]["items"][1]["text"] == "four"
