"""Errors stay short: ComfyUI's error report and every refusal through the nodes quote a line, not a printout.

ComfyUI's report of a failing node holds str() of each of its inputs (execution.format_value), so a
payload's str() is part of every error a user reads.
"""

from __future__ import annotations

import json

import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.errors import MAX_MESSAGE, InputError

KNOBS = Knobs(num_inference_steps=4).asdict()
LIMIT = 500


def format_value(x):
    """ComfyUI 0.8's execution.format_value: how each input of a failing node enters its error report."""
    return x if x is None or isinstance(x, (int, float, bool, str)) else str(x)


def test_every_payload_a_node_passes_reads_as_a_line(demo_model):
    paused = generate(demo_model, "What is 3+4?", Knobs(num_inference_steps=8), advanced=Advanced(end_step=2))
    context = encode_context(demo_model, "Numbers are words. " * 400)
    payloads = [demo_model, context, paused.state, paused.trace, paused.config, paused.state.resume]
    for payload in payloads:
        assert len(format_value(payload)) < LIMIT, (type(payload).__name__, format_value(payload)[:200])
    assert repr(demo_model).startswith("DGemmaModel(") and "tokens" in repr(context)


def sampler(demo_model, **change):
    return {"model": demo_model, "prompt": "What is 3+4?", **KNOBS, **change}


def advanced(demo_model, **change):
    return sampler(demo_model, **{"scheduler": "entropy_bound", "start_step": 0, "end_step": 4, "pins": "", **change})


HUGE = "x" * 100_000


@pytest.mark.parametrize("node, inputs", [
    ("DGemmaSampler", lambda dm: sampler(dm, t_min=dm)),
    ("DGemmaSampler", lambda dm: sampler(dm, seed=HUGE)),
    ("DGemmaSampler", lambda dm: sampler(dm, gen_length=torch.zeros(100, 100))),
    ("DGemmaSampler", lambda dm: sampler(dm, max_batch=[dm])),
    ("DGemmaSampler", lambda dm: sampler(dm, prompt=[dm])),
    ("DGemmaDenoise", lambda dm: sampler(dm, kv_cache=dm)),
    ("DGemmaDenoise", lambda dm: sampler(dm, constraint_type=HUGE, constraint="x")),
    ("DGemmaDenoise", lambda dm: sampler(dm, constraint=json.dumps({"type": "object", HUGE[:19_000]: 1}))),
    ("DGemmaDenoise", lambda dm: sampler(dm, constraint=json.dumps(
        {"type": "object", "properties": {HUGE[:9000]: {"type": "number", "multipleOf": 2}}}))),
    ("DGemmaDenoise", lambda dm: sampler(dm, constraint=json.dumps({"type": "integer", "minimum": list(range(3000)),
                                                                    "maximum": 3}))),
    ("DGemmaSamplerAdvanced", lambda dm: advanced(dm, pins=HUGE[:19_000])),
    ("DGemmaSamplerAdvanced", lambda dm: advanced(dm, canvas_state=dm)),
    ("DGemmaSamplerAdvanced", lambda dm: advanced(dm, scheduler=HUGE)),
    ("DGemmaSamplerAdvanced", lambda dm: advanced(dm, temperature=dm)),
    ("DGemmaEncode", lambda dm: {"model": dm, "text": "a", "kv_cache": dm}),
])
def test_refusals_through_the_nodes_stay_short(demo_model, node, inputs):
    with pytest.raises((InputError, ValueError)) as err:
        call(NODES[node], **inputs(demo_model))
    assert len(str(err.value)) < LIMIT, str(err.value)[:600]


def test_no_refusal_is_longer_than_its_limit():
    assert len(str(InputError("x", "y" * 100_000))) <= MAX_MESSAGE
