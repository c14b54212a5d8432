"""Constrained decoding: every answer satisfies its constraint, the empty one changes nothing, refusals."""

from __future__ import annotations

import dataclasses
import json
import re

import jsonschema
import numpy as np
import pytest

from diffusiongemma.dgemma import Constraint, Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_KNOBS, WORDS
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.runlog import records, replay
from diffusiongemma.dgemma.readouts.states import CONSTRAINED
from diffusiongemma.dgemma.steps.schedulers import SCHEDULERS, Scheduling
from diffusiongemma.testing.schemas import SCHEMAS, SUM

REGEX = r"[0-9]{3}-[a-z]{2,4}"


def satisfies(result, kind: str, text: str) -> bool:
    answer = result.text
    if kind == "json_schema":
        jsonschema.validate(json.loads(answer), json.loads(text))
        return True
    if kind == "regex":
        return re.fullmatch(text, answer) is not None
    return answer in text.split("\n")


def check_valid(result, kind, text):
    assert satisfies(result, kind, text), result.text
    assert result.state.finished_honestly and result.state.constraint["satisfied"], result.state.constraint
    assert result.state.constraint["reason"] == ""


RANDOM_CASES = [("json_schema", json.dumps(s)) for s in SCHEMAS.values()] + [
    ("regex", REGEX), ("choice", "yes\nno\nmaybe later")]


@pytest.mark.parametrize("kind, text", RANDOM_CASES, ids=[*SCHEMAS, "regex", "choice"])
def test_random_weights_answer_valid_only_through_the_constraint(tiny_model, kind, text):
    plain = generate(tiny_model, "What is 1+2?", Knobs(seed=0, num_inference_steps=4))
    assert not (plain.state.turn_closed and _quiet(satisfies, plain, kind, text))
    for seed in range(2):
        knobs = Knobs(seed=seed, num_inference_steps=4)
        check_valid(generate(tiny_model, "What is 1+2?", knobs, constraint=Constraint(kind, text)), kind, text)


def _quiet(fn, *args) -> bool:
    try:
        return fn(*args)
    except (ValueError, jsonschema.ValidationError):
        return False


DEMO_CASES = [("json_schema", json.dumps(SUM)), ("json_schema", json.dumps(SCHEMAS["integer"])),
              ("regex", "(one|two|three|four|five|six|seven|eight|nine)"), ("choice", "\n".join(WORDS))]


@pytest.mark.parametrize("kind, text", DEMO_CASES, ids=["sum", "integer", "regex", "choice"])
def test_demo_answers_valid_over_many_seeds(demo_model, kind, text):
    for seed in range(6):
        a, b = divmod(seed * 13 % 100, 10)
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": seed})
        check_valid(generate(demo_model, f"What is {a}+{b}?", knobs, constraint=Constraint(kind, text)), kind, text)


@pytest.mark.parametrize("kind, text, answers", [
    ("choice", "\n".join(WORDS), WORDS),
    ("choice", "1\n2\n10\n100", ["1", "10", "100"]),
    ("regex", "ab(cd)?", ["ab", "abcd"]),
    ("regex", "^[0-9]{3}-[a-z]{2,4}$", ["123-ab", "123-abcd"]),
])
def test_every_answer_can_be_written_even_one_that_extends_another(demo_model, kind, text, answers):
    from diffusiongemma.dgemma.constraints.automaton import DONE, START
    from diffusiongemma.dgemma.constraints.constraint import automaton

    found = automaton(demo_model, Constraint(kind, text))
    eos = demo_model.eos_ids[0]
    for answer in answers:
        ids = demo_model.tokenizer.encode(answer, add_special_tokens=False)
        assert found.run(START, [*ids, eos]) == DONE, answer
    assert found.run(START, [*demo_model.tokenizer.encode(answers[0] + "!", add_special_tokens=False), eos]) is None


