"""Write the UI-format example workflows (examples/*.json) from API graphs and the node schemas.

Each workflow is an API graph laid out in columns by depth, plus Note nodes that explain it.
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
from diffusiongemma.runner.execute import CLASSES  # noqa: E402
from diffusiongemma.runner.graph import input_specs, is_link, is_widget, widget_layout  # noqa: E402

NOTES = {
    "diffusiongemma_start_here": [
        "DiffusionGemma writes by denoising: the Sampler's canvas starts as uniform random tokens and, step by "
        "step, the scheduler accepts the positions it is surest of (lowest entropy) and re-noises the rest. "
        "Press Run and watch the Sampler node: bright text is accepted, dim text is noise.",
        "Knobs: t_max -> t_min is the temperature anneal (hot first step, cooler later). entropy_bound is the "
        "joint entropy (nats) the scheduler may accept per step: lower means more, smaller steps. confidence "
        "stops a block early once the argmax is stable and the mean entropy is below it (0 = never).",
        "Outputs: text is the answer (thought channel cut out). canvas_state says whether the model closed its "
        "turn (turn_closed) and how long the answer is. The Trace heatmap shows which positions were accepted at "
        "each step; the run log keeps every step as JSON Lines in the output folder.",
        "The model box defaults to diffusiongemma-demo, a tiny model trained for this pack: it answers 'What is "
        "a+b?' in words and runs on any CPU. Put the real checkpoint folder under models/diffusiongemma and pick "
        "it in the Loader to run google/diffusiongemma-26B-A4B-it.",
    ],
    "diffusiongemma_kv_cache": [
        "Encode turns raw CONTEXT (no chat framing) into a KV cache. Denoise's prompt is the TURN: with both, "
        "the turn is prefilled after the context and the answer is generated on top. Empty prompt = pure "
        "injection. The cache is never modified, so re-running with another seed and back gives the same text.",
    ],
    "diffusiongemma_thinking": [
        "thinking=true renders the chat template with the model's native thinking switch. The model writes its "
        "thought channel first; text keeps only the answer and canvas_state.thought holds the thought.",
    ],
    "diffusiongemma_advanced_chain": [
        "Two Advanced samplers, one run: the first runs steps [0, 6) of the schedule and pauses; its "
        "canvas_state carries the unfinished canvas, self-conditioning, generator and cache, so the second "
        "continues at step 6 (its live view starts from that canvas, not from noise) with a looser "
        "entropy_bound. With the same knobs, the chain is token-, frame- and step-identical to one run.",
    ],
    "diffusiongemma_advanced_infill": [
        "Pins hold text in place (blue in the live view, frames and heatmap). The template pins the thought "
        "'thought\\n3+4=7' from answer position 1 and leaves blanks (___{1} is one position, ___ three or "
        "more) for the model; a line '12: text' pins text at a position. The model still answers seven.",
    ],
    "diffusiongemma_advanced_schedulers": [
        "One prompt, three diffusers schedulers: entropy_bound (the released default), block_refinement "
        "(commits the most confident share each step) and discrete_ddim (ancestral DDIM, here with one "
        "corrector sweep). Each matches diffusers' DiffusionGemmaPipeline token for token.",
    ],
    "diffusiongemma_image": [
        "The Sampler's optional image input: the picture goes through the model's own image processor into "
        "the encoder (about 280 soft tokens per image on the real model), before the text of the turn. The "
        "canvas holds only the answer, so you watch the caption anneal out of noise next to the picture.",
        "The demo model learned one visual question: pick a colour in Empty Image (or wire Load Image with a "
        "plain red, green, blue, yellow, cyan, magenta, white or black picture) and ask 'What colour is this?'. "
        "run_config records the image's size and a content hash, never its pixels.",
    ],
}
SOURCES = {"diffusiongemma_start_here": "trace_runlog", "diffusiongemma_kv_cache": "kv_cache",
           "diffusiongemma_thinking": "thinking", "diffusiongemma_advanced_chain": "advanced_chain",
           "diffusiongemma_advanced_infill": "advanced_infill",
           "diffusiongemma_advanced_schedulers": "advanced_schedulers", "diffusiongemma_image": "image"}


def _depths(graph: dict) -> dict:
    depth: dict = {}

    def of(node_id):
        if node_id not in depth:
            links = [v[0] for v in graph[node_id]["inputs"].values() if is_link(v)]
            depth[node_id] = 1 + max((of(n) for n in links), default=-1)
        return depth[node_id]

    for node_id in graph:
        of(node_id)
    return depth


def to_ui(graph: dict, notes: list[str]) -> dict:
    depth, rows, nodes, links = _depths(graph), {}, [], []
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
    # Samplers grow downward while their live view paints, so they go last in their column.
    positions = {}
    for node_id in sorted(graph, key=lambda n: graph[n]["class_type"] in ("DGemmaSampler", "DGemmaDenoise")):
        column = depth[node_id]
        row = rows.get(column, 0)
        rows[column] = row + 1
        positions[node_id] = [40 + 420 * column, 60 + 330 * row]
    for node_id, node in graph.items():
        cls = CLASSES[node["class_type"]]
        inputs = []
        for name, spec in _sockets(cls):
            value = node["inputs"].get(name)
            link = next((lk[0] for lk in links if lk[3] == ids[node_id] and lk[4] == len(inputs)), None)
            inputs.append({"name": name, "type": spec[0], "link": link if is_link(value) else None})
        outputs = [{"name": n, "type": t, "links": out_links.get((node_id, i), []), "slot_index": i}
                   for i, (t, n) in enumerate(zip(cls.RETURN_TYPES, getattr(cls, "RETURN_NAMES", cls.RETURN_TYPES)))]
        values = ["fixed" if name is None else node["inputs"].get(name, _default(cls, name))
                  for name in widget_layout(cls)]
        nodes.append({"id": ids[node_id], "type": node["class_type"], "pos": positions[node_id],
                      "size": [380, 300 if node["class_type"] == "DGemmaSampler" else 160], "flags": {},
                      "order": len(nodes), "mode": 0, "inputs": inputs, "outputs": outputs,
                      "properties": {"Node name for S&R": node["class_type"]}, "widgets_values": values})
    for i, text in enumerate(notes):
        nodes.append({"id": len(nodes) + 1, "type": "Note", "pos": [40 + 430 * i, -300], "size": [410, 260],
                      "flags": {}, "order": len(nodes), "mode": 0, "inputs": [], "outputs": [],
                      "properties": {}, "widgets_values": [text]})
    return {"last_node_id": len(nodes), "last_link_id": len(links), "nodes": nodes, "links": links,
            "groups": [], "config": {}, "extra": {}, "version": 0.4}


def _sockets(cls):
    required, optional = input_specs(cls)
    return [(n, s) for n, s in {**required, **optional}.items() if not is_widget(s)]


def _default(cls, name):
    required, optional = input_specs(cls)
    spec = {**required, **optional}[name]
    options = spec[1] if len(spec) > 1 else {}
    return options.get("default", spec[0][0] if isinstance(spec[0], list) else None)


def main() -> None:
    for name, source in SOURCES.items():
        graph = json.loads((REPO / "examples" / "api" / f"{source}.json").read_text())
        (REPO / "examples" / f"{name}.json").write_text(json.dumps(to_ui(graph, NOTES[name]), indent=1) + "\n")
        print(f"wrote examples/{name}.json")


if __name__ == "__main__":
    main()
