"""Advanced runs: chained windows equal one run, pins hold, each scheduler matches the pipeline, refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.resume import Advanced, check_advanced
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.images import render_frames
from diffusiongemma.dgemma.readouts.runlog import records, replay
from diffusiongemma.dgemma.readouts.states import PINNED
from diffusiongemma.dgemma.steps.schedulers import Scheduling
from diffusiongemma.dgemma.versions import _release

PROMPT = "What is 3+4?"


def chained(dm, knobs, ks, context=None, scheduling=Scheduling(), **kw):
    """One run over [0, N) split at each of `ks`: the last window's result."""
    edges = [0, *ks, knobs.num_inference_steps]
    resume = None
    for start, end in zip(edges, edges[1:]):
        adv = Advanced(scheduling, start, end, resume=resume, **kw)
        if resume is not None and resume.paused is not None:
            adv = dataclasses.replace(adv, start_step=resume.paused.step)
        result = generate(dm, PROMPT, knobs, context=context, advanced=adv)
        resume = result.state.resume
    return result


def same_run(a, b):
    assert a.state.raw_ids == b.state.raw_ids and a.text == b.text
    assert len(a.trace) == len(b.trace)
    for name in ("blocks", "steps", "ids", "committed_bits", "entropy", "stop_bits", "times"):
        assert np.array_equal(getattr(a.trace, name), getattr(b.trace, name)), name
    assert a.trace.block_stopped_early == b.trace.block_stopped_early


@pytest.mark.parametrize("gen_length, ks", [(32, [1]), (32, [3]), (32, [2, 5]), (600, [2]), (600, [4])])
def test_chained_windows_equal_one_run(tiny_model, gen_length, ks):
    knobs = Knobs(seed=7, num_inference_steps=8, gen_length=gen_length, confidence=0.0)
    whole = generate(tiny_model, PROMPT, knobs, advanced=Advanced())
    same_run(chained(tiny_model, knobs, ks), whole)
    # the plain Sampler path is the same run too
    same_run(generate(tiny_model, PROMPT, knobs), whole)


@pytest.mark.parametrize("k", [1, 3])
def test_chained_windows_with_kv_context_and_adaptive_stop(demo_model, k):
    ctx = encode_context(demo_model, "a=3, b=4.")
    knobs = Knobs(seed=2, num_inference_steps=12, gen_length=64)
    whole = generate(demo_model, "What is a+b?", knobs, context=ctx)
    edges = [0, k, 12]
    resume = None
    for start, end in zip(edges, edges[1:]):
        start = resume.paused.step if resume is not None and resume.paused else start
        result = generate(demo_model, "What is a+b?", knobs, context=ctx,
                          advanced=Advanced(start_step=start, end_step=end, resume=resume))
        resume = result.state.resume
    same_run(result, whole)
    assert result.text == "seven"


def test_paused_state_is_resumable_twice_and_never_written(tiny_model):
    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=32, confidence=0.0)
    first = generate(tiny_model, PROMPT, knobs, advanced=Advanced(end_step=2))
    assert first.state.paused and len(first.trace) == 2
    assert "resume" not in first.state.asdict()
    assert first.state.resume.nbytes > 0
    a = generate(tiny_model, PROMPT, knobs, advanced=Advanced(start_step=2, resume=first.state.resume))
    b = generate(tiny_model, PROMPT, knobs, advanced=Advanced(start_step=2, resume=first.state.resume))
    same_run(a, b)  # the first state was not consumed or changed


def test_knobs_may_change_between_windows_and_are_recorded(tiny_model):
    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=32, confidence=0.0)
    first = generate(tiny_model, PROMPT, knobs, advanced=Advanced(end_step=3))
    hotter = dataclasses.replace(knobs, entropy_bound=0.5)
    second = generate(tiny_model, PROMPT, hotter, advanced=Advanced(start_step=3, resume=first.state.resume))
    assert [s["entropy_bound"] for s in second.trace.knob_sets] == [0.1, 0.5]
    assert second.trace.knob_index.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("pins", ["1: thought\\n3+4=7", "___{1}thought\n3+4=7___", "___{1}thought\n3+4=8___"])
