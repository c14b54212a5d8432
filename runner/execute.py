"""Execute an API graph in process: nodes called the way ComfyUI's executor calls them."""

from __future__ import annotations

import copy

from ..nodes import NODE_CLASS_MAPPINGS, ON_DEMAND_CLASSES, memory, queue_check, wiring
from .core_nodes import CORE_NODES
from .graph import check_graph, execution_order, input_specs, is_link

CLASSES = {**NODE_CLASS_MAPPINGS, **CORE_NODES}


def hidden_values(cls, node_id: str, graph: dict) -> dict:
    """The hidden inputs a node declares, filled as ComfyUI fills them; one of another type (a queued check)
    reaches the node only from the graph, as ComfyUI passes it only when the prompt holds it."""
    hidden = cls.INPUT_TYPES().get("hidden", {})
    known = {"UNIQUE_ID": node_id, "PROMPT": graph, "EXTRA_PNGINFO": None, "DYNPROMPT": None}
    return {name: known[kind] for name, kind in hidden.items() if kind in known}


def call_node(cls, inputs: dict, hidden: dict | None = None) -> tuple[tuple, dict | None]:
    """One call of a node: a fresh instance, FUNCTION(**inputs, **hidden); returns (outputs, ui)."""
    out = getattr(cls(), cls.FUNCTION)(**inputs, **(hidden or {}))
    if isinstance(out, dict):
        return tuple(out.get("result", ())), out.get("ui")
    return tuple(out), None


def _calls(cls, kwargs: dict, listed: dict) -> list[dict]:
    """ComfyUI's list mapping: INPUT_IS_LIST nodes get lists, others run once per list item."""
    if getattr(cls, "INPUT_IS_LIST", False):
        return [{n: (v if listed[n] else [v]) for n, v in kwargs.items()}]
    count = max([len(kwargs[n]) for n in kwargs if listed[n]], default=0)
    if not count:
        return [kwargs]
    return [{n: (v[min(i, len(v) - 1)] if listed[n] else v) for n, v in kwargs.items()} for i in range(count)]


class NodeFailed(Exception):
    """A node raised while the graph ran: which node, and its error (the command line prints both)."""

    def __init__(self, node_id: str, class_type: str, error: Exception):
        super().__init__(f"node {node_id} ({class_type}): {error}")
        self.node_id, self.class_type, self.error = node_id, class_type, error


def run_graph(graph: dict) -> dict:
    """Execute the output nodes of `graph` and their ancestors; returns {node id: ui dict}. The graph is
    checked and stamped as ComfyUI's server handles a queued prompt (nodes/queue_check.py, nodes/wiring.py)."""
    graph = copy.deepcopy(graph)
    queue_check.check_prompt(graph, CLASSES)
    check_graph(graph, CLASSES)
    wiring.stamp(graph, ON_DEMAND_CLASSES)
    with memory.reporting_node_ends():
        return _run(graph)


def _call_all(node_id: str, class_type: str, cls, kwargs: dict, listed: dict, hidden: dict) -> list:
    try:
        return [call_node(cls, c, hidden) for c in _calls(cls, kwargs, listed)]
    except Exception as err:
        raise NodeFailed(node_id, class_type, err) from err


def _run(graph: dict) -> dict:
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
        hidden = hidden_values(cls, node_id, graph)
        outs = _call_all(node_id, node["class_type"], cls, kwargs, listed, hidden)
        memory.node_finished(node_id)  # after every list item, as ComfyUI's progress registry tells it
        out_list = getattr(cls, "OUTPUT_IS_LIST", (False,) * len(cls.RETURN_TYPES))
        results[node_id] = outs[0][0] if len(outs) == 1 else tuple(zip(*(o[0] for o in outs)))
        is_list[node_id] = out_list if len(outs) == 1 else (True,) * len(cls.RETURN_TYPES)
        ui = [o[1] for o in outs if o[1]]
        if ui:
            uis[node_id] = {k: sum((u.get(k, []) for u in ui), []) for k in ui[0]}
    return uis
