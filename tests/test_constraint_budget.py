"""A constraint's compile is bounded: refused before compiling when its structure is too costly, and
bounded in CPU time and memory while it compiles (in a child process that Cancel kills)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from diffusiongemma.dgemma import Constraint, Knobs, generate
from diffusiongemma.dgemma.constraints import budget
from diffusiongemma.dgemma.constraints.constraint import automaton
from diffusiongemma.dgemma.errors import Cancelled, InputError


def nested_any_of(depth: int, items: int) -> dict:
    """Arrays of arrays of alternatives: each level multiplies the automaton by its maxItems."""
    if depth == 0:
        return {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 10}, {"type": "boolean"}]}
    inner = nested_any_of(depth - 1, items)
    return {"anyOf": [{"type": "array", "items": inner, "maxItems": items},
                      {"type": "object", "properties": {"v": inner}, "required": ["v"]}]}


NESTED = json.dumps(nested_any_of(3, 12))
OPTIONAL_300 = json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}})


@pytest.mark.parametrize("kind, text, match", [
    ("regex", "a{1000000}", "the repetition 'a{1000000}' (about 1,000,000 states"),
    ("regex", "(x[0-9]{100}){300}", "the repetition '(x[0-9]{100}){300}'"),
    ("regex", "[a-z]+@example\\.(com|org)-[0-9]{30000}", "the repetition '….(com|org)-[0-9]{30000}'"),
    ("json_schema", "{}", "a schema that allows any JSON value at #; give it a type"),
    ("json_schema", '{"type": "object", "properties": {"a": true}}', "any JSON value at #/properties/a"),
    ("json_schema", '{"type": "string", "maxLength": 100000}', "maxLength 100000 at # (about 1,000,003 states"),
    ("json_schema", OPTIONAL_300, "an object with 300 optional properties at #; keep it to 100"),
    ("json_schema", NESTED, "maxItems 12 at #/anyOf/0 (about"),
    ("json_schema", json.dumps({"anyOf": [{"type": "string", "maxLength": 500 + i} for i in range(5)]}),
     "anyOf of 5 branches at #"),
])
def test_too_costly_refused_before_compiling_naming_the_part(monkeypatch, kind, text, match):
    monkeypatch.setattr(budget, "run_child", lambda *a, **k: pytest.fail("a child compile was started"))
    with pytest.raises(InputError, match=re.escape(match)) as err:
        Constraint(kind, text)
    assert "too costly to compile" in str(err.value) and len(str(err.value)) < 500


def test_the_nested_schema_is_small_text():
    assert len(NESTED) < 2500


def test_a_deep_schema_or_regex_is_refused_not_a_recursion_error():
    deep = '{"items": ' * 40 + '{"type": "integer"}' + "}" * 40
    with pytest.raises(InputError, match="nested more than 32 deep at #/items/items"):
        Constraint("json_schema", deep)
    with pytest.raises(InputError, match="nested too deep to read"):
        Constraint("json_schema", "[" * 19_000)
    with pytest.raises(InputError, match="does not compile"):
        Constraint("regex", "(" * 5000 + ")" * 5000)


def test_an_exploding_regex_is_stopped_by_the_probes_memory_limit(demo_model, monkeypatch):
    """[ab]*a[ab]{20} is small text but its automaton has 2^21 states: the probe runs out of its memory
    (an allocation that fails aborts the child, never this process); 128 MiB here to keep the test short."""
    monkeypatch.setattr(budget, "PROBE_MEMORY", 128 << 20)
    with pytest.raises(InputError, match=r"counting its automaton's states .* went past its limit of "
                                         r"(128 MiB of memory|5 s of CPU); its costliest part is the repetition "
                                         r"'\[ab\]\*a\[ab\]\{20\}'"):
        automaton(demo_model, Constraint("regex", "[ab]*a[ab]{20}"))


def test_past_the_time_limit_is_refused(demo_model, monkeypatch):
    monkeypatch.setattr(budget, "PROBE_CPU_S", 1)
    slow = Constraint("json_schema", '{"type": "string", "maxLength": 24}')  # outlines-core takes 2^n here
    with pytest.raises(InputError, match="went past its limit of 1 s of CPU; its costliest part is maxLength 24 at #"):
        automaton(demo_model, slow)


def test_what_the_estimate_lets_through_is_still_bounded_in_the_child(demo_model, monkeypatch):
    """With the estimate off, the 2 kB nested schema that once aborted the whole process is refused by
    the child's limits."""
    monkeypatch.setattr(budget, "MAX_STATES", 10**12)
    monkeypatch.setattr(budget, "PROBE_CPU_S", 1)
    with pytest.raises(InputError, match="went past its limit of (1 s of CPU|512 MiB of memory); its costliest "
                                         "part is maxItems 12 at #/anyOf/0"):
        automaton(demo_model, Constraint("json_schema", NESTED))


def test_states_times_vocabulary_over_the_budget_refused(demo_model, monkeypatch):
    monkeypatch.setattr(budget, "MAX_WORK", 257 * 1000)  # the demo's 257 distinct pieces x 1000 states
    with pytest.raises(InputError, match=r"its automaton has 1,00\d states, and with this tokenizer's 257 tokens "
                                         r"that is over the budget of 257,000 state-token pairs"):
        automaton(demo_model, Constraint("regex", "b{1000}"))
    automaton(demo_model, Constraint("regex", "b{900}"))


def test_a_long_schema_regex_refused(monkeypatch):
    monkeypatch.setattr(budget, "MAX_REGEX", 1000)
    text = json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(12)}})
    with pytest.raises(InputError, match=r"its regex is [\d,]+ characters, over 1,000; its costliest part is an "
                                         "object with 12 optional properties at #"):
        Constraint("json_schema", text)


class Spawned:
    """subprocess.Popen, remembering each child it starts."""

    def __init__(self, monkeypatch):
        self.children = []
        real = subprocess.Popen

        def popen(*args, **kwargs):
            self.children.append(real(*args, **kwargs))
            return self.children[-1]

        monkeypatch.setattr(budget.subprocess, "Popen", popen)


def test_cancel_stops_a_compile_and_kills_its_child(demo_model, monkeypatch):
    spawned = Spawned(monkeypatch)
    asked = []

    def cancel():
        asked.append(1)
        return len(asked) > 3

    frames = []
    with pytest.raises(Cancelled):
        generate(demo_model, "What is 3+4?", Knobs(num_inference_steps=4), on_frame=frames.append,
                 should_cancel=cancel, constraint=Constraint("json_schema", '{"type": "object"}'))
    assert not frames and spawned.children  # the schema's regex, then its index: the one cancelled
    assert all(child.returncode is not None for child in spawned.children)  # killed and reaped


def test_a_raising_cancel_check_kills_the_child_too(demo_model, monkeypatch):
    """ComfyUI's interrupt raises its own exception from the cancel check."""
    spawned = Spawned(monkeypatch)

    class Interrupted(Exception):
        pass

    def interrupt():
        raise Interrupted()

    with pytest.raises(Interrupted):
        automaton(demo_model, Constraint("json_schema", '{"type": "array"}'), interrupt)
    assert spawned.children and all(child.returncode is not None for child in spawned.children)


def test_accepted_constraints_compile_as_before(demo_model):
    """The probe and the child change nothing in what compiles: the same states, reached the same way."""
    found = automaton(demo_model, Constraint("regex", "[0-9]{3}-[a-z]{2,4}"))
    assert len(found.index.get_transitions()) == 10
    assert budget.regex_parts("[0-9]{3}-[a-z]{2,4}")[0] < budget.MAX_STATES
