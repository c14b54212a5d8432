"""Hostile request bodies against a real `python -m serve` on the demo model: each is a short 4xx
naming the field, refused before any run starts, and the server answers on."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import pytest
from remote_server import served
from serve_client import ask, health

CHAT, CONTEXTS = "/v1/chat/completions", "/v1/dgemma/contexts"
USER = [{"role": "user", "content": "What is 3+4?"}]


def chat(**fields) -> dict:
    return {"messages": USER, **fields}


def ext(**fields) -> dict:
    return chat(dgemma=fields)


def adv(**fields) -> dict:
    return ext(advanced=fields)


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def with_parts(*parts, **fields) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "What colour is this?"}, *parts]}],
            **fields}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(width: int, height: int, pixels: bool = True) -> bytes:
    """A black RGB PNG, compressed row by row (a 9000x9000 one is a few hundred kB, built without holding
    its pixels); without `pixels`, only the header that claims the size."""
    packer, row, idat = zlib.compressobj(9), b"\0" * (1 + 3 * width), []
    for _ in range(height if pixels else 0):
        idat.append(packer.compress(row))
    idat.append(packer.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", b"".join(idat)) + _chunk(b"IEND", b"")


def data_url(raw: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(raw).decode()


SMALL = png(8, 8)
B64 = "A" * 64
CASES = [  # (path, body, status, the field the error names)
    (CHAT, chat(stream="false"), 400, "stream"),
    (CHAT, chat(stream=1), 400, "stream"),
    (CHAT, ext(advance_context="false"), 400, "advance_context"),
    (CHAT, ext(advance_context=0), 400, "advance_context"),
    (CHAT, chat(seed=1.5), 400, "seed"),
    (CHAT, chat(seed=True), 400, "seed"),
    (CHAT, chat(seed="5"), 400, "seed"),
    (CHAT, chat(seed=-3), 400, "seed"),
    (CHAT, chat(seed=10**30), 400, "seed"),
    (CHAT, ext(knobs=[["seed", 5]]), 400, "knobs"),
    (CHAT, ext(knobs="seed=5"), 400, "knobs"),
    (CHAT, ext(knobs=5), 400, "knobs"),
    (CHAT, ext(knobs={"sed": 1}), 400, "sed"),
    (CHAT, ext(knobs={"seed": 1.5}), 400, "seed"),
    (CHAT, ext(knobs={"thinking": "false"}), 400, "thinking"),
    (CHAT, ext(knobs={"sed": "x" * 100_000}), 400, "sed"),
    (CHAT, chat(max_tokens=1.5), 400, "max_tokens"),
    (CHAT, chat(max_tokens="32"), 400, "max_tokens"),
    (CHAT, chat(max_tokens=True), 400, "max_tokens"),
    (CHAT, chat(max_tokens=-5), 400, "max_tokens"),
    (CHAT, chat(max_completion_tokens=[]), 400, "max_completion_tokens"),
    (CHAT, chat(chat_template_kwargs="x"), 400, "chat_template_kwargs"),
    (CHAT, chat(chat_template_kwargs={"enable_thinking": "yes"}), 400, "chat_template_kwargs"),
    (CHAT, chat(model="gpt-4o"), 404, "model"),
    (CHAT, chat(model=5), 400, "model"),
    (CHAT, chat(dgemma="x"), 400, "dgemma"),
    (CHAT, ext(knob={}), 400, "dgemma"),
    (CHAT, ext(context=5), 400, "context"),
    (CHAT, ext(context="ctx-nope"), 400, "context"),
    (CHAT, ext(image={"shape": [2**40, 2**40, 2**40, 3], "data": B64}), 400, "image"),
    (CHAT, ext(image={"shape": [2**62, 2**62, 4, 1], "data": B64}), 400, "image"),
    (CHAT, ext(image={"shape": [1, 2, 2, 3], "data": "!!!!" * 12}), 400, "image"),
    (CHAT, ext(image={"shape": [True, 2, 2, 3], "data": B64}), 400, "image"),
    (CHAT, ext(image={"shape": [1, 2, 2, 3], "data": "AAAA"}), 400, "image"),
    (CHAT, ext(image="x"), 400, "image"),
    (CHAT, adv(scheduler="entropy_bound"), 400, "scheduler"),
    (CHAT, adv(scheduler={"name": 5}), 400, "scheduler"),
    (CHAT, adv(scheduler={"name": "nope"}), 400, "scheduler"),
    (CHAT, adv(start_step=1.5), 400, "start_step"),
    (CHAT, adv(end_step="9"), 400, "end_step"),
    (CHAT, adv(pins=["a"]), 400, "pins"),
    (CHAT, adv(resume=7), 400, "resume"),
    (CHAT, adv(resume="state-nope"), 400, "canvas_state"),
    (CHAT, adv(bogus=1), 400, "advanced"),
    (CHAT, ext(advanced="x"), 400, "advanced"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "late"}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "nam": "typo"}]}, 400, "messages"),
    (CHAT, {"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {}}]}]}, 400, "image"),
    (CHAT, chat(n=0), 400, "n"),
    (CHAT, chat(n=1.5), 400, "n"),
    (CHAT, chat(n=2, seed=2**64 - 1), 400, "n"),
    (CHAT, chat(stop=""), 400, "stop"),
    (CHAT, chat(stop=5), 400, "stop"),
    (CHAT, chat(logprobs="true"), 400, "logprobs"),
    (CHAT, chat(response_format="json"), 400, "response_format"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"schema": "{"}}), 400, "response_format"),
    (CHAT, chat(response_format={"type": "json_schema", "json_schema": {"schema": {"minimum": 1}}}), 400,
     "response_format"),
    (CHAT, chat(structured_outputs={"choice": ["a"], "regex": "b"}), 400, "structured_outputs"),
    (CHAT, chat(structured_outputs={"regex": "(?=a)b"}), 400, "structured_outputs"),
    (CHAT, chat(guided_choice=[]), 400, "guided_choice"),
    (CHAT, chat(guided_choice=[" padded"]), 400, "guided_choice"),
    (CHAT, chat(guided_json=5), 400, "guided_json"),
    (CHAT, ext(constraint={"kind": "grammar", "text": "x"}), 400, "constraint"),
    (CHAT, chat(chat_template_kwargs={"tools": []}), 400, "chat_template_kwargs"),
    (CHAT, chat(presence_penalty=True), 400, "presence_penalty"),
    (CHAT, chat(**{"x" * 5000: 1}), 400, "x"),
    (CHAT, with_parts(image_part("http://attacker.example/x.png")), 400, "image"),
    (CHAT, with_parts(image_part("data:image/png;base64,!!!!")), 400, "image"),
    (CHAT, with_parts(image_part(data_url(b"not a picture at all"))), 400, "image"),
    (CHAT, with_parts(image_part(data_url(SMALL[: len(SMALL) // 2]))), 400, "image"),
    (CHAT, with_parts(image_part(data_url(b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 9 9\n"))), 400, "image"),
    (CHAT, with_parts(*[image_part(data_url(SMALL))] * 17), 400, "image"),
    (CHAT, with_parts(image_part(data_url(SMALL)), dgemma={"image": {"shape": [1, 1, 1, 3], "data": "A" * 16}}), 400,
     "image"),
    (CHAT, with_parts(image_part(data_url(png(20000, 20000, pixels=False)))), 400, "image"),
    (CHAT, b"[" * 100_000 + b"]" * 100_000, 400, "body"),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "seed": NaN}', 400, "body"),
    (CHAT, b'{"seed": ' + b"9" * 5000 + b"}", 400, "body"),
    (CHAT, b"\xff\xfe garbage", 400, "body"),
    (CHAT, b"[1, 2]", 400, "body"),
    (CHAT, b"null", 400, "body"),
    (CONTEXTS, {"text": 5}, 400, "text"),
    (CONTEXTS, {"text": "x", "onto": 5}, 400, "onto"),
    (CONTEXTS, {"text": "x", "onto": "ctx-nope"}, 400, "context"),
    (CONTEXTS, {"text": "x", "bogus": 1}, 400, "body"),
    (CONTEXTS, {"text": "x", "image": "x"}, 400, "image"),
    (CONTEXTS, {"text": "x", "image": {"shape": [1, 2, 2, 3], "data": "@@@@" * 12}}, 400, "image"),
    (CONTEXTS, b"[" * 100_000, 400, "body"),
    (CONTEXTS, [1], 400, "body"),
]


@pytest.fixture(scope="module")
def server():
    with served("--model", "diffusiongemma-demo") as (url, _):  # the demo by the name the Loader lists it under
        yield url


def test_hostile_bodies_are_short_4xx_naming_the_field_and_start_nothing(server):
    assert len(CASES) >= 40
    for path, body, status, name in CASES:
        got, answer, _ = ask(server, "POST", path, body, {"Content-Type": "application/json"})
        shown = (path, str(body)[:80])
        assert got == status, (shown, got, answer)
        error = answer["error"]
        assert error["param"] == name or name in error["message"], (shown, error)
        assert len(error["message"]) <= 600 and "Traceback" not in error["message"], (shown, error)
    after = health(server)
    assert after["busy"] == 0 and after["started"] == 0 and after["contexts"] == 0


def test_an_unknown_model_is_openais_model_not_found(server):
    status, answer, _ = ask(server, "POST", CHAT, chat(model="gpt-4o"))
    assert status == 404 and answer["error"]["code"] == "model_not_found" and answer["error"]["param"] == "model"
    assert "gpt-4o" in answer["error"]["message"] and "diffusiongemma-demo" in answer["error"]["message"]


def test_the_served_model_named_or_absent_runs(server):
    for body in (chat(model="diffusiongemma-demo", stream=False), chat(seed=None, stream=None)):
        status, answer, _ = ask(server, "POST", CHAT, body)
        assert status == 200 and answer["choices"][0]["message"]["content"] == "seven", answer


def test_the_model_card_names_the_model_and_no_server_path(server):
    from diffusiongemma.dgemma.demo import DEMO_DIR

    for path in ("/v1/models", "/health"):
        status, answer, _ = ask(server, "GET", path)
        assert status == 200 and str(DEMO_DIR) not in json.dumps(answer) and "demo_model" not in json.dumps(answer)
    card = ask(server, "GET", "/v1/models")[1]["data"][0]
    assert card["id"] == card["dgemma"]["model_source"] == "diffusiongemma-demo"


def test_a_picture_runs_through_the_header_checked_decoder(server):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 64), (0, 0, 255)).save(out, "PNG")
    body = with_parts(image_part(data_url(out.getvalue())), dgemma={"knobs": {"seed": 0}})
    status, answer, _ = ask(server, "POST", CHAT, body)
    assert status == 200 and answer["choices"][0]["message"]["content"] == "blue", answer


def _peak_rss_growth(pid: str, action) -> int:
    """Bytes the process's peak resident size grew by during `action` (its peak reset first)."""
    def field(name):
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(name):
                return int(line.split()[1]) * 1024
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = field("VmRSS:")
    action()
    return field("VmHWM:") - before


def test_a_9000_pixel_square_png_is_refused_from_its_header_in_the_server_and_the_mcp_server():
    from diffusiongemma.dgemma.errors import InputError
    from diffusiongemma.mcp_server.inputs import image

    big = png(9000, 9000)
    assert len(big) < 400_000
    with served() as (url, proc):
        replies = []
        grew = _peak_rss_growth(str(proc.pid), lambda: replies.append(
            ask(url, "POST", CHAT, with_parts(image_part(data_url(big))))))
        status, answer, _ = replies[0]
        assert status == 400 and answer["error"]["param"] == "image" and "9000x9000" in answer["error"]["message"]
        assert grew < 50 * 2**20, f"the server's peak memory grew {grew / 2**20:.0f} MiB"
    errors = []

    def mcp():
        try:
            image(base64.b64encode(big).decode(), ())
        except InputError as err:
            errors.append(err)

    grew = _peak_rss_growth("self", mcp)
    assert errors and errors[0].name == "image" and "9000x9000" in str(errors[0])
    assert grew < 50 * 2**20, f"the MCP decoder's peak memory grew {grew / 2**20:.0f} MiB"
