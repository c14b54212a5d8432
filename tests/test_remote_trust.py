"""The remote loader against hostile workflows and servers: which variable a workflow may read, where a
token may go, secrets kept out of every output, bounded reading, and Cancel honoured in every wait."""

from __future__ import annotations

import copy
import threading
import time
import tracemalloc

import fakecomfy
import pytest
from executor import call
from hostile_server import PROMPT, card, final, pack_answer, recording, send, send_events, serving, silent

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import Cancelled, InputError
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.remote.access import ALLOW_HTTP, TOKEN_VARS
from diffusiongemma.remote.connect import connect
from diffusiongemma.remote.http import Interrupted, Remote, RemoteError

Loader, Sampler = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"], NODE_CLASS_MAPPINGS["DGemmaSampler"]
Encode, Writer = NODE_CLASS_MAPPINGS["DGemmaEncode"], NODE_CLASS_MAPPINGS["DGemmaRunLogWriter"]
SECRET = "tok-9f8e7d6c5b4a3210"


def ok(handler):
    send(handler, {"status": "ok"})


@pytest.mark.parametrize("name", ["AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "PATH", "dgemma_token", "DGEMMA_A\nB"])
def test_token_env_may_only_name_dgemma_variables(monkeypatch, name):
    for var in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "dgemma_token"):
        monkeypatch.setenv(var, SECRET)
    with serving(ok) as (url, seen):
        with pytest.raises(InputError) as caught:
            call(Loader, url=url, token_env=name)
    message = str(caught.value)
    assert caught.value.name == "token_env" and "DGEMMA_" in message and TOKEN_VARS in message
    assert SECRET not in message and seen == []  # refused before any traffic


def test_a_variable_the_user_lists_may_be_read_and_goes_as_the_bearer_token(monkeypatch):
    monkeypatch.setenv("MY_TOKEN", SECRET)
    monkeypatch.setenv(TOKEN_VARS, "OTHER_NAME, MY_TOKEN")
    rec = recording()
    with serving(pack_answer(rec["models"], rec["tokens"], rec["events"])) as (url, seen):
        (model, dialect), _ = call(Loader, url=url, token_env="MY_TOKEN")
    assert dialect == "pack" and {h["Authorization"] for _, _, h, _ in seen} == {f"Bearer {SECRET}"}
    for bad, said in (("short", "at least 8"), ("t\u00f6ken-with-umlaut", "header cannot carry"),
                      ("two words here", "header cannot carry")):
        monkeypatch.setenv("MY_TOKEN", bad)
        with pytest.raises(InputError, match=said):
            connect(url, "MY_TOKEN")


def test_a_token_never_crosses_plain_http_to_another_machine(monkeypatch):
    monkeypatch.setenv("DGEMMA_T", SECRET)
    for url in ("http://192.0.2.1:8190", "http://example.com", "http://127.0.0.1.nip.io:8190"):
        with pytest.raises(InputError, match=f"https://, or set {ALLOW_HTTP}=1") as caught:
            connect(url, "DGEMMA_T")
        assert caught.value.name == "url" and SECRET not in str(caught.value)
    for url in ("https://192.0.2.1", "http://localhost:9", "http://127.0.0.2:9", "http://[::1]:9"):
        Remote(url, SECRET, "DGEMMA_T")  # https anywhere, and http to this machine, are fine
    Remote("http://192.0.2.1:8190")  # no token: nothing to protect
    monkeypatch.setenv(ALLOW_HTTP, "1")  # the user's opt-in, in ComfyUI's environment
    Remote("http://192.0.2.1:8190", SECRET, "DGEMMA_T")


def test_credentials_in_the_url_are_refused_and_not_shown():
    with serving(ok) as (url, seen):
        with pytest.raises(InputError) as caught:
            call(Loader, url=url.replace("http://", "http://user:pa55word@"))
    message = str(caught.value)
    assert "token_env" in message and "pa55word" not in message and seen == []


def with_secrets(rec: dict) -> dict:
    """The recording with the token echoed wherever a server could put it."""
    rec = copy.deepcopy(rec)
    card(rec)["model_source"] = final(rec)["config"]["model_source"] = f"/models/{SECRET}/demo"
    card(rec)["device"] = final(rec)["config"]["device"] = f"cpu {SECRET}"
    rec["events"].insert(-2, {"choices": [{"index": 0, "delta": {"content": f"seven {SECRET}"}}]})
    return rec


def test_the_token_never_reaches_an_output_the_log_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("DGEMMA_T", SECRET)
    rec = with_secrets(recording())
    with serving(pack_answer(rec["models"], rec["tokens"], rec["events"])) as (url, _):
        with fakecomfy.installed(tmp_path) as comfy:
            (model, _), _ = call(Loader, url=url, token_env="DGEMMA_T")
            out, _ = call(Sampler, model=model, prompt=PROMPT, **rec["knobs"])
            (path,), _ = call(Writer, canvas_trace=out[2], run_config=out[5], frames=out[3], canvas_state=out[1],
                              filename_prefix="secret_check")
    text, state, trace, frames, images, config = out
    shown = [str(model), repr(model), model.url, model.source, model.device, text, repr(state), str(trace),
             str(config), repr(config.asdict()), *frames, open(path, encoding="utf-8").read(), repr(comfy.events)]
    assert text == "seven" and "[redacted]" in model.source and "[redacted]" in config.model_source
    assert not [s for s in shown if SECRET in s]


def echoing(status: int, as_json: bool):
    def answer(handler):
        auth = handler.headers.get("Authorization", "")
        said = f"bad header {auth!r} for token {SECRET}"
        send(handler, {"error": {"message": said}} if as_json else said.encode(), status=status,
             kind="application/json" if as_json else "text/plain")
    return answer


@pytest.mark.parametrize("status,as_json", [(401, True), (401, False), (500, True), (500, False), (403, True)])
def test_an_error_that_echoes_the_token_is_redacted(monkeypatch, status, as_json):
    monkeypatch.setenv("DGEMMA_T", SECRET)
    with serving(echoing(status, as_json)) as (url, _):
        with pytest.raises(RemoteError) as caught:
            call(Loader, url=url, token_env="DGEMMA_T")
    message = str(caught.value)
    assert ("refused the token" if status == 401 else f"answered {status}") in message
    assert "[redacted]" in message and SECRET not in message


@pytest.mark.parametrize("param", [None, "prompt"])
def test_a_stream_error_quoting_the_token_is_redacted(monkeypatch, param):
    monkeypatch.setenv("DGEMMA_T", SECRET)
    rec = copy.deepcopy(recording())
    rec["events"][2:] = [{"error": {"message": f"failed with {SECRET}", "param": param}}, "[DONE]"]
    with serving(pack_answer(rec["models"], rec["tokens"], rec["events"])) as (url, _):
        (model, _), _ = call(Loader, url=url, token_env="DGEMMA_T")
        with pytest.raises(InputError if param else RemoteError) as caught:
            call(Sampler, model=model, prompt=PROMPT, **rec["knobs"])
    assert "[redacted]" in str(caught.value) and SECRET not in str(caught.value)


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_refused_not_read_as_the_answer(status):
    where = "http://user:hunter22@elsewhere.example/v1/models"
    answer = lambda h: send(h, {"data": [{"id": "evil", "dgemma": {}}]}, status=status, headers={"Location": where})
    with serving(answer) as (url, _):
        with pytest.raises(RemoteError) as caught:
            call(Loader, url=url)
    message = str(caught.value)
    assert f"/health answered {status}, redirecting to http://elsewhere.example/v1/models; give the final URL" \
        in message and "hunter22" not in message


@pytest.mark.parametrize("body,said", [
    (b"[1, 2]", "JSON list where an object belongs"), (b"not json", "broken answer"),
    (b"[" * 100_000 + b"]" * 100_000, "broken answer"), (b'{"data": {"id": 1}}', "data must be a list"),
    (b'{"data": "x"}', "data must be a list"), (b'{"object": "list"}', "data must be present")])
def test_an_answer_out_of_shape_names_what_was_expected(body, said):
    answer = lambda h: ok(h) if h.path == "/health" else send(h, body)
    with serving(answer) as (url, _):
        with pytest.raises(RemoteError, match=said) as caught:
            call(Loader, url=url)
    assert url in str(caught.value) and len(str(caught.value)) < 600


def test_a_json_answer_over_the_limit_is_refused():
    rec = recording()
    huge = b'{"token_strings": ["' + b"x" * (33 * 2**20) + b'"]}'
    base = pack_answer(rec["models"], rec["tokens"], rec["events"])
    answer = lambda h: send(h, huge) if h.path == "/v1/dgemma/tokens" else base(h)
    with serving(answer) as (url, _):
        with pytest.raises(RemoteError, match=f"{url}/v1/dgemma/tokens sent an answer over 32 MiB"):
            call(Loader, url=url)


def pack_with_chat(chat):
    """A pack server (the recording) whose chat answer `chat(handler)` writes."""
    rec = recording()
    base = pack_answer(rec["models"], rec["tokens"], rec["events"])
    return lambda h: chat(h) if h.path == "/v1/chat/completions" else base(h)


def test_an_sse_line_over_the_limit_is_refused_without_holding_it():
    block = b"x" * 2**20

    def chat(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.end_headers()
        handler.wfile.write(b'data: {"pad": "')
        for _ in range(64):  # one 64 MiB line
            handler.wfile.write(block)

    with serving(pack_with_chat(chat)) as (url, _):
        model = connect(url)
        tracemalloc.start()
        try:
            with pytest.raises(RemoteError, match=f"{url}/v1/chat/completions sent a line over 4 MiB"):
                model.backend.run(model, PROMPT, Knobs(**recording()["knobs"]))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 16 * 2**20, peak  # the line's first 4 MiB, not the whole of it


def test_endless_comment_lines_are_cut_off():
    def chat(handler):
        handler.send_response(200)
        handler.end_headers()
        while True:
            handler.wfile.write(b": keep-alive\n")

    with serving(pack_with_chat(chat)) as (url, _):
        model = connect(url)
        with pytest.raises(RemoteError, match="lines that are not events"):
            model.backend.run(model, PROMPT, Knobs(**recording()["knobs"]))


def test_an_event_that_is_not_an_object_is_refused():
    with serving(pack_with_chat(lambda h: send_events(h, [[1, 2], "[DONE]"]))) as (url, _):
        model = connect(url)
        with pytest.raises(RemoteError, match="event must be a JSON object"):
            model.backend.run(model, PROMPT, Knobs(**recording()["knobs"]))


def cancel_after(seconds: float, comfy=None) -> threading.Event:
    """An event set after `seconds` (and ComfyUI's interrupt flag raised, when `comfy` is given)."""
    flag = threading.Event()

    def fire():
        flag.set()
        if comfy is not None:
            comfy.interrupt = True

    threading.Timer(seconds, fire).start()
    return flag


def test_cancel_stops_the_loader_waiting_on_a_server_that_never_answers(tmp_path):
    with silent() as url, fakecomfy.installed(tmp_path) as comfy:
        cancel_after(0.3, comfy)
        started = time.monotonic()
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Loader, url=url)
        assert time.monotonic() - started < 5  # a hang guard; the 10 s card timeout would fail it too


@pytest.mark.parametrize("path", ["/v1/models", "/v1/dgemma/tokens"])
def test_cancel_stops_the_loader_waiting_on_a_hung_answer(tmp_path, path):
    rec, release = recording(), threading.Event()
    base = pack_answer(rec["models"], rec["tokens"], rec["events"])
    answer = lambda h: release.wait(30) if h.path == path else base(h)
    with serving(answer) as (url, _), fakecomfy.installed(tmp_path) as comfy:
        cancel_after(0.3, comfy)
        started = time.monotonic()
        try:
            with pytest.raises(fakecomfy.InterruptProcessingException):
                call(Loader, url=url)
            assert time.monotonic() - started < 5
        finally:
            release.set()


@pytest.mark.parametrize("what", ["run", "encode"])
def test_cancel_stops_a_run_or_encode_waiting_for_the_answer_headers(what):
    rec, release = recording(), threading.Event()
    base = pack_answer(rec["models"], rec["tokens"], rec["events"])
    answer = lambda h: release.wait(30) if h.command == "POST" else base(h)
    with serving(answer) as (url, _):
        model = connect(url)
        flag = cancel_after(0.3)
        started = time.monotonic()
        try:
            with pytest.raises(Cancelled):
                if what == "run":
                    model.backend.run(model, PROMPT, Knobs(**rec["knobs"]), should_cancel=flag.is_set)
                else:
                    model.backend.encode(model, "Paris is in France.", should_cancel=flag.is_set)
            assert time.monotonic() - started < 5
        finally:
            release.set()


def test_a_cancel_check_that_returns_true_stops_connect():
    with silent() as url:
        flag = cancel_after(0.3)
        with pytest.raises(Interrupted):
            connect(url, should_cancel=flag.is_set)
