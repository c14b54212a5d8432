"""API-format graphs checked against node schemas the way ComfyUI's validator checks them."""

from __future__ import annotations

import inspect
import math

from ..dgemma.denoising.resume import check_window_order
from ..dgemma.errors import InputError

ANY = "*"


def is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def input_specs(cls) -> tuple[dict, dict]:
    spec = cls.INPUT_TYPES()
    return spec.get("required", {}), spec.get("optional", {})


def _types_match(out_type: str, in_type) -> bool:
    if isinstance(in_type, list):  # a combo fed by a link takes whatever the upstream gives
        return True
    if ANY in (out_type, in_type):
        return True
    return bool(set(str(out_type).split(",")) & set(str(in_type).split(",")))


# A widget type's constants: what fits, how the expectation reads, whether min/max apply.
_CONSTANTS = {
    "INT": (lambda v: not isinstance(v, bool) and isinstance(v, int), "an integer", True),
    "FLOAT": (lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v),
              "a finite number", True),
    "BOOLEAN": (lambda v: isinstance(v, bool), "true or false", False),
    "STRING": (lambda v: isinstance(v, str), "text", False),
}


def _check_constant(node_id: str, name: str, in_type, options: dict, value) -> str | None:
    where = f"node {node_id} input {name!r}"
    if isinstance(in_type, list):
        return None if value in in_type else f"{where}: {value!r} is not one of {in_type}"
    rule = _CONSTANTS.get(in_type) if isinstance(in_type, str) else None
    if rule is None:
        return f"{where}: a {in_type} must be linked from another node, got the constant {value!r}"
    fits, expected, ranged = rule
    if not fits(value):
        return f"{where}: expected {expected}, got {value!r}"
    if ranged and "min" in options and value < options["min"]:
        return f"{where}: {value!r} is below the minimum {options['min']}"
    if ranged and "max" in options and value > options["max"]:
        return f"{where}: {value!r} is above the maximum {options['max']}"
    return None


def validate(graph, classes: dict) -> list[str]:
    """Every problem ComfyUI would refuse the graph for, as readable lines (empty when valid)."""
    if not isinstance(graph, dict):
        return [f"a graph must be a JSON object of node ids, got {type(graph).__name__}"]
    if "nodes" in graph and "links" in graph:
        return ["this is a UI-format workflow; export it with Workflow > Export (API) and run that file"]
    errors = []
    for node_id, node in graph.items():
        errors += _node_problems(graph, classes, node_id, node)
    return errors


def _node_problems(graph: dict, classes: dict, node_id, node) -> list[str]:
    """What is wrong with one node: its shape, its class, each of its inputs."""
    if not isinstance(node, dict) or not isinstance(node.get("class_type"), str) or \
            not isinstance(node.get("inputs", {}), dict):
        return [f"node {node_id}: needs a class_type (text) and inputs (an object of input names), "
                f"got {str(node)[:80]}"]
    cls = classes.get(node["class_type"])
    if cls is None:
        return [f"node {node_id}: {node['class_type']!r} is not a node this runner knows "
                f"(it runs {', '.join(sorted(classes))}); run the graph in ComfyUI with --server"]
    required, optional = input_specs(cls)
    inputs = node.get("inputs", {})
    errors = [f"node {node_id} ({node['class_type']}): required input {name!r} is missing"
              for name in required if name not in inputs]
    for name, value in inputs.items():
        declared = required.get(name) or optional.get(name)
        if declared is None:
            continue  # ComfyUI ignores inputs a node does not declare
        in_type, options = declared[0], (declared[1] if len(declared) > 1 else {})
        problem = _check_link(graph, classes, f"node {node_id} input {name!r}", in_type, value) \
            if is_link(value) else _check_constant(node_id, name, in_type, options, value)
        if problem:
            errors.append(problem)
    return errors + _custom_validation(node_id, cls, inputs) + _window_order(node_id, cls, inputs)


