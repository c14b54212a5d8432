"""Which of a node's costly outputs a queued prompt reads, stamped where ComfyUI's cache key sees it.

ComfyUI keys a node's cached outputs by its inputs and its ancestors', never by who reads them, so a
run that skipped an unread output would hand that cached gap to a node wired to it later. The pack
stamps every queued prompt (ComfyUI's on-prompt hook, and the headless runner): each node of a class
with outputs made on demand (`ON_DEMAND`, output names) gets an input `STAMP` naming those of them that
some node reads. No node declares that input, so ComfyUI neither validates nor passes it, but it is in
the cache key: wiring such an output changes the key and the node runs again. The node reads its stamp
from the prompt (the hidden PROMPT input) and makes an on-demand output only when its stamp names it;
a node with no stamp (a prompt that never passed the hook) makes every output.
"""

from __future__ import annotations

from . import host

STAMP = "dgemma_outputs_used"
MAX_STAMP = 200  # characters: a stamp is a few output names


def is_link(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def stamp(graph, classes: dict) -> None:
    """Stamp, in place, every node of `graph` (ComfyUI's API format) whose class_type is in `classes`
    (name -> class with ON_DEMAND) with the on-demand outputs some node's input links to. Anything that
    is not a well-formed node is left alone."""
    if not isinstance(graph, dict):
        return
    read: dict[str, set[int]] = {}
    for node in graph.values():
        inputs = node.get("inputs") if isinstance(node, dict) else None
        for value in inputs.values() if isinstance(inputs, dict) else ():
            if is_link(value):
                read.setdefault(value[0], set()).add(value[1])
    for node_id, node in graph.items():
        cls = classes.get(node.get("class_type")) if isinstance(node, dict) else None
        if cls is None or not isinstance(node.get("inputs"), dict):
            continue
        slots = read.get(node_id, set())
        node["inputs"][STAMP] = ",".join(name for name in cls.ON_DEMAND if cls.RETURN_NAMES.index(name) in slots)


def on_prompt(classes: dict):
    """ComfyUI's on-prompt handler: stamps the queued prompt and hands it on."""
    return host.prompt_handler(lambda graph: stamp(graph, classes))


def made(graph, node_id, name: str) -> bool:
    """Whether node `node_id` makes its on-demand output `name`: unless its stamp in `graph` leaves it out."""
    graph = graph[0] if isinstance(graph, list) and graph else graph  # a list node gets its hidden input listed
    node = graph.get(str(node_id)) if isinstance(graph, dict) else None
    inputs = node.get("inputs") if isinstance(node, dict) else None
    used = inputs.get(STAMP) if isinstance(inputs, dict) else None
    if not isinstance(used, str) or len(used) > MAX_STAMP:
        return True
    return name in used.split(",")
