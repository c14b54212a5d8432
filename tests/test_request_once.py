"""One request, checked once, run once: a checked Request holds nothing a run changes, so it runs again
to the same result; a sampler node checks each list item once and runs what it checked."""

from __future__ import annotations

import json

import pytest

from diffusiongemma.dgemma import Constraint, Knobs
from diffusiongemma.dgemma.resume import Advanced
from diffusiongemma.dgemma.run import prepare, run, run_batch
from diffusiongemma.testing.batchcheck import differences, entropy_exact
from diffusiongemma.testing.schemas import SUM

PROMPT = "What is 3+4?"
SCHEMA = Constraint("json_schema", json.dumps(SUM))
REGEX = Constraint("regex", r"[0-9]{3}-[a-z]{2,4}")  # random weights answer it only through the constraint


def same(a, b, dm) -> None:
    assert not differences(a, b, dm.token_strings) and entropy_exact(a, b)
    assert a.state.constraint == b.state.constraint and a.state.paused == b.state.paused


def test_a_constrained_request_runs_twice_to_the_same_result(tiny_model):
    req = prepare(tiny_model, PROMPT, Knobs(seed=0, num_inference_steps=4), constraint=REGEX)
    first, second = run(req), run(req)
    same(first, second, tiny_model)
    assert first.state.constraint["satisfied"] and first.state.constraint["changed_positions"] > 0
    twice = run_batch([req, req])  # the same request twice in one batch: two runs, each its own guide
    for result in twice:
        same(first, result, tiny_model)


@pytest.mark.parametrize("constraint", [None, SCHEMA], ids=["plain", "constrained"])
def test_a_windowed_request_runs_twice_and_each_pause_resumes_the_same(demo_model, constraint):
    knobs = Knobs(seed=0, confidence=0.0)
    req = prepare(demo_model, PROMPT, knobs, advanced=Advanced(end_step=3), constraint=constraint)
    first, second = run(req), run(req)
    assert first.state.paused and first.state.resume.paused is not second.state.resume.paused
    same(first, second, demo_model)
    assert req.plan.end == 3 and not hasattr(req.plan, "paused")  # the plan is what was asked, never written
    ends = [run(prepare(demo_model, PROMPT, knobs, constraint=constraint,
                        advanced=Advanced(start_step=3, resume=r.state.resume))) for r in (first, second)]
    same(*ends, demo_model)
    whole = run(prepare(demo_model, PROMPT, knobs, constraint=constraint, advanced=Advanced()))
    assert ends[0].state.raw_ids == whole.state.raw_ids
