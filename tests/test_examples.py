"""Every example graph validates against the node schemas, and every API example runs headless."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

from diffusiongemma.nodes.loader import model_choices
from diffusiongemma.runner.execute import CLASSES, run_graph
from diffusiongemma.runner.graph import input_specs, validate, widget_layout

API = sorted((REPO / "example_workflows" / "api").glob("*.json"))
UI = sorted((REPO / "example_workflows").glob("*.json"))
FRONTEND_ONLY = {"Note", "MarkdownNote"}


def test_there_are_examples_of_each_kind():
    names = {p.stem for p in API}
    assert {"ping", "knobs", "trace", "thinking", "runlog", "gif", "kv_cache", "demo_smoke", "start_here", "image",
            "advanced_chain", "advanced_infill", "advanced_schedulers", "remote", "structured", "lora"} <= names
    assert {"diffusiongemma_start_here", "diffusiongemma_kv_cache", "diffusiongemma_thinking",
            "diffusiongemma_gif", "diffusiongemma_advanced_chain", "diffusiongemma_advanced_infill",
            "diffusiongemma_advanced_schedulers", "diffusiongemma_image",
            "diffusiongemma_remote", "diffusiongemma_structured", "diffusiongemma_lora"} <= {p.stem for p in UI}


def _gguf_models(graph, monkeypatch):
    """A graph that loads a .gguf finds the demo's GGUF files as the models folder."""
    if any(str(n["inputs"].get("model", "")).endswith(".gguf") for n in graph.values()):
        monkeypatch.setenv("DGEMMA_MODELS_DIR", str(REPO / "tests" / "fixtures" / "gguf"))


@pytest.mark.parametrize("path", API, ids=lambda p: p.stem)
def test_api_example_validates(path, monkeypatch):
    _gguf_models(json.loads(path.read_text()), monkeypatch)
    assert validate(json.loads(path.read_text()), CLASSES) == []


def _check_widget(cls, name, value):
    required, optional = input_specs(cls)
    kind, *rest = {**required, **optional}[name]
    options = rest[0] if rest else {}
    if name == "model" and cls.__name__ == "DGemmaLoader":
        kind = model_choices()
    if isinstance(kind, list):
        assert value in kind, (cls.__name__, name, value)
    elif kind in ("INT", "FLOAT"):
        assert options.get("min", value) <= value <= options.get("max", value), (cls.__name__, name, value)
    elif kind == "BOOLEAN":
        assert isinstance(value, bool)
    else:
        assert isinstance(value, str)


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_ui_example_validates(path):
    workflow = json.loads(path.read_text())
    nodes = {n["id"]: n for n in workflow["nodes"]}
    for node in nodes.values():
        if node["type"] in FRONTEND_ONLY:
            continue
        cls = CLASSES[node["type"]]
        layout = widget_layout(cls)
        assert len(node["widgets_values"]) == len(layout), node["type"]
        for name, value in zip(layout, node["widgets_values"]):
            if name is None:
                assert value in ("fixed", "increment", "decrement", "randomize")
            else:
                _check_widget(cls, name, value)
        required, _ = input_specs(cls)
        socket_names = [i["name"] for i in node["inputs"]]
        for name, _spec in required.items():
            if name not in layout:
                assert name in socket_names and node["inputs"][socket_names.index(name)]["link"], (node["type"], name)
    for link_id, origin, slot, target, target_slot, kind in workflow["links"]:
        source, sink = CLASSES[nodes[origin]["type"]], nodes[target]
        assert source.RETURN_TYPES[slot] == kind
        declared = sink["inputs"][target_slot]
        assert declared["link"] == link_id and declared["type"] in (kind, "*")
        assert link_id in nodes[origin]["outputs"][slot]["links"]


