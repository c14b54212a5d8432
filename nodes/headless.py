"""Run API-format graphs of this pack without a ComfyUI server, or submit them to one.

In-process, nodes are called the way ComfyUI's executor calls them (INPUT_TYPES, FUNCTION with
hidden inputs, list outputs mapped over non-list inputs); core preview/save nodes and Video
Combine are simple file sinks. With --server the graph goes to a running ComfyUI instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import NODE_CLASS_MAPPINGS, events, host
from .client import submit
from .graph import execution_order, input_specs, is_link, validate
from .sinks import SINKS, describe

DEFAULT_GRAPH = Path(__file__).resolve().parents[1] / "examples" / "api" / "demo_smoke.json"
CLASSES = {**NODE_CLASS_MAPPINGS, **SINKS}


def _hidden_values(cls, node_id: str, graph: dict) -> dict:
    hidden = cls.INPUT_TYPES().get("hidden", {})
    known = {"UNIQUE_ID": node_id, "PROMPT": graph, "EXTRA_PNGINFO": None, "DYNPROMPT": None}
    return {name: known.get(kind) for name, kind in hidden.items()}


def _call(cls, instance, kwargs: dict):
    out = getattr(instance, cls.FUNCTION)(**kwargs)
    if isinstance(out, dict):
        return tuple(out.get("result", ())), out.get("ui")
    return tuple(out), None


def run_graph(graph: dict) -> dict:
    """Execute the output nodes of `graph` and their ancestors; returns {node id: ui dict}."""
    errors = validate(graph, CLASSES)
    if errors:
        raise ValueError("the graph does not validate:\n  " + "\n  ".join(errors))
    results, is_list, uis = {}, {}, {}
    for node_id in execution_order(graph, CLASSES):
        node = graph[node_id]
        cls = CLASSES[node["class_type"]]
        required, optional = input_specs(cls)
        kwargs, listed = {}, {}
        for name, value in node.get("inputs", {}).items():
            if name not in required and name not in optional:
                continue
            if is_link(value):
                kwargs[name] = results[value[0]][value[1]]
                listed[name] = is_list[value[0]][value[1]]
            else:
                kwargs[name], listed[name] = value, False
        hidden = _hidden_values(cls, node_id, graph)
        instance = cls()
        if getattr(cls, "INPUT_IS_LIST", False):
            calls = [{n: (v if listed[n] else [v]) for n, v in kwargs.items()}]
        else:
            count = max([len(kwargs[n]) for n in kwargs if listed[n]], default=0)
            calls = [{n: (v[min(i, len(v) - 1)] if listed[n] else v) for n, v in kwargs.items()}
                     for i in range(count)] if count else [kwargs]
        outs = [_call(cls, instance, {**c, **hidden}) for c in calls]
        out_list = getattr(cls, "OUTPUT_IS_LIST", (False,) * len(cls.RETURN_TYPES))
        results[node_id] = outs[0][0] if len(outs) == 1 else tuple(zip(*(o[0] for o in outs)))
        is_list[node_id] = out_list if len(outs) == 1 else (True,) * len(cls.RETURN_TYPES)
        ui = [o[1] for o in outs if o[1]]
        if ui:
            uis[node_id] = {k: sum((u.get(k, []) for u in ui), []) for k in ui[0]}
    return uis


def _print_step(event: str, data: dict) -> None:
    if event == events.STEP:
        text = "".join(data["tokens"]).replace("\n", "⏎")
        print(f"  [{data['node']}] block {data['block'] + 1}/{data['blocks']} step {data['step'] + 1}/"
              f"{data['steps']} T={data['T']:.3f} committed {data['committed']:.0%} | {text[:60]}",
              file=sys.stderr, flush=True)


def _report(graph: dict, uis: dict) -> None:
    for node_id, ui in uis.items():
        print(f"[{node_id}] {graph[node_id]['class_type']}")
        for key, values in ui.items():
            for value in values:
                text = value if isinstance(value, str) else describe(value)
                print(f"  {key}: " + text.replace("\n", "\n    "))


def _print_event(event: str, data: dict) -> None:
    if event == events.STEP:
        _print_step(event, data)
    elif event not in (events.START, events.DONE, "progress", "progress_state", "status"):
        print(f"  {event}: {json.dumps(data)[:300]}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headless", description=__doc__.splitlines()[0])
    parser.add_argument("graph", nargs="?", type=Path, default=DEFAULT_GRAPH, help="an API-format graph (JSON)")
    parser.add_argument("--out", type=Path, default=Path("output"), help="output folder (in-process runs)")
    parser.add_argument("--server", help="URL of a running ComfyUI, e.g. http://127.0.0.1:8188")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds without an event (--server)")
    parser.add_argument("--quiet", action="store_true", help="do not print the canvas per step")
    args = parser.parse_args(argv)
    graph = json.loads(args.graph.read_text())
    if args.server:
        code, outputs = submit(graph, args.server.rstrip("/"), args.timeout, _print_event)
        _report(graph, outputs)
        return code
    os.environ["DGEMMA_OUTPUT_DIR"] = str(args.out.resolve())
    if not args.quiet:
        host.listen(_print_step)
    try:
        uis = run_graph(graph)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _report(graph, uis)
    return 0
