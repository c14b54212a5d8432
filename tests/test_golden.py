"""Nothing moves: every run below gives the tokens, frames, trace, readout and run log recorded in
tests/golden/runs.json (digests, plus the ids and text in full so a difference reads plainly).

Exact facts (ids, masks, text, frames, pictures, events, t and T) are compared exactly. Entropy is
float arithmetic whose last bits depend on the CPU's kernels (the same code gives other float16
values on another x86-64 or an Arm CPU), so it is kept in full and compared within ENTROPY_ATOL.

Re-record only for a change that is meant to move tokens, and say why in its commit:
DGEMMA_GOLDEN_RECORD=1 python -m pytest -q tests/test_golden.py
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.images import Asked, render_frames
from diffusiongemma.dgemma.readouts.runlog import records
from diffusiongemma.dgemma.steps.schedulers import Scheduling
from diffusiongemma.nodes.events import StepStream

GOLDEN = Path(__file__).parent / "golden" / "runs.json"
RECORD = os.environ.get("DGEMMA_GOLDEN_RECORD") == "1"
VOLATILE = ("run_id", "timestamp_utc", "pack_version", "model_source")  # differ per run or per machine
# Nats: a few float16 steps at the largest entropies here (about 6 nats, where a step is 0.004); a change
# of the arithmetic (another distribution, another temperature) moves entropies by far more.
ENTROPY_ATOL = 0.01

EB, BR, DD = (Scheduling(), Scheduling("block_refinement", temperature=0.5, threshold=0.6, editing_threshold=0.3),
              Scheduling("discrete_ddim", temperature=0.7, corrector_steps=1, corrector_k=3))
SCHEDULINGS = {"entropy_bound": EB, "block_refinement": BR, "discrete_ddim": DD}
TINY = Knobs(seed=5, num_inference_steps=6, gen_length=300, confidence=0.0)  # two blocks of 256
DEMO = Knobs(seed=7, num_inference_steps=12, gen_length=64)                  # two blocks of 32, adaptive stop


def digest(value) -> str:
    if isinstance(value, np.ndarray):
        value = {"dtype": str(value.dtype), "shape": value.shape, "bytes": value.tobytes().hex()}
    text = json.dumps(value, sort_keys=True, default=lambda v: v.tolist() if hasattr(v, "tolist") else str(v))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def packed(entropy: np.ndarray) -> str:
    return base64.b64encode(zlib.compress(np.ascontiguousarray(entropy, "<f2").tobytes(), 9)).decode()


def unpacked(text: str) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), "<f2").astype(np.float32)


def _exact(record):
    """A run log record without its entropy summary (compared through the entropy itself)."""
    return {k: v for k, v in record.items() if k != "entropy_summary"}


def _scrub(record):
    """The record without what differs per run or per machine, at any depth (a KV cache's provenance
    names the model's folder too)."""
    if isinstance(record, dict):
        return {k: _scrub(v) for k, v in record.items() if k not in VOLATILE}
    if isinstance(record, list):
        return [_scrub(v) for v in record]
    return record


def facts(dm, result, live: list, stream_events: list) -> dict:
    """Everything a run shows, as digests beside the ids and text in full."""
    trace, state = result.trace, result.state
    texts = frame_texts(trace, dm.token_strings)
    arrays = ("blocks", "steps", "ids", "committed_bits", "stop_bits", "pinned_bits", "times", "knob_index")
    out = {"raw_ids": list(state.raw_ids), "text": state.text,
           "canvas_state": _scrub(state.asdict()), "frames": digest(texts),
           "images": digest(render_frames(trace, dm.token_strings,
                                          asked=Asked.of(result.config.prompt, result.config.image))),
           "trace": {name: digest(getattr(trace, name)) for name in arrays},
           "trace_meta": {"scheduler_name": trace.scheduler_name, "scheduler_config": trace.scheduler_config,
                          "block_stopped_early": list(trace.block_stopped_early),
                          "knob_sets": list(trace.knob_sets), "context": _scrub(trace.context)},
           "entropy": packed(trace.entropy),
           "runlog": digest([_exact(_scrub(r)) for r in records(trace, result.config, state, texts)]),
           "live": digest([(f.block, f.step, f.t, f.temperature, f.ids, f.committed, f.stop, f.pinned) for f in live]),
           "live_entropy": packed(np.stack([f.entropy for f in live])),
           "events": digest(stream_events)}
    if result.context is not None:
        out["new_context"] = {k: v for k, v in result.context.summary().items() if k not in VOLATILE}
    return out


def run(dm, prompt, knobs, windows=None, scheduling=EB, pins="", pause=None, **kw):
    """One run (plain when `windows` is None), or an advanced run split into chained windows."""
    live, events = [], []
    stream = StepStream("n", 2, knobs.num_inference_steps, dm.canvas_length, dm.token_strings)

    def on_frame(frame):
        live.append(frame)
        events.append(stream.step(frame))

    if windows is None:
        return facts(dm, generate(dm, prompt, knobs, on_frame=on_frame, **kw), live, events)
    resume, edges = None, [0, *windows, pause or knobs.num_inference_steps]
    for start, end in zip(edges, edges[1:]):
        start = resume.paused.step if resume is not None and resume.paused is not None else start
        if resume is not None:
            events.append(stream.start(resume.recorded))
        adv = Advanced(scheduling, start, end, pins, resume)
        result = generate(dm, prompt, knobs, advanced=adv, on_frame=on_frame, **kw)
        resume = result.state.resume
    return facts(dm, result, live, events)


def _cases():
    cases = {f"tiny-{name}": ("tiny", dict(windows=[], scheduling=s)) for name, s in SCHEDULINGS.items()}
    cases.update({f"demo-{name}": ("demo", dict(windows=[], scheduling=s)) for name, s in SCHEDULINGS.items()})
    cases.update({
        "tiny-plain": ("tiny", {}),
        "demo-plain": ("demo", {}),
        "demo-thinking": ("demo", dict(knobs=dataclasses.replace(DEMO, thinking=True))),
        "tiny-chained-entropy_bound": ("tiny", dict(windows=[2, 4])),
        "tiny-chained-block_refinement": ("tiny", dict(windows=[3], scheduling=BR)),
        "tiny-chained-discrete_ddim": ("tiny", dict(windows=[1], scheduling=DD)),
        "demo-chained-knobs": ("demo", dict(windows=[3], knobs_after=dict(entropy_bound=0.3))),
        "demo-pins": ("demo", dict(windows=[], pins="___{1}thought\n3+4=7___",
                                   knobs=dataclasses.replace(DEMO, thinking=True, gen_length=32))),
        "tiny-pins-chained": ("tiny", dict(windows=[2], pins="ab___{2}cd\n20: xyz")),
        "tiny-image": ("tiny", dict(image="red")),
        "tiny-paused-discrete_ddim": ("tiny", dict(windows=[1], pause=2, scheduling=DD)),
        "demo-paused": ("demo", dict(windows=[], pause=3)),
        "tiny-image-advanced": ("tiny", dict(windows=[2], image="blue", scheduling=BR)),
        "demo-context": ("demo", dict(context="a=3, b=4.", prompt="What is a+b?", advance_context=True)),
        "demo-context-chained": ("demo", dict(windows=[4], context="a=3, b=4.", prompt="What is a+b?")),
        "demo-context-injection": ("demo", dict(context="What is 2+5?", prompt="", advance_context=True)),
    })
    return cases


CASES = _cases()


def _run_case(request, name):
    model, spec = CASES[name]
    dm = request.getfixturevalue("tiny_model" if model == "tiny" else "demo_model")
    spec = dict(spec)
    knobs = spec.pop("knobs", TINY if model == "tiny" else DEMO)
    prompt = spec.pop("prompt", "What is 3+4?")
    if "image" in spec:
        spec["image"] = colour_image(spec["image"], 64, 64)
    if "context" in spec:
        spec["context"] = encode_context(dm, spec["context"])
    after = spec.pop("knobs_after", None)
    if after is not None:  # a second window with other knobs: run the two windows by hand
        return _two_knob_windows(dm, prompt, knobs, dataclasses.replace(knobs, **after), spec["windows"][0])
    return run(dm, prompt, knobs, **spec)


def _two_knob_windows(dm, prompt, first_knobs, second_knobs, k):
    live = []
    first = generate(dm, prompt, first_knobs, advanced=Advanced(end_step=k), on_frame=live.append)
    resume = first.state.resume
    start = resume.paused.step if resume.paused is not None else k
    result = generate(dm, prompt, second_knobs, advanced=Advanced(start_step=start, resume=resume),
                      on_frame=live.append)
    return facts(dm, result, live, [])


@pytest.fixture(scope="module")
def golden():
    if RECORD:  # a partial record (-k) keeps the other cases
        recorded = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        yield recorded
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(recorded.items())), indent=1, sort_keys=True) + "\n")
        return
    yield json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_run_matches_its_golden(request, golden, name):
    got = json.loads(json.dumps(_run_case(request, name), default=str))
    if RECORD:
        golden[name] = got
        return
    want = golden[name]
    for key in want:
        if key in ("entropy", "live_entropy"):
            a, b = unpacked(got[key]), unpacked(want[key])
            assert a.shape == b.shape and np.allclose(a, b, rtol=0, atol=ENTROPY_ATOL), \
                f"{name}: {key} moved by up to {np.abs(a - b).max() if a.shape == b.shape else 'a shape'} nats"
            continue
        assert got.get(key) == want[key], f"{name}: {key} moved"
    assert set(got) == set(want), f"{name}: facts {sorted(set(got) ^ set(want))} appeared or vanished"


def test_the_goldens_cover_what_the_runs_should_show():
    """The recorded runs differ where they should: a golden of identical runs proves nothing."""
    want = json.loads(GOLDEN.read_text())
    assert set(want) == set(CASES)
    ids = lambda name: want[name]["trace"]["ids"]
    for model in ("tiny", "demo"):
        assert ids(f"{model}-plain") == ids(f"{model}-entropy_bound")  # a plain run is a default Advanced run
        assert len({ids(f"{model}-{s}") for s in SCHEDULINGS}) == 3
    assert ids("demo-context") == ids("demo-context-chained")  # chained windows are one run
    assert want["demo-plain"]["text"] == "seven" and want["demo-context"]["text"] == "seven"
    assert want["tiny-image"]["raw_ids"] != want["tiny-plain"]["raw_ids"]
    assert want["demo-paused"]["canvas_state"]["paused"] and want["tiny-paused-discrete_ddim"]["canvas_state"]["paused"]
    assert want["tiny-chained-entropy_bound"]["events"] != want["tiny-entropy_bound"]["events"]  # resumed starts