def _ui_workflow():
    sys.path.insert(0, str(REPO / "tools"))
    import ui_workflow

    return ui_workflow


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_ui_examples_are_generated_from_their_api_graphs(path):
    ui_workflow = _ui_workflow()
    template = ui_workflow.TEMPLATES[path.stem]
    api = json.loads((REPO / "example_workflows" / "api" / f"{template['source']}.json").read_text())
    assert json.loads(path.read_text()) == ui_workflow.to_ui(api, template)


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_templates_open_readable_in_a_1600_by_1000_window(path):
    """The saved view is at least 80 % and every node, title and badge included, lies in the free canvas
    there, clear of the Run toolbar and the minimap; every node is at least the size the frontend gives
    it, and no node hides another."""
    ui_workflow = _ui_workflow()
    workflow = json.loads(path.read_text())
    view = workflow["extra"]["ds"]
    assert view["scale"] >= 0.8 and ui_workflow.bounds(workflow)[:2] == (0, 0)
    left, top, right, bottom = ui_workflow.FREE
    for n in workflow["nodes"]:
        box = ui_workflow.screen_box(n, view)
        where = (n["type"], n["pos"], [round(v) for v in box])
        assert left <= box[0] and top <= box[1] and box[2] <= right and box[3] <= bottom, where
        assert box[2] <= ui_workflow.TOOLBAR[0] or box[1] >= ui_workflow.TOOLBAR[1], where
        assert box[2] <= ui_workflow.MINIMAP[0] or box[3] <= ui_workflow.MINIMAP[1], where
    boxes = [(n["pos"][0], n["pos"][1] - ui_workflow.above(n), n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in workflow["nodes"]]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    for node in workflow["nodes"]:
        least = ui_workflow.MIN_SIZE[node["type"]]
        assert node["size"][0] >= least[0] and node["size"][1] >= least[1], (node["type"], node["size"], least)
    notes = [n["widgets_values"][0] for n in workflow["nodes"] if n["type"] == "Note"]
    assert notes and all(len(text) <= 320 for text in notes)


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_video_combine_shows_the_gif_at_a_readable_size(path):
    """Video Combine draws the GIF at its width less 20 px: at the saved scale that is READABLE of the
    frame's own width or more, and the node has the height the preview adds after a run of the demo."""
    ui_workflow = _ui_workflow()
    workflow = json.loads(path.read_text())
    scale = workflow["extra"]["ds"]["scale"]
    assert ui_workflow.GIF_WIDTH == 576 and ui_workflow.READABLE >= 0.8
    for n in (n for n in workflow["nodes"] if n["type"] == "VHS_VideoCombine"):
        width, height = n["size"]
        assert (width - 20) * scale >= ui_workflow.READABLE * ui_workflow.GIF_WIDTH, (n["id"], width, scale)
        assert height >= 252 + (width - 20) * ui_workflow.GIF_HEIGHT / ui_workflow.GIF_WIDTH - 0.5, (n["id"], height)


@pytest.mark.parametrize("path", UI, ids=lambda p: p.stem)
def test_every_template_has_a_thumbnail_from_a_screenshot(path):
    from PIL import Image

    thumb = path.with_suffix(".jpg")
    with Image.open(thumb) as image:
        assert image.format == "JPEG" and image.width >= 400 and image.height >= 250


@pytest.mark.parametrize("path", API, ids=lambda p: p.stem)
def test_api_example_runs_headless(path, tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_OUTPUT_DIR", str(tmp_path))
    graph = json.loads(path.read_text())
    _gguf_models(graph, monkeypatch)
    remote = [n for n in graph.values() if n["class_type"] == "DGemmaRemoteLoader"]
    if remote:  # the remote example runs against a real server on loopback
        from remote_server import served

        with served() as (url, _):
            for node in remote:
                node["inputs"]["url"] = url
            uis = run_graph(graph)
    else:
        uis = run_graph(graph)
    outputs = {node: ui for node, ui in uis.items()}
    assert outputs, "no output node ran"
    texts = [t for ui in outputs.values() for t in ui.get("text", [])]
    logs = [tmp_path / t.removeprefix("output/") for t in texts if t.endswith(".jsonl")]  # shown as output/…
    texts += [json.loads(open(log).read().splitlines()[-1])["text"] for log in logs]
    expected = {"ping": "three", "image": "red", "decide": "blue", "lora": "7"}.get(path.stem, "seven")
    assert expected in texts, texts[:3]
    if path.stem == "lora":  # its plain branch, from the same loaded model, still answers in words
        assert "seven" in texts, texts[:3]
    for ui in outputs.values():
        for file in ui.get("images", []) + ui.get("gifs", []):
            assert (tmp_path / file).is_file() and (tmp_path / file).stat().st_size > 0


def test_main_command_runs_the_demo_smoke_graph(tmp_path):
    done = subprocess.run([sys.executable, "-m", "headless", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "text: seven" in done.stdout
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".gif", ".jsonl", ".png"]
    assert "up to 8 block(s) of up to 48 steps" in done.stderr and "block 1/≤8  step 1/≤48  T " in done.stderr
    assert "nothing was written" not in done.stderr


def test_headless_says_when_out_receives_nothing(tmp_path):
    ping = REPO / "example_workflows" / "api" / "ping.json"
    done = subprocess.run([sys.executable, "-m", "headless", str(ping), "--out", str(tmp_path), "--quiet"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "text: three" in done.stdout, done.stderr[-2000:]
    assert "nothing was written" in done.stderr and not any(tmp_path.iterdir())


@pytest.mark.parametrize("mutate, message", [
    (lambda g: g["2"].update(class_type="NoSuchNode"), "is not a node this runner knows"),
    (lambda g: g["2"]["inputs"].pop("seed"), "required input 'seed' is missing"),
    (lambda g: g["2"]["inputs"].update(num_inference_steps=5000), "above the maximum 1024"),
    (lambda g: g["1"]["inputs"].update(quant="q4_k_m"), "'q4_k_m' is not one of"),
    (lambda g: g["3"]["inputs"].update(source=["2", 9]), "has no output 9"),
    (lambda g: g["2"]["inputs"].update(model=["2", 0]), "expects DGEMMA_MODEL"),
])
def test_bad_graphs_are_refused_before_running(mutate, message):
    graph = json.loads((REPO / "example_workflows" / "api" / "ping.json").read_text())
    mutate(graph)
    errors = validate(graph, CLASSES)
    assert any(message in e for e in errors), errors
    with pytest.raises(ValueError, match="does not validate"):
        run_graph(graph)


def test_ui_format_is_refused_with_the_fix():
    assert "Export (API)" in validate(json.loads(UI[0].read_text()), CLASSES)[0]
