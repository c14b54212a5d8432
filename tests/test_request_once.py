"""One request, checked once, run once: a checked Request holds nothing a run changes, so it runs again
to the same result; a sampler node checks each list item once and runs what it checked."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Constraint, Knobs
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.denoising.run import prepare, run, run_batch
from diffusiongemma.testing.batchcheck import differences, entropy_exact
from diffusiongemma.testing.schemas import SUM

Sampler, Denoise, AdvancedNode, Decide = (NODE_CLASS_MAPPINGS[n] for n in (
    "DGemmaSampler", "DGemmaDenoise", "DGemmaSamplerAdvanced", "DGemmaDecide"))
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


KNOBS = dict(seed=3, num_inference_steps=8, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=32, thinking=False)
PROMPTS = ["What is 2+2?", "What is 3+4?", "What is 1+1?"]


@pytest.fixture
def counts(monkeypatch):
    """Calls, per list run, of each step of an item's check: the request, the constraint's compile, the run's
    guide, the chat template and the image processor."""
    from diffusiongemma.dgemma import backend
    from diffusiongemma.dgemma.constraints import guide
    from diffusiongemma.dgemma.denoising import decide
    from diffusiongemma.dgemma.denoising import run as engine

    seen = Counter()
    for module, name in ((backend.LocalBackend, "check"), (decide, "prepare"), (engine, "guide_for"),
                         (guide.Guide, "__init__"), (engine, "prompt_ids"), (engine, "prepare_images")):
        key = {"__init__": "Guide", "check": "prepare"}.get(name, name)  # a local backend's check is run.prepare
        monkeypatch.setattr(module, name, _counted(seen, key, getattr(module, name)))
    return seen


def _counted(seen: Counter, key: str, real):
    def counting(*args, **kwargs):
        seen[key] += 1
        return real(*args, **kwargs)

    return counting


def test_a_three_item_list_is_checked_once_per_item_and_runs_what_was_checked(demo_model, counts):
    out, _ = call(Sampler, model=demo_model, prompt=PROMPTS, **KNOBS)
    assert counts == {"prepare": 3, "prompt_ids": 3, "guide_for": 3}  # guide_for: each finds no constraint
    counts.clear()
    image = colour_image("red", 32, 32)
    out, _ = call(Denoise, model=demo_model, prompt=PROMPTS, image=image, constraint_type="choice",
                  constraint="four\nseven\ntwo", **KNOBS)
    assert counts == {"prepare": 3, "guide_for": 3, "Guide": 3, "prompt_ids": 3, "prepare_images": 3}
    assert all(state.constraint["satisfied"] for state in out[1])
    counts.clear()
    advanced = dict(KNOBS, scheduler="entropy_bound", start_step=0, end_step=1024, pins="")
    call(AdvancedNode, model=demo_model, prompt=PROMPTS, constraint_type="choice", constraint="four\nseven\ntwo",
         **advanced)
    assert counts == {"prepare": 3, "guide_for": 3, "Guide": 3, "prompt_ids": 3}


def test_a_decision_checks_its_answer_block_once(demo_model, counts):
    knobs = {k: v for k, v in KNOBS.items() if k in Decide.INPUT_TYPES()["required"]}
    call(Decide, model=demo_model, prompt="What colour is this?", options="red\ngreen", samples=2,
         image=colour_image("red", 32, 32), **knobs)
    assert counts == {"prepare": 1, "prompt_ids": 1, "prepare_images": 1, "guide_for": 1}


def test_the_openai_server_prepares_each_choice_once(demo_model, counts, monkeypatch):
    from diffusiongemma.serve import runs
    from diffusiongemma.serve.requests import job_of

    monkeypatch.setattr(runs, "prepare", _counted(counts, "prepare", runs.prepare))
    engine = runs.Engine(demo_model, "demo")
    try:
        body = {"model": "demo", "n": 3, "messages": [{"role": "user", "content": PROMPT}],
                "dgemma": {"knobs": KNOBS, "constraint": {"kind": "choice", "text": "four\nseven\ntwo"}}}
        job = job_of(body, engine.contexts, engine.resumes, "demo")
        results, *_ = engine.run(job, engine.render(job), None, None)
    finally:
        engine.worker.shutdown()
    assert counts == {"prepare": 3, "guide_for": 3, "Guide": 3, "prompt_ids": 3}
    assert [r.text for r in results] == ["seven"] * 3
