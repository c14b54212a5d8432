"""A remote window resumes wherever a local one does: the pack dialect's answer check reads a paused
canvas's byte-fallback tokens the way the tokenizer decodes them (a run of bytes that is not UTF-8 is one
U+FFFD per byte, its printable bytes included), from the byte table the server sends beside its strings."""

from __future__ import annotations

import random

import pytest
from conftest import checkpoint
from executor import call
from remote_server import served
from transformers import AutoTokenizer

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.demo import DEMO_DIR
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.dgemma.inputs.tokens import decoding_table, display_strings
from diffusiongemma.remote.connect import connect
from diffusiongemma.remote.verify import reads_as, spells

Advanced = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]


@pytest.mark.parametrize("source", ["demo", "real-vocab"])
def test_byte_runs_are_read_as_the_tokenizer_decodes_them(source):
    tok = AutoTokenizer.from_pretrained(str(DEMO_DIR) if source == "demo" else str(checkpoint(source)))
    strings = display_strings(tok, len(tok))
    table = decoding_table(tok, len(tok))
    decoding = ({i: b for i, b in table["bytes"]}, frozenset(table["skipped"]))
    byte = {b: i for i, b in table["bytes"]}
    plain = tok.encode("seven", add_special_tokens=False)
    ids = plain + [byte[0x64], byte[0x92], byte[0x41]] + plain  # 'd', an invalid byte, 'A': three U+FFFD
    said = tok.decode(ids, skip_special_tokens=True).strip()
    assert "\ufffd" * 3 in said and reads_as(said, ids, strings, decoding) and not spells(said, ids, strings)
    for wrong in (said.replace("seven", "eight", 1), "HACKED", said + " HACKED", said.replace("\ufffd", "d", 1)):
        assert not reads_as(wrong, ids, strings, decoding), wrong
    rnd = random.Random(0)
    for _ in range(100):  # a paused canvas: noise, byte tokens among it
        noise = [rnd.choice(list(byte.values())) if rnd.random() < 0.3 else rnd.randrange(len(tok)) for _ in range(32)]
        assert reads_as(tok.decode(noise, skip_special_tokens=True).strip(), noise, strings, decoding)


@pytest.fixture(scope="module")
def remote():
    with served() as (url, _):
        yield connect(url)


@pytest.mark.parametrize("seed", range(6))
def test_an_early_remote_window_resumes_as_a_local_one(demo_model, remote, seed):
    base = dict(Knobs(seed=seed, num_inference_steps=12, gen_length=32, confidence=0.0).asdict(),
                scheduler="entropy_bound", pins="", prompt="What is 3+4?")
    texts = {}
    for name, model in (("local", demo_model), ("remote", remote)):
        first, _ = call(Advanced, model=model, start_step=0, end_step=1 + seed % 2, **base)
        second, _ = call(Advanced, model=model, canvas_state=first[1], start_step=1 + seed % 2, end_step=1024, **base)
        texts[name] = (first[0], second[0], tuple(second[1].raw_ids))
    assert texts["remote"] == texts["local"]
