"""The shipped demo model, evaluated exhaustively on its task through the engine."""

from __future__ import annotations

import re

import numpy as np
import pytest

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_KNOBS, IMAGE_QUESTION, WORDS, colour_image, image_cases
from diffusiongemma.dgemma.denoising.context import encode_context

PAIRS = [(a, b) for a in range(10) for b in range(10)]


def knobs(**changes) -> Knobs:
    return Knobs(**{**DEMO_KNOBS.asdict(), **changes})


def test_plain_answers(demo_model):
    right = sum(generate(demo_model, f"What is {a}+{b}?", knobs(seed=i)).text == WORDS[a + b]
                for i, (a, b) in enumerate(PAIRS))
    assert right >= 95, f"{right}/100 exact answers"


def test_thinking_answers_with_the_thought_moved_out(demo_model):
    right = 0
    for i, (a, b) in enumerate(PAIRS):
        result = generate(demo_model, f"What is {a}+{b}?", knobs(seed=i, thinking=True))
        thought = result.state.thought or ""
        right += (result.text == WORDS[a + b] and re.fullmatch(rf"\d\+\d={a + b}", thought) is not None
                  and "+" not in result.text)
    assert right >= 95, f"{right}/100 right answers whose thought (stating the sum) is in canvas_state.thought"


def test_answers_from_a_kv_context(demo_model):
    right = 0
    for i, (a, b) in enumerate(PAIRS):
        context = encode_context(demo_model, f"a={a}, b={b}.")
        right += generate(demo_model, "What is a+b?", knobs(seed=i), context=context).text == WORDS[a + b]
    assert right >= 95, f"{right}/100 answers read from the encoded context"


def test_answers_what_colour_a_picture_is(demo_model):
    cases = image_cases()
    right = sum(generate(demo_model, IMAGE_QUESTION, knobs(seed=i), image=colour_image(name, w, h)).text == name
                for i, (name, w, h) in enumerate(cases))
    assert right >= 0.95 * len(cases), f"{right}/{len(cases)} colours named"


def test_the_picture_not_the_question_decides_the_answer(demo_model):
    """The same question gets another answer for another picture."""
    answers = {generate(demo_model, IMAGE_QUESTION, knobs(), image=colour_image(name, 64, 64)).text
               for name in ("red", "blue", "white")}
    assert answers == {"red", "blue", "white"}


def test_same_prompt_and_seed_same_answer_and_trace(demo_model):
    one, two = (generate(demo_model, "What is 6+7?", knobs(seed=42)) for _ in range(2))
    assert one.text == two.text == "thirteen" and one.state == two.state
    assert np.array_equal(one.trace.ids, two.trace.ids) and np.array_equal(one.trace.committed, two.trace.committed)
    assert np.array_equal(one.trace.entropy, two.trace.entropy)


@pytest.mark.parametrize("thinking", [False, True])
def test_the_annealing_is_visible_with_the_demo_knobs(demo_model, thinking):
    """Several steps, starting mostly from noise, the accepted share growing until the block settles."""
    result = generate(demo_model, "What is 3+4?", knobs(thinking=thinking))
    trace = result.trace
    assert result.text == "seven" and result.state.steps_used >= 4
    accepted_per_step = trace.committed.sum(axis=1)
    assert accepted_per_step[0] < 0.5 * demo_model.canvas_length < accepted_per_step[-1]
    assert len(set(accepted_per_step.tolist())) >= 4  # the canvas fills in over several steps
    assert trace.block_stopped_early == (True,) and result.state.converged