def test_demo_answers_inside_pinned_text(demo_model, pins):
    knobs = Knobs(seed=0, gen_length=32, thinking=True)
    result = generate(demo_model, "What is 3+4?", knobs, advanced=Advanced(pins=pins))
    assert result.text == "seven"  # even around a wrong pinned thought: the answer comes from the prompt
    pinned = result.trace.pinned
    ids = result.trace.ids
    held = np.flatnonzero(pinned[0])
    assert held.tolist() == list(range(1, 14))
    assert (ids[:, held] == ids[0, held]).all()  # pinned positions never change
    assert (result.trace.states()[:, held] == PINNED).all()
    frames = frame_texts(result.trace, demo_model.token_strings)
    rows = records(result.trace, result.config, result.state, frames)
    assert rows[1]["pinned"] == held.tolist()
    again = replay(rows[0], rows[1:-1])
    assert np.array_equal(again.states(), result.trace.states())
    assert np.array_equal(render_frames(again, again.token_strings), render_frames(result.trace,
                                                                                    demo_model.token_strings))


def test_template_pins_and_blanks(tiny_model):
    knobs = Knobs(seed=3, num_inference_steps=4, gen_length=32, confidence=0.0)
    result = generate(tiny_model, PROMPT, knobs, advanced=Advanced(pins="ab___{2}cd\n20: xyz"))
    pinned = np.flatnonzero(result.trace.pinned[0])
    assert pinned.tolist() == [0, 1, 4, 5, 20, 21, 22]
    assert all(result.state.raw_ids[p] == result.trace.ids[0, p] for p in pinned)


@pytest.mark.parametrize("field, value, name", [
    ("start_step", 5, "start_step"), ("end_step", 0, "end_step"), ("start_step", -2, "start_step"),
    ("pins", "no blank here", "pins"), ("pins", "999: far", "pins"), ("pins", "0: ab\n1: c", "pins"),
])
def test_bad_window_and_pins_refused_before_work(tiny_model, field, value, name):
    knobs = Knobs(num_inference_steps=4, gen_length=32)
    adv = Advanced(**{field: value}) if field != "start_step" or value != 5 else Advanced(start_step=5, end_step=6)
    with pytest.raises(InputError) as err:
        check_advanced(tiny_model, PROMPT, knobs, None, adv)
    assert err.value.name == name


@pytest.mark.parametrize("values, name", [
    ({"name": "ddpm"}, "scheduler"), ({"threshold": 1.5}, "threshold"), ({"temperature": -1.0}, "temperature"),
    ({"corrector_steps": 99}, "corrector_steps"), ({"corrector_k": 0}, "corrector_k"),
])
def test_bad_scheduler_knobs_refused(values, name):
    with pytest.raises(InputError) as err:
        Scheduling(**values)
    assert err.value.name == name


def test_resume_refuses_a_different_run(tiny_model):
    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=32)
    state = generate(tiny_model, PROMPT, knobs, advanced=Advanced(end_step=2)).state.resume
    cases = [("What?", knobs, Advanced(start_step=2, resume=state), "prompt"),
             (PROMPT, dataclasses.replace(knobs, gen_length=64), Advanced(start_step=2, resume=state), "gen_length"),
             (PROMPT, knobs, Advanced(start_step=3, resume=state), "start_step"),
             (PROMPT, knobs, Advanced(Scheduling("discrete_ddim"), 2, resume=state), "scheduler")]
    for prompt, k, adv, name in cases:
        with pytest.raises(InputError) as err:
            check_advanced(tiny_model, prompt, k, None, adv)
        assert err.value.name == name


def pipeline_run(dm, knobs, scheduler, temperature):
    from diffusers import DiffusionGemmaPipeline

    canvases = []

    def on_step(pipe, global_step, step, kwargs):
        canvases.append(kwargs["canvas"][0].cpu().numpy())
        return {}

    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    out = pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
               temperature=temperature, confidence_threshold=knobs.confidence or None,
               generator=torch.Generator().manual_seed(knobs.seed), output_type="seq", callback_on_step_end=on_step)
    return out.sequences[0].tolist(), canvases


@pytest.mark.pipeline
@pytest.mark.skipif(_release("transformers")[:2] >= (5, 24),
                    reason="diffusers' pipeline passes past_key_values, renamed in transformers 5.24")
