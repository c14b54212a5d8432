"""Refusals at the edges: images, pins, resumes, reloads and caches that went stale, headless graphs.

Each case is refused before model work with a message naming the input, the value and the fix,
or (where the input is fine) read the way the user meant it.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.demo import DEMO_KNOBS, IMAGE_QUESTION, colour_image
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.pins import parse as parse_pins
from diffusiongemma.dgemma.inputs.tokens import literal_ids
from diffusiongemma.dgemma.inputs.vision import prepare_images
from diffusiongemma.nodes import memory
from diffusiongemma.runner import cli
from diffusiongemma.runner.core_nodes import CORE_NODES

KNOBS = Knobs().asdict()
FAST = Knobs(seed=1, num_inference_steps=8, gen_length=32, confidence=0.0)  # never stops early


def refused(words, call_it):
    with pytest.raises(ValueError) as err:
        call_it()
    for word in words:
        assert word in str(err.value), f"{word!r} missing from: {err.value}"
    return err.value


# ---------------------------------------------------------------- images

@pytest.mark.parametrize("height, width", [(1, 64), (3, 64), (3, 3000)])
def test_thin_images_are_read_channels_last_and_refused_below_the_minimum(demo_model, height, width):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "channel dimension is ambiguous" is a warning
        with pytest.raises(InputError) as caught:
            prepare_images(demo_model, colour_image("red", width, height))
    assert f"({width}x{height} pixels) is below the image processor's minimum" in str(caught.value)


@pytest.mark.parametrize("height, width", [(1, 1), (2, 2)])
def test_tiny_images_are_read_channels_last(demo_model, height, width):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "channel dimension is ambiguous" is a warning
        thin = prepare_images(demo_model, colour_image("red", width, height)).pixel_values
    square = prepare_images(demo_model, colour_image("red", 64, 64)).pixel_values
    assert set(thin.unique().tolist()) == set(square.unique().tolist())  # the same three channel values


def test_a_one_pixel_red_picture_is_red(demo_model):
    knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": 0})
    assert generate(demo_model, IMAGE_QUESTION, knobs, image=colour_image("red", 1, 1)).text == "red"


IMAGE_CASES = [
    ("0..255 floats", torch.full((1, 8, 8, 3), 128.0), ["image", "255", "divide"]),
    ("negative values", torch.full((1, 8, 8, 3), -0.5), ["image", "-0.5", "0..1"]),
    ("meta tensor", torch.zeros((1, 8, 8, 3), device="meta"), ["image", "meta", "real tensor"]),
]


@pytest.mark.parametrize("row", IMAGE_CASES, ids=lambda r: r[0])
def test_bad_image_values_are_refused(demo_model, no_model_work, row):
    _, image, words = row
    refused(words, lambda: generate(demo_model, IMAGE_QUESTION, FAST, image=image))
    refused(words, lambda: call(NODES["DGemmaSampler"], model=demo_model, prompt="hi", image=image, **KNOBS))
    refused(words, lambda: encode_context(demo_model, "", image=image))


def test_values_a_rounding_step_outside_0_to_1_are_taken(demo_model):
    image = colour_image("red", 8, 8) * (1 + 1e-6) - 1e-7
    assert prepare_images(demo_model, image).record == prepare_images(demo_model, colour_image("red", 8, 8)).record


# ---------------------------------------------------------------- resuming with images

def _paused(dm, image):
    first = generate(dm, IMAGE_QUESTION, FAST, image=image, advanced=Advanced(end_step=3))
    assert first.state.paused
    return first


@pytest.mark.parametrize("first, then, words", [
    ("red", "blue", ["image", "differs", "same image"]),
    ("red", None, ["image", "unwired", "same image"]),
    (None, "red", ["image", "no image", "unwire"]),
])
def test_a_resume_with_another_image_is_refused(demo_model, no_model_work, monkeypatch, first, then, words):
    monkeypatch.undo()  # the first window runs
    state = _paused(demo_model, colour_image(first, 8, 8) if first else None).state
    image = colour_image(then, 8, 8) if then else None
    advanced = Advanced(start_step=3, resume=state.resume)
    refused(words, lambda: generate(demo_model, IMAGE_QUESTION, FAST, image=image, advanced=advanced))


def test_a_resume_with_the_same_image_carries_its_record(demo_model):
    red = colour_image("red", 8, 8)
    first = _paused(demo_model, red)
    second = generate(demo_model, IMAGE_QUESTION, FAST, image=red.clone(),
                      advanced=Advanced(start_step=3, resume=first.state.resume))
    whole = generate(demo_model, IMAGE_QUESTION, FAST, image=red, advanced=Advanced())
    assert second.config.image == first.config.image == whole.config.image is not None
    assert second.state.raw_ids == whole.state.raw_ids


# ---------------------------------------------------------------- pins

def test_a_nul_in_pin_text_stays_a_nul(tiny_model):
    pins = parse_pins(tiny_model, "0: a\0b", 256)
    assert pins.ids.tolist() == literal_ids(tiny_model.tokenizer, "a\0b")
    escaped = parse_pins(tiny_model, "0: a\\\\nb\\nc", 256)  # \\n is a backslash and n; \n a newline
    assert escaped.ids.tolist() == literal_ids(tiny_model.tokenizer, "a\\nb\nc")


def test_a_lone_surrogate_in_pins_is_named(demo_model, no_model_work):
    inputs = {"model": demo_model, "prompt": "hi", "scheduler": "entropy_bound", "start_step": 0, "end_step": 1024,
              **KNOBS}
    refused(["pins", "\\ud800", "remove"], lambda: call(NODES["DGemmaSamplerAdvanced"], pins="0: a\ud800", **inputs))


@pytest.mark.parametrize("pins, says", [
    ("100000000000000000000: a", "gives position '100000000000000000000', past any answer"),
    ("9" * 5000 + ": a", "past any answer"),
    ("The ___{100000000000000000000} end", "gives blank width '100000000000000000000', past any answer"),
    (["0: a", "5: b"], "pins must be one text, got a list of 2 item(s)"),
    (("0: a",), "pins must be one text, got a tuple of 1 item(s)"),
])
def test_pins_past_any_answer_or_not_one_text_are_named(demo_model, no_model_work, pins, says):
    refused(["pins", says], lambda: generate(demo_model, "hi", Knobs(), advanced=Advanced(pins=pins)))
    assert says in NODES["DGemmaSamplerAdvanced"].queue_refusal({"pins": [pins]})


def test_a_wide_blank_past_the_canvas_is_not_spelled_out(demo_model):
    """A blank wider than the answer keeps only the positions the run has: a million would be a million ints."""
    pins = parse_pins(demo_model, "x ___{999999}", 64)
    assert pins.blanks.size < 64


# ---------------------------------------------------------------- knobs at the engine path

def test_a_node_called_without_seed_is_refused(demo_model, no_model_work):
    knobs = {k: v for k, v in KNOBS.items() if k != "seed"}
    refused(["seed", "missing", "give"], lambda: NODES["DGemmaSampler"]().sample(model=demo_model, prompt="hi",
                                                                              **knobs))


def test_entropy_bound_zero_is_refused(demo_model, no_model_work):
    refused(["entropy_bound", "0.0", "above 0"], lambda: Knobs(entropy_bound=0.0))
    refused(["entropy_bound", "0.0", "above 0"],
            lambda: call(NODES["DGemmaSampler"], model=demo_model, prompt="hi", **{**KNOBS, "entropy_bound": 0.0}))


# ---------------------------------------------------------------- checkpoints that changed

def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _reweigh(folder: Path) -> None:
    """The same tensors, names and sizes, other values: what a retrained checkpoint looks like."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = {n: t + 0.5 if t.is_floating_point() else t for n, t in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("change", ["reweigh", "replace"])
