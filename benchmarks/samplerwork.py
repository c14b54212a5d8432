"""The Sampler node's whole run as ComfyUI calls it, for the benchmarks: one call of DGemmaSampler (or
DGemmaDenoise for a constraint) through the headless runner's executor, with its live view on (every event
JSON-encoded, as the websocket sends it), the progress text built, the frames made and the images not (the
prompt reads only the frames, as a graph that wires them does)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.nodes import host  # noqa: E402
from diffusiongemma.nodes.sampler import DGemmaDenoise, DGemmaSampler  # noqa: E402
from diffusiongemma.nodes.wiring import STAMP  # noqa: E402
from diffusiongemma.runner.execute import call_node  # noqa: E402

NODE = "1"
WIDGETS = dict(t_min=0.4, t_max=0.8, entropy_bound=0.1, thinking=False)


class Events:
    """A listener of the live view: each event encoded as the websocket would, counted."""

    def __init__(self):
        self.count, self.bytes = 0, 0

    def __call__(self, event: str, data: dict) -> None:
        self.count += 1
        self.bytes += len(json.dumps({"type": event, "data": data}))

    def __enter__(self):
        host.listen(self)
        return self

    def __exit__(self, *exc):
        host._listeners.remove(self)


def sampler_call(dm, prompts: list[str], seeds: list[int], steps: int, gen_length: int, confidence: float = 0.0,
                 constraint: tuple[str, str] | None = None) -> tuple:
    """The node's outputs (lists, one item per prompt): one call, the list denoised as one batch."""
    inputs = dict(model=[dm], prompt=list(prompts), seed=list(seeds), num_inference_steps=[steps],
                  gen_length=[gen_length], confidence=[confidence], max_batch=[len(prompts)],
                  **{k: [v] for k, v in WIDGETS.items()})
    node = DGemmaSampler
    if constraint is not None:
        node = DGemmaDenoise
        inputs.update(constraint_type=[constraint[0]], constraint=[constraint[1]])
    graph = {NODE: {"class_type": node.__name__, "inputs": {STAMP: "frames"}}}
    out, _ = call_node(node, inputs, {"unique_id": [NODE], "graph": [graph]})
    return out
