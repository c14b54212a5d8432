"""A sampler's frames and images are made only when the queued prompt reads them, and ComfyUI's cache
never hands back pictures that were not made (decision 0028)."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch
from conftest import REPO
from fakecomfy import CachingExecutor, cache_key, installed

from diffusiongemma.dgemma.readouts.images import Asked, render_images
from diffusiongemma.nodes import ON_DEMAND_CLASSES, host, sampler, wiring
from diffusiongemma.nodes.sampler import DGemmaSampler
from diffusiongemma.runner.execute import CLASSES, call_node

KNOBS = {"seed": 5, "num_inference_steps": 6, "t_min": 0.4, "t_max": 0.8, "entropy_bound": 0.1, "confidence": 0.005,
         "gen_length": 32, "thinking": False}


class Pictures:
    """An output node that keeps the IMAGE batches it was given (one call per list item)."""

    OUTPUT_NODE, RETURN_TYPES, FUNCTION = True, (), "keep"
    seen: list = []

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE", {})}}

    def keep(self, images):
        Pictures.seen.append(images)
        return {"ui": {}}


class DemoModel:
    """The session's demo model as a node's output (DGemmaLoader would hand it to ComfyUI's memory
    management, which outlives a test)."""

    RETURN_TYPES, FUNCTION, model = ("DGEMMA_MODEL",), "give", None

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    def give(self):
        return (DemoModel.model,)


def graph(images: bool) -> dict:
    nodes = {"1": {"class_type": "DemoModel", "inputs": {}},
             "5": {"class_type": "DGemmaPromptList", "inputs": {"prompts": "What is 2+2?\nHi\nName a colour."}},
             "2": {"class_type": "DGemmaSampler", "inputs": {"model": ["1", 0], "prompt": ["5", 0], **KNOBS}},
             "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    if images:
        nodes["4"] = {"class_type": "Pictures", "inputs": {"images": ["2", 4]}}
    return nodes


@pytest.fixture
def renders(monkeypatch):
    """Every picture and frame text the samplers make."""
    made = []
    for name in ("render_images", "frame_texts"):
        real = getattr(sampler, name)
        monkeypatch.setattr(sampler, name, lambda *a, real=real, name=name: made.append(name) or real(*a))
    return made


def test_the_stamp_names_the_on_demand_outputs_that_are_read():
    g = graph(False)
    g["6"] = {"class_type": "PreviewAny", "inputs": {"source": ["2", 2]}}  # canvas_trace: not on demand
    g["7"] = "not a node"
    wiring.stamp(g, ON_DEMAND_CLASSES)
    assert g["2"]["inputs"][wiring.STAMP] == "" and g["7"] == "not a node"
    assert wiring.STAMP not in g["3"]["inputs"] and not wiring.made(g, "2", "images")
    g["4"] = {"class_type": "PreviewAny", "inputs": {"source": ["2", 3]}}
    g["8"] = {"class_type": "SaveImage", "inputs": {"images": ["2", 4], "filename_prefix": "x"}}
    wiring.stamp(g, ON_DEMAND_CLASSES)
    assert g["2"]["inputs"][wiring.STAMP] == "frames,images" and wiring.made([g], "2", "images")
    assert wiring.made({}, "2", "images") and wiring.made(None, "2", "frames")  # no stamp: make everything
    for hostile in (None, [], "x", {"2": None}, {"2": {"inputs": 5}}):
        wiring.stamp(hostile, ON_DEMAND_CLASSES)


def test_a_list_with_pictures_unread_allocates_none(demo_model, renders):
    stamped = graph(False)
    wiring.stamp(stamped, ON_DEMAND_CLASSES)
    inputs = {"model": [demo_model], "prompt": ["What is 2+2?", "Hi"], **{k: [v] for k, v in KNOBS.items()}}
    out, _ = call_node(DGemmaSampler, inputs, {"unique_id": ["2"], "graph": [stamped]})
    assert renders == [] and out[4] == [None, None] and out[3] == [None, None]
    assert [len(t) for t in out[2]] == [s.steps_used for s in out[1]] and out[0][0]
    out, _ = call_node(DGemmaSampler, inputs, {"unique_id": ["2"], "graph": [{}]})  # no stamp: all made
    assert renders.count("render_images") == 2 and out[4][0].shape[0] == len(out[2][0])


def test_an_unmade_output_stops_a_reader_with_the_reason(demo_model, tmp_path, monkeypatch):
    class ExecutionBlocker:
        def __init__(self, message):
            self.message = message

    monkeypatch.setitem(sys.modules, "comfy_execution.graph_utils", types.SimpleNamespace(
        ExecutionBlocker=ExecutionBlocker))
    stamped = graph(False)
    wiring.stamp(stamped, ON_DEMAND_CLASSES)
    inputs = {"model": [demo_model], "prompt": ["Hi"], **{k: [v] for k, v in KNOBS.items()}}
    out, _ = call_node(DGemmaSampler, inputs, {"unique_id": ["2"], "graph": [stamped]})
    assert isinstance(out[4][0], ExecutionBlocker) and out[4][0].message.startswith("images not made")


def test_wiring_the_pictures_on_a_second_run_gives_the_right_pictures(demo_model, tmp_path, renders):
    Pictures.seen, DemoModel.model = [], demo_model
    classes = {**CLASSES, "Pictures": Pictures, "DemoModel": DemoModel}
    with installed(tmp_path) as rec:
        assert host.on_prompt(wiring.on_prompt(ON_DEMAND_CLASSES))
        comfy = CachingExecutor(rec, classes)
        first = comfy.queue(graph(False))
        assert "2" in comfy.ran[-1] and "render_images" not in renders
        second = comfy.queue(graph(True))  # the same inputs, images now read
        assert "2" in comfy.ran[-1] and "1" not in comfy.ran[-1]  # the sampler ran again, the loader did not
        comfy.queue(graph(True))
        assert comfy.ran[-1] == []  # and then is cached, pictures and all
    traces, configs = second["2"][2], second["2"][5]
    assert [t.ids.tolist() for t in traces] == [t.ids.tolist() for t in first["2"][2]]  # the same tokens
    assert len(Pictures.seen) == 3
    for shown, trace, config in zip(Pictures.seen, traces, configs):
        right = render_images(trace, demo_model.token_strings, Asked.of(config.prompt, config.image))
        assert shown.shape[0] == len(trace) > 0 and torch.equal(shown, right)
    # what the stamp prevents: without it the second prompt's sampler has the first one's key
    assert cache_key(graph(False), "2", classes) == cache_key(graph(True), "2", classes)


def _peak_rss(count: int) -> float:
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "list_memory.py"), str(count), "--steps", "1",
                           "--gen-length", "32"], capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    line = done.stdout.strip().splitlines()[-1]
    return float(line.split()[0].split("=")[1])


def test_ten_thousand_prompts_take_the_memory_of_a_thousand():
    """Headless, pictures unread, one step each on the demo: the list streams through one batch, so nine
    thousand more items add only what the node returns for them (about 4 KB of results each, measured 9 KB
    of peak memory with the allocator's slack) and never an item's cache (about 45 KB here) or a picture
    (one frame: 700 KB). Slow: about 11,000 prefills and steps."""
    small, large = _peak_rss(1000), _peak_rss(10_000)
    assert (large - small) * 2**30 / 9000 < 16 * 1024, (small, large)
