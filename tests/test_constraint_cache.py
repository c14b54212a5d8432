"""The compiled constraint kept on disk: read by a second process without a compile, rebuilt when its file is
damaged or foreign, keyed by the tokenizer; the server warms the common ones and a stream says when it waits
for a compile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from diffusiongemma.dgemma.constraints import automaton as automaton_mod
from diffusiongemma.dgemma.constraints import constraint as constraint_mod
from diffusiongemma.dgemma.constraints import store
from diffusiongemma.dgemma.constraints.constraint import Constraint, automaton, held
from diffusiongemma.serve.app import COMPILING_COMMENT, build_app
from diffusiongemma.serve.runs import Engine
from diffusiongemma.serve.structured import JSON_OBJECT, common

REPO = Path(__file__).resolve().parents[1]
PATTERN = "[0-9]{3}-[a-z]{2,4}"
SECOND = """
import sys
sys.path.insert(0, sys.argv[1])
from headless import load_pack
load_pack()
from diffusiongemma.dgemma import load_model
from diffusiongemma.dgemma.demo import DEMO_DIR
from diffusiongemma.dgemma.constraints import automaton as automaton_mod
from diffusiongemma.dgemma.constraints.constraint import Constraint, automaton
compiles = []
original = automaton_mod.compile_index
automaton_mod.compile_index = lambda *a, **k: compiles.append(1) or original(*a, **k)
found = automaton(load_model(str(DEMO_DIR)), Constraint("regex", sys.argv[2]))
print(len(compiles), found.dist[-1])
"""


@pytest.fixture
def compiles(monkeypatch):
    """Each compile by outlines-core, counted; the automata kept in memory forgotten first."""
    count = []
    original = automaton_mod.compile_index
    monkeypatch.setattr(automaton_mod, "compile_index", lambda *a, **k: count.append(1) or original(*a, **k))
    monkeypatch.setattr(constraint_mod, "_compiled", {})
    return count


def test_a_second_process_reads_the_automaton_without_compiling(demo_model, compiles, constraint_cache):
    found = automaton(demo_model, Constraint("regex", PATTERN))
    assert len(compiles) == 1 and len(list(constraint_cache.glob("*.automaton"))) == 1
    out = subprocess.run([sys.executable, "-c", SECOND, str(REPO), PATTERN], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["0", str(found.dist[-1])]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign", "not ours", "huge header"])
def test_a_damaged_or_foreign_file_is_ignored_and_rebuilt(demo_model, compiles, constraint_cache, monkeypatch,
                                                         damage):
    first = automaton(demo_model, Constraint("regex", PATTERN))
    path, = constraint_cache.glob("*.automaton")
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:len(raw) // 2])
    elif damage == "flipped":
        path.write_bytes(raw[:-5] + bytes([raw[-5] ^ 1]) + raw[-4:])
    elif damage == "foreign":  # another constraint's file under this key
        automaton(demo_model, Constraint("regex", "[a-c]{2}"))
        other = next(p for p in constraint_cache.glob("*.automaton") if p != path)
        other.replace(path)
    elif damage == "not ours":
        path.write_bytes(b"\x80\x04\x95" + raw)  # a pickle's opening: never unpickled
    else:
        path.write_bytes(store.MAGIC + (2**31).to_bytes(4, "little") + raw[len(store.MAGIC) + 4:])
    monkeypatch.setattr(constraint_mod, "_compiled", {})
    before = len(compiles)
    again = automaton(demo_model, Constraint("regex", PATTERN))
    assert len(compiles) == before + 1
    assert again.dist == first.dist and again.finals == first.finals
    assert store.load(path.stem) is not None  # written again, whole


def test_the_key_changes_with_the_tokenizer_the_constraint_and_the_compiler(demo_model, tiny_model, compiles,
                                                                            constraint_cache, monkeypatch):
    key = store.key_of(demo_model.tokenizer_fingerprint, "regex", PATTERN)
    assert key != store.key_of(tiny_model.tokenizer_fingerprint, "regex", PATTERN)
    assert key != store.key_of(demo_model.tokenizer_fingerprint, "regex", PATTERN + "x")
    assert key != store.key_of(demo_model.tokenizer_fingerprint, "choice", PATTERN)
    monkeypatch.setattr(store, "_outlines_version", lambda: "0.0.0")
    assert key != store.key_of(demo_model.tokenizer_fingerprint, "regex", PATTERN)
    monkeypatch.undo()
    monkeypatch.setenv("DGEMMA_CONSTRAINT_CACHE", str(constraint_cache))
    monkeypatch.setattr(automaton_mod, "compile_index", lambda *a, **k: compiles.append(1) or original(*a, **k))
    monkeypatch.setattr(constraint_mod, "_compiled", {})
    for dm in (demo_model, tiny_model):
        automaton(dm, Constraint("regex", PATTERN))
    assert len(compiles) == 2 and len(list(constraint_cache.glob("*.automaton"))) == 2


original = automaton_mod.compile_index


def test_the_server_warms_the_common_constraints(demo_model, compiles):
    engine = Engine(demo_model, "diffusiongemma-demo")
    made = [lambda: Constraint("regex", PATTERN), lambda: Constraint("choice", "yes\nno")]
    engine.warm(made).join(timeout=120)
    assert engine.warmed == 2 and len(compiles) == 2
    assert held(demo_model, Constraint("regex", PATTERN)) and held(demo_model, Constraint("choice", "yes\nno"))
    first, last = common()[0], common()[-1]
    assert first().text == JSON_OBJECT == last().text


@contextmanager
def in_process(engine):
    """The server's app on a free loopback port, in a thread of its own; yields its URL."""
    loop, ready = asyncio.new_event_loop(), threading.Event()
    found = {}

    async def start():
        runner = web.AppRunner(build_app(engine), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        found["url"], found["runner"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", runner
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield found["url"]
    finally:
        asyncio.run_coroutine_threadsafe(found["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def test_a_stream_says_it_waits_for_a_slow_compile(demo_model, monkeypatch):
    """The compile cannot end until the client has read the comment: no timing decides the test."""
    heard = threading.Event()
    slow = automaton_mod.Automaton.compiled

    def compiled(*args, **kwargs):
        assert heard.wait(60), "the stream said nothing while the constraint compiled"
        return slow(*args, **kwargs)

    monkeypatch.setattr(automaton_mod.Automaton, "compiled", staticmethod(compiled))
    monkeypatch.setattr(constraint_mod, "_compiled", {})
    body = {"model": "diffusiongemma-demo", "stream": True, "messages": [{"role": "user", "content": "What is 3+4?"}],
            "structured_outputs": {"regex": PATTERN}}

    async def client(url):
        lines = []
        async with aiohttp.ClientSession() as session, session.post(url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200
            async for line in r.content:
                if line == COMPILING_COMMENT[:-1]:
                    heard.set()
                lines.append(line.strip())
        return lines

    with in_process(Engine(demo_model, "diffusiongemma-demo")) as url:
        lines = asyncio.run(client(url))
    said = lines.index(COMPILING_COMMENT.strip())
    frames = [i for i, line in enumerate(lines) if b'"diffusion_frame"' in line]
    assert frames and said < frames[0] and lines[-2] == b"data: [DONE]"
    answer = [json.loads(line[6:]) for line in lines if line.startswith(b"data: {") and b'"content"' in line]
    assert answer and answer[-1]["choices"][0]["delta"]["content"]