def test_demo_keeps_its_accuracy_on_answers_that_extend_others(demo_model):
    choice = Constraint("choice", "\n".join(WORDS))
    for a, b in ((5, 9), (7, 9), (8, 9), (9, 9), (6, 8)):  # fourteen..eighteen: four..eight are answers too
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": a * 10 + b})
        result = generate(demo_model, f"What is {a}+{b}?", knobs, constraint=choice)
        assert result.text == WORDS[a + b] == generate(demo_model, f"What is {a}+{b}?", knobs).text


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_empty_constraint_leaves_ids_unchanged(tiny_model, scheduler):
    knobs = Knobs(seed=11, num_inference_steps=6, gen_length=300, confidence=0.0)
    advanced = Advanced(Scheduling(scheduler))
    plain = generate(tiny_model, "What is 1+2?", knobs, advanced=advanced)
    for empty in (Constraint("json_schema", ""), Constraint("choice", "")):
        ours = generate(tiny_model, "What is 1+2?", knobs, advanced=advanced, constraint=empty)
        assert ours.state.raw_ids == plain.state.raw_ids
        assert np.array_equal(ours.trace.ids, plain.trace.ids)
        assert ours.trace.constrained_bits is None and ours.state.constraint is None
        assert ours.config.constraint is None


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_each_scheduler_answers_valid(tiny_model, scheduler):
    constraint = Constraint("json_schema", json.dumps(SCHEMAS["enum"]))
    result = generate(tiny_model, "hi", Knobs(seed=2, num_inference_steps=4), advanced=Advanced(Scheduling(scheduler)),
                      constraint=constraint)
    check_valid(result, "json_schema", constraint.text)


def test_answer_spans_blocks(demo_model):
    schema = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{40}$"}},
              "required": ["code"]}
    result = generate(demo_model, "What is 3+4?", Knobs(seed=1, num_inference_steps=8, gen_length=96),
                      constraint=Constraint("json_schema", json.dumps(schema)))
    assert result.state.blocks >= 2
    check_valid(result, "json_schema", json.dumps(schema))


PAIR = {"type": "object", "properties": {"sum": SUM["properties"]["sum"], "even": {"type": "boolean"}},
        "required": ["sum", "even"], "additionalProperties": False}


def test_readings_show_the_constrained_positions(demo_model):
    """A schema of two properties: the demo never learned JSON, so the constraint writes its braces and keys."""
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.nodes import host

    events = []
    host.listen(lambda name, data: events.append((name, data)))
    try:
        out, _ = call(NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"], model=demo_model, prompt="What is 3+4?",
                      seed=0, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
                      gen_length=32, thinking=False, scheduler="entropy_bound", pins="", start_step=0,
                      end_step=1024, constraint_type="json_schema", constraint=json.dumps(PAIR))
    finally:
        host._listeners.clear()
    text, state, trace, frames, _, config = out
    jsonschema.validate(json.loads(text), PAIR)
    assert state.constraint["satisfied"] and state.constraint["changed_positions"] > 0
    assert trace.constrained.any() and (trace.states() == CONSTRAINED).any()
    start = events[0][1]
    assert start["states"][CONSTRAINED] == "constrained" and "constrained" in start["palette"]
    assert any(str(CONSTRAINED) in d["state"] for n, d in events if n == "dgemma.step")
    header, *_, final = records(trace, config, state, frames)
    digest = Constraint("json_schema", json.dumps(PAIR)).summary()["sha256"]
    assert header["constraint"] == {"kind": "json_schema", "text": json.dumps(PAIR), "sha256": digest}
    assert final["constraint"]["satisfied"] and final["finished_honestly"]
    rows = records(trace, config, state, frames)
    again = replay(rows[0], rows[1:-1])
    assert np.array_equal(again.states(), trace.states())
    assert frames == frame_texts(trace, demo_model.token_strings)


def test_denoise_node_takes_a_constraint(demo_model):
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS

    out, _ = call(NODE_CLASS_MAPPINGS["DGemmaDenoise"], model=demo_model, prompt="What is 2+2?", seed=1,
                  num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005, gen_length=32,
                  thinking=False, constraint_type="choice", constraint="yes\nno")
    assert out[0] in ("yes", "no") and out[1].finished_honestly