def _check_link(graph, classes: dict, where: str, in_type, link) -> str | None:
    """What is wrong with a link into an input (None when it fits); a malformed source is named on its own."""
    source = graph.get(link[0])
    kind = source.get("class_type") if isinstance(source, dict) else None
    source_cls = classes.get(kind) if isinstance(kind, str) else None
    if source is None:
        return f"{where}: links to missing node {link[0]}"
    if source_cls is None:
        return None
    outs = source_cls.RETURN_TYPES
    if not 0 <= link[1] < len(outs):
        return f"{where}: node {link[0]} has no output {link[1]}"
    if not _types_match(outs[link[1]], in_type):
        return f"{where}: expects {in_type}, node {link[0]} output {link[1]} gives {outs[link[1]]}"
    return None


def _custom_validation(node_id: str, cls, inputs: dict) -> list[str]:
    """A node's own VALIDATE_INPUTS on its constant inputs, as ComfyUI calls it before running anything."""
    check = getattr(cls, "VALIDATE_INPUTS", None)
    if check is None:
        return []
    declared = inspect.getfullargspec(check).args  # like ComfyUI: the check sees only the inputs it names
    constants = {n: ([v] if getattr(cls, "INPUT_IS_LIST", False) else v) for n, v in inputs.items()
                 if not is_link(v) and n in declared}
    verdict = check(**constants)
    return [] if verdict is True else [f"node {node_id} ({cls.__name__}): {verdict}"]


def _window_order(node_id: str, cls, inputs: dict) -> list[str]:
    """A window that would run no step. ComfyUI checks it when the node starts (a VALIDATE_INPUTS naming
    both steps would repeat every error under each name and switch off ComfyUI's own range checks);
    here it is refused before any node runs."""
    start, end = inputs.get("start_step"), inputs.get("end_step")
    if not (isinstance(start, int) and isinstance(end, int)):  # a link is a list: checked when it runs
        return []
    try:
        check_window_order(start, end)
    except InputError as err:
        return [f"node {node_id} ({cls.__name__}): {err}"]
    return []


def check_graph(graph, classes: dict) -> None:
    """Raise one ValueError listing every problem `validate` finds."""
    errors = validate(graph, classes)
    if errors:
        raise ValueError("the graph does not validate:\n  " + "\n  ".join(errors))


def execution_order(graph, classes: dict) -> list[str]:
    """Output nodes and their ancestors, each after the nodes it reads from (no recursion: chains may be long)."""
    outputs = [n for n, node in graph.items() if getattr(classes[node["class_type"]], "OUTPUT_NODE", False)]
    if not outputs:
        raise ValueError("the graph has no output node (a preview, save or run log node); nothing would run")
    order, state = [], {}
    for root in outputs:
        stack = [(root, False)]
        while stack:
            node_id, expanded = stack.pop()
            if expanded:
                state[node_id] = "done"
                order.append(node_id)
                continue
            if state.get(node_id) == "done":
                continue
            if state.get(node_id) == "visiting":
                raise ValueError(f"the graph has a cycle through node {node_id}")
            state[node_id] = "visiting"
            stack.append((node_id, True))
            links = [v[0] for v in graph[node_id].get("inputs", {}).values() if is_link(v)]
            stack += [(n, False) for n in reversed(links) if state.get(n) != "done"]
    return order


WIDGET_TYPES = ("INT", "FLOAT", "STRING", "BOOLEAN")


def is_widget(spec: tuple) -> bool:
    kind, options = spec[0], (spec[1] if len(spec) > 1 else {})
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not options.get("forceInput")


def widget_layout(cls) -> list[str | None]:
    """Names behind a UI workflow's widgets_values, in order; None marks a seed's control value."""
    required, optional = input_specs(cls)
    names: list[str | None] = []
    for name, spec in {**required, **optional}.items():
        if is_widget(spec):
            names.append(name)
            if len(spec) > 1 and spec[1].get("control_after_generate"):
                names.append(None)
    return names
