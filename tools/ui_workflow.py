"""Write the UI-format templates (example_workflows/*.json) from API graphs and the node schemas.

Each template is an API graph placed by its layout table below, plus Note nodes that explain it.
Re-run after changing a node's inputs: `python tools/ui_workflow.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.readouts.images import renderer  # noqa: E402
from diffusiongemma.runner.execute import CLASSES  # noqa: E402
from diffusiongemma.runner.graph import input_specs, is_link, is_widget, widget_layout  # noqa: E402

# Each template: its API graph (example_workflows/api/), where each node sits (x, y, width, height)
# and short notes. Measured in ComfyUI 0.8 (frontend 1.35.9, classic renderer) in a 1600x1000 window,
# in screen px; the frontend draws canvas point p at (p + offset) * scale. A template opens at its saved
# scale (>= 0.8) with every node, its title and its source badge inside FREE (left, top, right, bottom:
# right of the sidebar, below the tab bar and the workflow's name, above the stats in the lower left),
# clear of the floating Run toolbar and the "1 job completed" line under it (x past TOOLBAR[0], y above
# TOOLBAR[1]) and of the minimap (x past MINIMAP[0], y below MINIMAP[1]).
FREE = (60, 110, 1560, 910)
TOOLBAR = (1240, 128)
MINIMAP = (1340, 740)
TITLE, BADGE = 30, 20  # canvas px above a node's pos: its title bar, then a custom node's source badge
VIEW = {"scale": 1.0, "offset": [80, 180]}  # where a template opens unless it says otherwise


def above(node: dict) -> int:
    """Canvas px the frontend draws above a node's pos: the title, and the badge naming a pack's node."""
    return TITLE + (BADGE if node["type"].startswith(("DGemma", "VHS_")) else 0)


def screen_box(node: dict, view: dict) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) in screen px of a node with its title and badge, at the saved view."""
    (ox, oy), scale = view["offset"], view["scale"]
    x, y, w, h = *node["pos"], *node["size"]
    return (x + ox) * scale, (y - above(node) + oy) * scale, (x + w + ox) * scale, (y + h + oy) * scale


# The smallest size the frontend gives each node, measured there: on load it enlarges smaller nodes to
# this, and a sampler grows by the progress line under it once it runs (included here). Video Combine
# grows by its GIF preview after a run, so a template leaves room below it.
MIN_SIZE = {"DGemmaLoader": (210, 178), "DGemmaRemoteLoader": (210, 130),
            "DGemmaSampler": (224, 586), "DGemmaDenoise": (287, 666),
            "DGemmaEncode": (283, 128), "DGemmaTrace": (210, 126), "DGemmaSamplerAdvanced": (289, 892),
            "PreviewAny": (210, 112), "PreviewImage": (140, 26), "EmptyImage": (210, 130),
            "VHS_VideoCombine": (210, 238), "Note": (210, 88),
            # Estimated from the nodes above (their widgets and sockets), not yet measured in the frontend:
            "DGemmaDecide": (290, 640), "DGemmaRunLogWriter": (270, 130), "DGemmaLoraLoader": (240, 106)}
# Video Combine draws its GIF at the node's width less 20 px, as tall as the frame's aspect asks, under
# 252 px of widgets and margins. A template gives it a width that shows the frame at READABLE of its own
# size or more at the saved scale (its 6 px cells are hard to read smaller), and the height it takes after
# a run of the demo model, whose canvas is 32 positions, under the header saying what was asked.
GIF_HEIGHT, GIF_WIDTH = renderer(32).size(asked=True)
READABLE = 0.8


def video_combine(x: int, y: int, width: int) -> tuple[int, int, int, int]:
    return x, y, width, round(252 + (width - 20) * GIF_HEIGHT / GIF_WIDTH)


T = {"DGemmaLoader": (340, 200), "DGemmaRemoteLoader": (340, 140),
     "DGemmaSampler": (440, 600), "DGemmaDenoise": (440, 670),
     "DGemmaEncode": (340, 200), "DGemmaTrace": (320, 140), "DGemmaSamplerAdvanced": (420, 892)}