def test_a_reload_after_unload_refuses_a_changed_checkpoint(tiny_dir, tmp_path, change):
    from diffusiongemma.dgemma.demo import DEMO_DIR

    folder = _copy(tiny_dir, tmp_path / "ckpt")
    dm = load_model(str(folder))
    memory.manage(dm, "unload", reload=lambda: load_model(str(folder)))
    memory.run_finished(dm, "n1")
    assert all(p.device.type == "meta" for p in dm.model.parameters())
    if change == "reweigh":
        _reweigh(folder)
    else:
        shutil.rmtree(folder)
        _copy(DEMO_DIR, folder)
    said = refused(["model", "'ckpt'", "changed", "Loader"], lambda: memory.model_ready(dm))
    assert str(folder) not in str(said)  # shown by its name, not the disk's layout
    refused(["model", "changed"], lambda: call(NODES["DGemmaSampler"], model=dm, prompt="hi", **KNOBS))


def test_an_unchanged_checkpoint_reloads(tiny_dir, tmp_path):
    folder = _copy(tiny_dir, tmp_path / "ckpt")
    dm = load_model(str(folder))
    memory.manage(dm, "unload", reload=lambda: load_model(str(folder)))
    memory.run_finished(dm, "n1")
    memory.model_ready(dm)
    assert all(p.device.type == "cpu" for p in dm.model.parameters())


def test_a_kv_cache_from_weights_since_changed_is_refused(tiny_dir, tmp_path, no_model_work, monkeypatch):
    folder = _copy(tiny_dir, tmp_path / "ckpt")
    monkeypatch.undo()
    cache = encode_context(load_model(str(folder)), "a=1, b=2.")
    _reweigh(folder)
    changed = load_model(str(folder))
    assert load_model(str(folder)).identity == changed.identity  # a reload of the same files agrees
    refused(["context", "checkpoint", "encode the context again"],
            lambda: generate(changed, "What is a+b?", FAST, context=cache))


