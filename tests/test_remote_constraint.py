"""Constraints through the pack dialect: a remote model of `python -m serve` gives the same tokens, frames,
trace (the constrained positions included) and verdict as a local run, through the very nodes."""

from __future__ import annotations

import json

import fakecomfy  # noqa: F401 - the nodes import ComfyUI's modules
import jsonschema
import numpy as np
import pytest
from executor import call
from remote_server import served

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.nodes import host
from diffusiongemma.testing.schemas import SUM

Denoise, Advanced = NODE_CLASS_MAPPINGS["DGemmaDenoise"], NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
RemoteLoader = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"]
KNOBS = dict(Knobs().asdict(), num_inference_steps=16, gen_length=64)
TRACE = ("blocks", "steps", "ids", "committed_bits", "entropy", "stop_bits", "pinned_bits", "times", "knob_index",
         "constrained_bits")


@pytest.fixture(scope="module")
def remote():
    with served() as (url, _):
        yield call(RemoteLoader, url=url)[0][0]  # the node a workflow uses


def same(local, far) -> None:
    """text, canvas_state (the verdict too), every trace array, frames and run_config equal."""
    assert local[0] == far[0] and local[1] == far[1] and local[3] == far[3] and local[5] == far[5]
    for name in TRACE:
        a, b = getattr(local[2], name), getattr(far[2], name)
        assert (a is None) == (b is None), name
        assert a is None or (a.dtype == b.dtype and np.array_equal(a, b)), name
    assert (local[4] == far[4]).all()


def steps_of(run):
    events = []
    host.listen(lambda name, data: events.append((name, data)))
    try:
        return run(), [d for e, d in events if e == "dgemma.step"]
    finally:
        host._listeners.clear()


@pytest.mark.parametrize("seed", [0, 5])
def test_a_constrained_denoise_through_the_remote_loader_is_the_local_one(demo_model, remote, seed):
    args = dict(KNOBS, seed=seed, prompt="What is 3+4?", constraint_type="json_schema", constraint=json.dumps(SUM))
    (local, _), local_steps = steps_of(lambda: call(Denoise, model=demo_model, **args))
    (far, _), far_steps = steps_of(lambda: call(Denoise, model=remote, **args))
    same(local, far)
    assert local_steps == far_steps
    jsonschema.validate(json.loads(far[0]), SUM)
    assert far[1].constraint["satisfied"] and far[2].constrained is not None and far[5].constraint is not None


def test_a_constrained_advanced_window_and_its_resume_remotely(demo_model, remote):
    base = dict(KNOBS, seed=2, prompt="What is 2+2?", scheduler="entropy_bound", pins="", start_step=0, end_step=4,
                constraint_type="choice", constraint="yes\nno\nfour")
    outs = {}
    for name, model in (("local", demo_model), ("remote", remote)):
        first, _ = call(Advanced, model=model, **base)
        second, _ = call(Advanced, model=model, canvas_state=first[1], **dict(base, start_step=4, end_step=1024))
        outs[name] = first, second
    for local, far in zip(outs["local"], outs["remote"]):
        same(local, far)
    assert outs["remote"][1][0] in ("yes", "no", "four") and outs["remote"][1][1].constraint["satisfied"]


def test_the_servers_constraint_refusals_come_back_naming_the_constraint(remote):
    with pytest.raises(InputError, match="41 tokens with its EOS") as err:
        call(Denoise, model=remote, **dict(KNOBS, gen_length=8, prompt="What is 3+4?", constraint_type="choice",
                                           constraint="a" * 40))
    assert err.value.name == "constraint"
    with pytest.raises(InputError, match="'uniqueItems'"):
        call(Denoise, model=remote, **dict(KNOBS, prompt="What is 3+4?", constraint_type="json_schema",
                                           constraint='{"type": "array", "uniqueItems": true}'))


def test_the_structured_template_through_the_remote_loader_writes_valid_json(remote):
    from conftest import REPO

    from diffusiongemma.runner.execute import run_graph

    graph = json.loads((REPO / "example_workflows" / "api" / "structured.json").read_text())
    local = run_graph(json.loads(json.dumps(graph)))
    loaders = [k for k, node in graph.items() if node["class_type"] == "DGemmaLoader"]
    for key in loaders:
        graph[key] = {"class_type": "DGemmaRemoteLoader", "inputs": {"url": remote.url}}
    far = run_graph(graph)
    texts = [t for ui in far.values() for t in ui.get("text", [])]
    schema = json.loads(next(n["inputs"]["constraint"] for n in graph.values()
                             if n["inputs"].get("constraint_type") == "json_schema"))
    answers = [json.loads(t) for t in texts if t.startswith("{")]
    assert loaders and answers and "seven" in texts
    for answer in answers:
        jsonschema.validate(answer, schema)
    assert texts == [t for ui in local.values() for t in ui.get("text", [])]
