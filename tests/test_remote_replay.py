"""A hostile pack-dialect server: a real stream recorded from `python -m serve` on the demo, replayed
with one field changed per case. Each is refused with a RemoteError naming the server and the field,
and no output comes back; the unchanged replay gives the recorded run."""

from __future__ import annotations

import base64
import copy
import math

import numpy as np
import pytest
from executor import call
from hostile_server import PROMPT, card, final, frames, pack_answer, recording, serving, step

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.remote.http import RemoteError

Loader, Sampler = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"], NODE_CLASS_MAPPINGS["DGemmaSampler"]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def entropy_with(rec, value):
    e = np.frombuffer(base64.b64decode(step(rec)["entropy"]), "<f2").copy()
    e[3] = value
    step(rec)["entropy"] = b64(e.tobytes())


def swap_steps(rec):
    a, b = step(rec, 0), step(rec, 1)
    a["step"], b["step"] = b["step"], a["step"]


def repeat_events(rec):
    extra = {"choices": [], "note": "padding"}
    rec["events"][1:1] = [extra] * 200


# (name, what changes, the field the refusal names): steps, the run's end, the card and table.
CASES = [
    ("negative id", lambda r: step(r)["ids"].__setitem__(0, -1), "ids"),
    ("id past vocab", lambda r: step(r)["ids"].__setitem__(0, len(r["tokens"]["token_strings"])), "ids"),
    ("ids too short", lambda r: step(r)["ids"].pop(), "ids"),
    ("ids a text", lambda r: step(r).__setitem__("ids", "1,2,3"), "ids"),
    ("ids float", lambda r: step(r)["ids"].__setitem__(2, 1.5), "ids"),
    ("mask not base64", lambda r: step(r).__setitem__("committed", "!!!!"), "committed"),
    ("mask too long", lambda r: step(r).__setitem__("committed", b64(bytes(9))), "committed"),
    ("no committed mask", lambda r: step(r).__setitem__("committed", None), "committed"),
    ("entropy NaN", lambda r: entropy_with(r, np.nan), "entropy"),
    ("entropy negative", lambda r: entropy_with(r, -1.0), "entropy"),
    ("entropy short", lambda r: step(r).__setitem__("entropy", b64(bytes(6))), "entropy"),
    ("t NaN", lambda r: step(r).__setitem__("t", math.nan), "t must"),
    ("t above 1", lambda r: step(r).__setitem__("t", 1.5), "t must"),
    ("T negative", lambda r: step(r).__setitem__("T", -3), "T must"),
    ("T infinite", lambda r: step(r).__setitem__("T", math.inf), "T must"),
    ("block past the run", lambda r: step(r).__setitem__("block", 7), "block"),
    ("step past the steps", lambda r: step(r).__setitem__("step", 500), "step"),
    ("step a bool", lambda r: step(r).__setitem__("step", True), "step"),
    ("steps out of order", swap_steps, "step"),
    ("events past the cap", repeat_events, "events"),
    ("text says HACKED", lambda r: final(r)["state"].__setitem__("text", "HACKED"), "state.text"),
    ("seed 999 for 3", lambda r: final(r)["config"].__setitem__("seed", 999), "config.seed"),
    ("a knob changed", lambda r: final(r)["config"].__setitem__("t_min", 0.1), "config.t_min"),
    ("prompt changed", lambda r: final(r)["config"].__setitem__("prompt", "x"), "config.prompt"),
    ("raw id past vocab", lambda r: final(r)["state"]["raw_ids"].__setitem__(0, 10**6), "state.raw_ids"),
    ("raw ids not streamed", lambda r: final(r)["state"]["raw_ids"].__setitem__(0, 0), "state.raw_ids"),
    ("answer ids invented", lambda r: final(r)["state"].__setitem__("answer_ids", [3, 2, 1, 0, 0]), "state.answer_ids"),
    ("answer_tokens lie", lambda r: final(r)["state"].__setitem__("answer_tokens", 1), "state.answer_tokens"),
    ("steps_used lie", lambda r: final(r)["state"].__setitem__("steps_used", 99), "state.steps_used"),
    ("committed_fraction 2", lambda r: final(r)["state"].__setitem__("committed_fraction", 2.0),
     "state.committed_fraction"),
    ("knob_index short", lambda r: final(r)["trace"]["knob_index"].pop(), "trace.knob_index"),
    ("knob_index past sets", lambda r: final(r)["trace"]["knob_index"].__setitem__(0, 5), "trace.knob_index"),
    ("a constraint unasked", lambda r: final(r)["state"].__setitem__("constraint", {"kind": "x"}),
     "state.constraint"),
    ("resume on a plain run", lambda r: final(r).__setitem__("resume", "res-1"), "resume"),
    ("context unasked", lambda r: final(r).__setitem__("context", {"handle": "h", "length": 3, "summary": {}}),
     "context"),
    ("state a list", lambda r: final(r).__setitem__("state", []), "state"),
]
CARD_CASES = [
    ("canvas 0", lambda r: card(r).__setitem__("canvas_length", 0), "canvas_length"),
    ("canvas -32", lambda r: card(r).__setitem__("canvas_length", -32), "canvas_length"),
    ("canvas 10**9", lambda r: card(r).__setitem__("canvas_length", 10**9), "canvas_length"),
    ("canvas a text", lambda r: card(r).__setitem__("canvas_length", "32"), "canvas_length"),
    ("max_positions 0", lambda r: card(r).__setitem__("max_positions", 0), "max_positions"),
    ("vocab not the table's", lambda r: card(r).__setitem__("vocab_size", 5), "token_strings"),
    ("a token a number", lambda r: r["tokens"]["token_strings"].__setitem__(9, 9), "token_strings"),
    ("a token 10 kB", lambda r: r["tokens"]["token_strings"].__setitem__(9, "x" * 10_000), "token_strings"),
    ("card list", lambda r: r["models"].__setitem__("data", [[1, 2]]), "lists no model"),
    ("data an object", lambda r: r["models"].__setitem__("data", {"id": "x"}), "data must be a list"),
    ("info a list", lambda r: r["models"]["data"][0].__setitem__("dgemma", [1]), "diffusion_frame"),
]