def test_a_chat_template_reaching_outside_its_sandbox_refuses_the_checkpoint(tiny_dir, tmp_path):
    folder = _copy(tiny_dir, tmp_path / "ckpt")
    (folder / "chat_template.jinja").write_text("{{ cycler.__init__.__globals__.os.getcwd() }}")
    refused(["chat template", str(folder), "unsafe"], lambda: load_model(str(folder)))


# ---------------------------------------------------------------- headless graphs, refused before any node runs

def _graph(**changes):
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none", "model": "diffusiongemma-demo"}},
             "2": {"class_type": "DGemmaSamplerAdvanced",
                   "inputs": {"model": ["1", 0], "prompt": "What is 1+2?", "scheduler": "entropy_bound",
                              "start_step": 0, "end_step": 1024, "pins": "", **KNOBS}},
             "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 4], "filename_prefix": "dgemma"}}}
    for key, value in changes.items():
        node, name = key.split("__")
        graph[node]["inputs"][name] = value
    return graph


GRAPH_CASES = [
    ("pins at one position", _graph(**{"2__pins": "3: one\n3: two"}), ["node 2", "pins", "position 3", "one pin"]),
    ("template and pin at 0", _graph(**{"2__pins": "The ___ end\n0: x"}), ["node 2", "pins", "position 0"]),
    ("pins without a blank", _graph(**{"2__pins": "just text"}), ["node 2", "pins", "blank"]),
    ("window runs no step", _graph(**{"2__start_step": 5, "2__end_step": 3}),
     ["node 2", "start_step 5", "below end_step 3"]),
    ("empty window", _graph(**{"2__start_step": 4, "2__end_step": 4}), ["node 2", "start_step 4"]),
    ("SaveImage prefix escapes", _graph(**{"3__filename_prefix": "../../x"}),
     ["node 3", "'../../x'", "outside the output folder"]),
    ("SaveImage absolute prefix", _graph(**{"3__filename_prefix": "/tmp/x"}), ["node 3", "outside"]),
    ("class_type a list", {**_graph(), "1": {"class_type": ["DGemmaLoader"], "inputs": {}}},
     ["node 1", "class_type"]),
    ("t_min above t_max", _graph(**{"2__t_min": 0.9, "2__t_max": 0.5}), ["node 2", "t_min", "swap them"]),
    ("entropy_bound zero", _graph(**{"2__entropy_bound": 0.0}), ["node 2", "entropy_bound must be above 0"]),
    ("pin past any answer", _graph(**{"2__pins": "100000000000000000000: a"}), ["node 2", "past any answer"]),
]


@pytest.mark.parametrize("row", GRAPH_CASES, ids=lambda r: r[0])
def test_headless_graphs_are_refused_before_any_node_runs(row, tmp_path, monkeypatch, capsys):
    _, graph, words = row
    monkeypatch.setattr(NODES["DGemmaLoader"], "load", lambda *a, **k: pytest.fail("a node ran"))
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    assert cli.main([str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, f"{word!r} missing from: {err}"
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_comfyui_validation_runs_the_same_checks():
    """The pack's queue-time rules over the constant inputs (a linked one absent), before any node runs."""
    advanced, save = NODES["DGemmaSamplerAdvanced"], CORE_NODES["SaveImage"]
    assert "pins" in advanced.queue_refusal({"pins": "1: a\n1: b"})
    assert advanced.queue_refusal({"pins": "The ___ end"}) is None
    assert advanced.queue_refusal({}) is None
    assert "outside" in save.VALIDATE_INPUTS(filename_prefix="../x")
    assert save.VALIDATE_INPUTS(filename_prefix="runs/x") is True


def test_headless_runs_a_local_checkpoint_from_a_models_dir(tmp_path, monkeypatch, tiny_dir, capsys):
    """Outside ComfyUI, --models-dir stands for models/diffusiongemma: the Loader names a folder in it."""
    for name in ("DGEMMA_MODELS_DIR", "DGEMMA_OUTPUT_DIR"):  # the CLI sets them; put them back after
        monkeypatch.setenv(name, "")
    models = tmp_path / "models"
    models.mkdir()
    (models / "my-tiny").symlink_to(tiny_dir, target_is_directory=True)
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none", "model": "my-tiny"}},
             "2": {"class_type": "DGemmaSampler",
                   "inputs": {"model": ["1", 0], "prompt": "hi", **{**KNOBS, "gen_length": 8,
                                                                     "num_inference_steps": 2}}},
             "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    out = tmp_path / "out"
    assert cli.main([str(path), "--out", str(out), "--quiet", "--models-dir", str(models)]) == 0
    assert cli.main([str(path), "--out", str(out), "--quiet", "--models-dir", str(tmp_path / "none")]) == 2
    assert "--models-dir" in capsys.readouterr().err