def test_pins_that_disagree_are_reported_not_hidden(demo_model):
    result = generate(demo_model, "What is 3+4?", Knobs(seed=0, num_inference_steps=8),
                      advanced=Advanced(pins="0: zzz"), constraint=Constraint("choice", "yes\nno"))
    verdict = result.state.constraint
    assert not verdict["satisfied"] and "pins" in verdict["reason"]
    assert not result.state.finished_honestly


def test_a_paused_run_is_not_yet_satisfied(demo_model):
    result = generate(demo_model, "What is 3+4?", Knobs(seed=0), advanced=Advanced(end_step=1),
                      constraint=Constraint("json_schema", json.dumps(SUM)))
    assert result.state.paused and not result.state.constraint["satisfied"]
    assert "paused" in result.state.constraint["reason"] and not result.state.finished_honestly
    resumed = generate(demo_model, "What is 3+4?", Knobs(seed=0), constraint=Constraint("json_schema", json.dumps(SUM)),
                       advanced=Advanced(start_step=1, resume=result.state.resume))
    check_valid(resumed, "json_schema", json.dumps(SUM))


@pytest.mark.parametrize("kind, text, match", [
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", '{"type": "integer", "multipleOf": 3}', "'multipleOf'"),
    ("json_schema", '{"type": "object", "properties": {"a": {"not": {"type": "string"}}}}', "'not' at #/properties/a"),
    ("json_schema", '{"type": "number", "minimum": 0}', "'minimum'"),
    ("json_schema", '{"type": "integer", "minimum": 0}', "both a minimum and a maximum"),
    ("json_schema", '{"type": "string", "format": "colour"}', "cannot be compiled"),
    ("regex", "a(b", "does not compile"),
    ("regex", "(?=a)b", "lookaround"),
    ("regex", " \n", "regex is blank"),
    ("json_schema", " ", "not valid JSON"),
    ("choice", "\n  \n", "choice list is empty"),
    ("colour", "x", "constraint_type must be one of"),
])
def test_bad_constraints_refused(kind, text, match):
    with pytest.raises(InputError, match=re.escape(match)):
        Constraint(kind, text)


def test_empty_choice_refused():
    with pytest.raises(InputError, match="choice list is empty"):
        Constraint("choice", "\n \n\t\n")


def test_constraint_that_cannot_fit_refused_before_work(demo_model):
    frames = []
    long_option = Constraint("choice", "a" * 40)
    with pytest.raises(InputError, match="41 tokens with its EOS, over the 32 positions gen_length 8"):
        generate(demo_model, "What is 3+4?", Knobs(gen_length=8), on_frame=frames.append, constraint=long_option)
    assert not frames
    fits = generate(demo_model, "What is 3+4?", Knobs(gen_length=64, num_inference_steps=4), constraint=long_option)
    assert fits.text == "a" * 40 and fits.state.finished_honestly


def test_node_refuses_before_the_view_resets(demo_model):
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.nodes import host

    events = []
    host.listen(lambda name, data: events.append(name))
    try:
        with pytest.raises(InputError, match="'uniqueItems'"):
            call(NODE_CLASS_MAPPINGS["DGemmaDenoise"], model=demo_model, prompt="What is 2+2?", seed=1,
                 num_inference_steps=4, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005, gen_length=32,
                 thinking=False, constraint_type="json_schema",
                 constraint='{"type": "array", "uniqueItems": true}')
    finally:
        host._listeners.clear()
    assert events == []


def test_constraint_is_a_plain_value():
    a = Constraint("choice", "yes\nno")
    assert a == Constraint("choice", "yes\nno") and dataclasses.replace(a, text="") != a
    assert not Constraint("json_schema", "").active


def test_missing_library_refused_with_the_install_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "outlines_core", None)
    with pytest.raises(InputError, match="pip install outlines-core"):
        Constraint("json_schema", '{"type": "integer"}')