def replayed(rec):
    return serving(pack_answer(rec["models"], rec["tokens"], rec["events"]))


def test_the_unchanged_replay_is_the_recorded_run():
    rec = recording()
    with replayed(rec) as (url, seen):
        (model, dialect), _ = call(Loader, url=url)
        (text, state, trace, *_), _ = call(Sampler, model=model, prompt=PROMPT, **rec["knobs"])
    assert dialect == "pack" and text == final(rec)["state"]["text"] == "seven"
    assert len(trace) == len(frames(rec)) and list(state.raw_ids) == final(rec)["state"]["raw_ids"]


@pytest.mark.parametrize("name,change,field", CASES, ids=[c[0] for c in CASES])
def test_a_changed_stream_is_refused(name, change, field):
    rec = copy.deepcopy(recording())
    change(rec)
    with replayed(rec) as (url, _):
        (model, _), _ = call(Loader, url=url)
        with pytest.raises(RemoteError) as caught:
            call(Sampler, model=model, prompt=PROMPT, **rec["knobs"])
    message = str(caught.value)
    assert url in message and field in message and len(message) < 600, message


@pytest.mark.parametrize("name,change,field", CARD_CASES, ids=[c[0] for c in CARD_CASES])
def test_a_changed_card_is_refused(name, change, field):
    rec = copy.deepcopy(recording())
    change(rec)
    with replayed(rec) as (url, _):
        if field == "diffusion_frame":  # not this pack's card: read as the shim's, whose card has no numbers
            assert call(Loader, url=url)[0][1] == "diffusion_frame"
            return
        with pytest.raises(RemoteError) as caught:
            call(Loader, url=url)
    message = str(caught.value)
    assert url in message and field in message and len(message) < 600, message


def test_a_text_is_checked_against_what_its_ids_decode_to_with_the_real_vocabulary():
    from conftest import checkpoint
    from transformers import AutoTokenizer

    from diffusiongemma.dgemma.inputs.tokens import display_strings
    from diffusiongemma.remote.verify import spells

    tok = AutoTokenizer.from_pretrained(str(checkpoint("real-vocab")))
    strings = display_strings(tok, 262144)
    special = sorted(tok.all_special_ids)[5]
    for text in ("The answer is seven.", "  naïve café, 日本 😀 \n x<table>y </td>", "3+4=7 is seven"):
        plain = tok.encode(text, add_special_tokens=False)
        for ids in (plain, plain[:2] + [special] + plain[2:]):  # a special token decoding skips
            said = tok.decode(ids, skip_special_tokens=True).strip()
            assert spells(said, ids, strings), (said, ids)
            assert not spells("HACKED", ids, strings) and not spells(said + " HACKED", ids, strings)
            assert not spells(said.replace("e", "a", 1), ids, strings)