TEMPLATES = {
    "diffusiongemma_start_here": {
        "source": "start_here",
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, *T["DGemmaSampler"]),
                  "3": (820, 0, 320, 130), "4": (820, 170, 320, 210),
                  "5": (1160, 0, *T["DGemmaTrace"]), "6": (1160, 180, 320, 220)},
        "notes": [
            ((0, 240, 340, 150), "1 · Loader: the model box defaults to diffusiongemma-demo, a tiny model "
             "trained for this pack that answers 'What is a+b?' on any CPU. Put the real checkpoint folder "
             "under models/diffusiongemma to pick it. after_run: keep, offload to CPU or unload."),
            ((0, 430, 340, 170), "2 · Sampler: press Run and watch it. The canvas starts as random tokens; "
             "each step the surest positions are committed (bright) and the rest re-noised (dim)."),
            ((820, 420, 320, 180), "3 · Outputs: text is the answer. canvas_state says whether the model "
             "closed its turn and how many steps it took. Knobs: t_max → t_min anneals the temperature; "
             "entropy_bound is what a step may accept; confidence stops a block early."),
            ((1160, 430, 320, 130), "4 · Trace: a heatmap of positions (columns) × steps (rows) from the "
             "scheduler's real committed mask; mode entropy shows its uncertainty."),
        ],
    },
    "diffusiongemma_remote": {
        "source": "remote",
        "nodes": {"1": (0, 0, *T["DGemmaRemoteLoader"]), "7": (0, 180, 340, 120),
                  "2": (360, 0, *T["DGemmaSampler"]), "3": (820, 0, 320, 130), "4": (820, 170, 320, 210),
                  "5": (1160, 0, *T["DGemmaTrace"]), "6": (1160, 180, 320, 220)},
        "notes": [
            ((0, 340, 340, 260), "1 · Remote Loader: the model runs on another machine. There, in the pack's "
             "folder: python -m serve --model <checkpoint> (port 8190). Another host needs a token: set it in a "
             "DGEMMA_ env var on both sides and name that var in token_env. dialect says what the server streams: "
             "pack = all of it, as a local run."),
            ((820, 420, 320, 180), "2 · The rest is the start-here graph, unchanged: the Sampler paints each "
             "step live as the server streams it; text, canvas_state, the trace and its heatmap are the same "
             "as a local run of the same checkpoint and seed."),
        ],
    },
    "diffusiongemma_kv_cache": {
        "source": "kv_cache",
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, *T["DGemmaEncode"]),
                  "3": (720, 0, *T["DGemmaDenoise"]), "4": (1180, 0, 300, 130), "5": (1180, 170, 300, 210)},
        "notes": [
            ((360, 240, 340, 200), "KV context: Encode turns raw CONTEXT (no chat framing) into a KV cache. "
             "Denoise's prompt is the TURN, prefilled after the context; an empty prompt is pure injection. "
             "The cache is never modified: re-running gives the same text."),
            ((0, 240, 340, 150), "The demo model learned this too: context 'a=3, b=4.', turn 'What is a+b?'."),
        ],
    },
    "diffusiongemma_thinking": {
        "source": "thinking",
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, *T["DGemmaSampler"]),
                  "3": (820, 0, 320, 130), "4": (820, 170, 320, 210)},
        "notes": [
            ((0, 240, 340, 200), "thinking = true renders the chat template with the model's own thinking "
             "switch. The model writes its thought channel first: text keeps only the answer, "
             "canvas_state.thought holds the thought."),
        ],
    },
    "diffusiongemma_gif": {
        "source": "gif",
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, 440, 588),
                  "3": video_combine(820, 0, 600), "4": (360, 618, 440, 112)},
        "notes": [
            ((0, 240, 340, 200), "GIF export: the Sampler's images output is every step as one image batch. "
             "Video Combine (VideoHelperSuite) writes it as a GIF or MP4; core SaveAnimatedWEBP works too."),
        ],
    },
    "diffusiongemma_image": {
        "source": "image",
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (0, 240, 340, 130), "3": (360, 0, *T["DGemmaSampler"]),
                  "4": (820, 0, 320, 130), "5": (0, 410, 340, 190), "6": (820, 170, 320, 210)},
        "notes": [
            ((1160, 0, 320, 300), "Image input: the picture goes through the model's own image processor into "
             "the encoder, before the turn's text; the canvas holds only the answer. The demo model names a "
             "plain colour: pick one in Empty Image and ask 'What colour is this?'. run_config records the "
             "image's size and hash."),
        ],
    },
    "diffusiongemma_advanced_chain": {
        "source": "advanced_chain",
        "view": {"scale": 0.84, "offset": [80, 186]},
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, 360, 892), "3": (740, 0, 360, 892),
                  "4": (1120, 20, 640, 130), "5": video_combine(1120, 200, 640)},
        "notes": [
            ((0, 240, 340, 220), "Two Advanced samplers, one run: the first runs steps [0, 6) and pauses; its "
             "canvas_state carries the unfinished canvas, so the second continues at step 6 from that canvas, "
             "not from noise. With the same knobs the chain is identical to one run."),
        ],
    },
    "diffusiongemma_advanced_infill": {
        "source": "advanced_infill",
        "view": {"scale": 0.84, "offset": [80, 186]},
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, 440, 892),
                  "3": (820, 0, 340, 130), "4": (820, 180, 340, 140), "5": (820, 350, 340, 220)},
        "notes": [
            ((0, 240, 340, 220), "Pins hold text in place (blue in every view). ___{1} is one free position, "
             "___ three or more; a line '12: text' pins text at a position. The model fills the blanks and "
             "still answers seven."),
        ],
    },
    "diffusiongemma_structured": {
        "source": "structured",
        "view": {"scale": 0.8, "offset": [80, 210]},
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (360, 0, *T["DGemmaDenoise"]),
                  "4": (820, 0, *T["DGemmaSamplerAdvanced"]), "3": (1260, 0, 320, 112),
                  "5": (1260, 150, 320, 112), "6": (1260, 300, 320, 250)},
        "notes": [
            ((0, 240, 340, 300), "Every answer satisfies its constraint. Left, a choice (one per line): the "
             "demo already answers seven, so nothing changes. Right, a JSON Schema asking for one value: the "
             "canvas holds the value where the model answers, constrained to the enum, and the text is its JSON, "
             "{\"sum\":\"seven\"}. canvas_state says if it held."),
        ],
    },
    "diffusiongemma_decide": {
        "source": "decide",
        "view": {"scale": 0.8, "offset": [80, 210]},
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (0, 260, 340, 130), "3": (360, 0, 440, 700),
                  "4": (820, 0, 320, 112), "5": (820, 150, 320, 250), "6": (1160, 0, 420, 200),
                  "7": (1160, 260, 420, 300), "8": (820, 460, 320, 150)},
        "notes": [
            ((0, 430, 340, 250), "Decide: how sure is the model? Each option's probability as the whole answer, "
             "read from its logits at the start of the answer, over 8 noise draws (bars: mean, whiskers: one "
             "standard error). The trace follows the same reading over the denoising steps; the run log keeps "
             "it. Pick another colour in Empty Image."),
        ],
    },
    "diffusiongemma_lora": {
        "source": "lora",
        "view": {"scale": 0.8, "offset": [80, 210]},
        "nodes": {"1": (0, 0, *T["DGemmaLoader"]), "2": (0, 260, 340, 130), "3": (360, 0, *T["DGemmaSampler"]),
                  "5": (820, 0, *T["DGemmaSampler"]), "4": (1280, 0, 320, 130), "6": (1280, 170, 320, 130),
                  "7": (1280, 360, 320, 150)},
        "notes": [
            ((0, 430, 340, 200), "LoRA: the loader adds the demo's digits adapter (PEFT's format; yours go in "
             "models/loras) to the loaded model at a strength. The left Sampler runs through it and answers 7; "
             "the right one, wired to the plain model, still answers seven: the adapter is a view, the weights "
             "are never changed."),
            ((1280, 550, 320, 160), "Each view's header, the trace and the run log name the adapter and its "
             "strength (+ LoRA name @ 1). Chain loaders to stack adapters; strength 0 is the plain model."),
        ],
    },
    # Three samplers in a row left of the minimap (the only room that reaches below it), their answers in
    # the column above it. A Video Combine per sampler would not fit at a size its GIF can be read.
    "diffusiongemma_advanced_schedulers": {
        "source": "advanced_schedulers",
        "view": {"scale": 0.8, "offset": [80, 210]},
        "nodes": {"1": (0, 0, 300, 200), "2": (320, 0, 400, 892), "3": (740, 0, 400, 892),
                  "4": (1160, 0, 400, 892), "5": (1580, 0, 270, 112), "6": (1580, 160, 270, 112),
                  "7": (1580, 320, 270, 112)},
        "notes": [
            ((0, 240, 300, 300), "One prompt, three diffusers schedulers: entropy_bound (the default), "
             "block_refinement (commits the surest share each step) and discrete_ddim (ancestral DDIM with a "
             "corrector sweep). Each matches diffusers' pipeline token for token; each view shows how it anneals "
             "(the GIF template saves one)."),
        ],
    },
}