@pytest.mark.parametrize("scheduling, gen_length", [
    (Scheduling("block_refinement", temperature=0.7, threshold=0.5), 600),
    (Scheduling("block_refinement", temperature=0.0, editing_threshold=0.3), 32),
    (Scheduling("discrete_ddim", temperature=1.0), 600),
    (Scheduling("discrete_ddim", temperature=0.8, corrector_steps=1, corrector_k=3), 32),
    (Scheduling("entropy_bound"), 96),
])
def test_each_scheduler_matches_the_pipeline(tiny_model, scheduling, gen_length):
    import diffusers

    knobs = Knobs(seed=4, num_inference_steps=6, gen_length=gen_length, confidence=0.0)
    dm = dataclasses.replace(tiny_model, eos_ids=(tiny_model.tokenizer.eos_token_id,))
    ours = generate(dm, PROMPT, knobs, advanced=Advanced(scheduling))
    built = scheduling.build(knobs, dm.canvas_length, "cpu").impl
    assert type(built) is getattr(diffusers, scheduling.diffusers_name)
    scheduler = type(built).from_config(built.config)  # the config the engine built is the one truth
    sequence, canvases = pipeline_run(tiny_model, knobs, scheduler, dict(scheduling.settings).get("temperature", 0.0))
    assert list(ours.state.raw_ids) == sequence
    assert np.array_equal(ours.trace.ids, np.array(canvases))
    assert ours.trace.scheduler_name == scheduling.diffusers_name
    assert ours.state.blocks == len(sequence) // dm.canvas_length


def test_node_chain_equals_one_node_and_the_view_resumes(tiny_model):
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.nodes import host

    cls = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
    base = dict(model=tiny_model, prompt=PROMPT, seed=5, num_inference_steps=6, t_min=0.4, t_max=0.8,
                entropy_bound=0.1, confidence=0.0, gen_length=32, thinking=False, scheduler="entropy_bound",
                pins="", start_step=0, end_step=1024)
    whole, _ = call(cls, **base)
    first, _ = call(cls, **{**base, "end_step": 4})
    events = []
    host.listen(lambda name, data: events.append((name, data)))
    try:
        second, _ = call(cls, **{**base, "start_step": 4, "canvas_state": first[1]})
    finally:
        host._listeners.clear()
    assert first[1].paused and not second[1].paused
    assert second[0] == whole[0] and second[3] == whole[3]  # text and every frame's text
    assert second[4].shape == whole[4].shape
    start = events[0][1]
    assert events[0][0] == "dgemma.start" and start["resumed"]["step"]["step"] == 3
    assert start["resumed"]["step"]["tokens"] == events[0][1]["resumed"]["step"]["tokens"]
    steps = [d for n, d in events if n == "dgemma.step"]
    assert [d["step"] for d in steps] == [4, 5]
    plain, _ = call(NODE_CLASS_MAPPINGS["DGemmaSampler"], **{k: v for k, v in base.items()
                                                            if k not in ("scheduler", "pins", "start_step",
                                                                         "end_step")})
    with pytest.raises(InputError, match="keep no resume data") as info:
        call(cls, **{**base, "start_step": 4, "canvas_state": plain[1]})
    assert "from the same sampler node" not in str(info.value)  # the run-log writer's fix, not this node's
    with pytest.raises(InputError, match="give this sampler the same prompt as the Advanced sampler") as info:
        call(cls, **{**base, "prompt": "Another turn.", "start_step": 4, "canvas_state": first[1]})
    assert "DGemmaEncode" not in str(info.value)  # the plain-prompt hint does not apply to resuming


@pytest.mark.parametrize("k", [1, 4])
def test_chained_windows_over_several_blocks_on_a_kv_context(tiny_model, k):
    dm = dataclasses.replace(tiny_model, eos_ids=())  # random weights: never stop on a stray EOS
    ctx = encode_context(dm, "Some context to condition on.")
    knobs = Knobs(seed=11, num_inference_steps=6, gen_length=600, confidence=0.005)
    whole = generate(dm, PROMPT, knobs, context=ctx)
    assert whole.state.blocks == 3
    same_run(chained(dm, knobs, [k], context=ctx), whole)


def test_start_step_auto_continues_where_the_wired_state_paused(tiny_model):
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.dgemma.denoising.resume import AUTO, WINDOW_KNOBS

    cls = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
    assert cls.INPUT_TYPES()["required"]["start_step"][1]["default"] == AUTO == WINDOW_KNOBS["start_step"].lo
    base = dict(model=tiny_model, prompt=PROMPT, seed=5, num_inference_steps=6, t_min=0.4, t_max=0.8,
                entropy_bound=0.1, confidence=0.0, gen_length=32, thinking=False, scheduler="entropy_bound",
                pins="", start_step=AUTO, end_step=1024)
    whole, _ = call(cls, **base)
    first, _ = call(cls, **{**base, "end_step": 4})       # auto on a fresh canvas: step 0
    second, _ = call(cls, **{**base, "canvas_state": first[1]})  # auto on a paused one: step 4
    assert first[5].advanced["start_step"] == 0 and second[5].advanced["start_step"] == 4
    assert second[0] == whole[0] and second[3] == whole[3]