def to_ui(graph: dict, template: dict) -> dict:
    nodes, links = [], []
    ids = {node_id: i + 1 for i, node_id in enumerate(graph)}
    out_links: dict = {}
    for node_id, node in graph.items():
        for slot, (name, _) in enumerate(_sockets(CLASSES[node["class_type"]])):
            value = node["inputs"].get(name)
            if is_link(value):
                link_id = len(links) + 1
                source = CLASSES[graph[value[0]]["class_type"]]
                links.append([link_id, ids[value[0]], value[1], ids[node_id], slot,
                              source.RETURN_TYPES[value[1]]])
                out_links.setdefault((value[0], value[1]), []).append(link_id)
    for node_id, node in graph.items():
        cls = CLASSES[node["class_type"]]
        x, y, w, h = template["nodes"][node_id]
        inputs = []
        for name, spec in _sockets(cls):
            value = node["inputs"].get(name)
            link = next((lk[0] for lk in links if lk[3] == ids[node_id] and lk[4] == len(inputs)), None)
            inputs.append({"name": name, "type": spec[0], "link": link if is_link(value) else None})
        outputs = [{"name": n, "type": t, "links": out_links.get((node_id, i), []), "slot_index": i}
                   for i, (t, n) in enumerate(zip(cls.RETURN_TYPES, getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)))]
        values = ["fixed" if name is None else node["inputs"].get(name, _default(cls, name))
                  for name in widget_layout(cls)]
        nodes.append({"id": ids[node_id], "type": node["class_type"], "pos": [x, y], "size": [w, h], "flags": {},
                      "order": len(nodes), "mode": 0, "inputs": inputs, "outputs": outputs,
                      "properties": {"Node name for S&R": node["class_type"]}, "widgets_values": values})
    for (x, y, w, h), text in template["notes"]:
        nodes.append({"id": len(nodes) + 1, "type": "Note", "pos": [x, y], "size": [w, h],
                      "flags": {}, "order": len(nodes), "mode": 0, "inputs": [], "outputs": [],
                      "properties": {}, "widgets_values": [text]})
    view = {"ds": dict(template.get("view", VIEW))}
    return {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": view, "version": 0.4}


def bounds(workflow: dict) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of every node, in canvas units."""
    boxes = [(n["pos"][0], n["pos"][1], n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])
             for n in workflow["nodes"]]
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes),
            max(b[3] for b in boxes))


def _sockets(cls):
    required, optional = input_specs(cls)
    return [(n, s) for n, s in {**required, **optional}.items() if not is_widget(s)]


def _default(cls, name):
    required, optional = input_specs(cls)
    spec = {**required, **optional}[name]
    options = spec[1] if len(spec) > 1 else {}
    return options.get("default", spec[0][0] if isinstance(spec[0], list) else None)


def main() -> None:
    for name, template in TEMPLATES.items():
        graph = json.loads((REPO / "example_workflows" / "api" / f"{template['source']}.json").read_text())
        (REPO / "example_workflows" / f"{name}.json").write_text(json.dumps(to_ui(graph, template), indent=1) + "\n")
        print(f"wrote example_workflows/{name}.json")


if __name__ == "__main__":
    main()
