"""`python -m headless`: run an API-format graph in process, or submit it to a running ComfyUI."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .client import check_server_url, submit

# The live view's event names (nodes/events.py), written here so that `--server` imports no torch.
START, STEP, DONE = "dgemma.start", "dgemma.step", "dgemma.done"
MAX_ERROR = 400  # characters of a node's error on the command line

DEFAULT_GRAPH = Path(__file__).resolve().parents[1] / "example_workflows" / "api" / "demo_smoke.json"


def _print_step(event: str, data: dict) -> None:
    """Each step by its caption (dgemma/readouts/caption.py), the one text every surface shows."""
    if event == START:
        blocks = "?" if data.get("blocks") is None else data["blocks"]
        steps = "an unknown number of" if data.get("steps") is None else f"up to {data['steps']}"
        print(f"  [{data['node']}] up to {blocks} block(s) of {steps} steps", file=sys.stderr, flush=True)
    elif event == STEP:
        text = "".join(data["tokens"]).replace("\n", "⏎")
        caption = data.get("caption") or f"block {data['block'] + 1} step {data['step'] + 1}"  # an older pack's server
        print(f"  [{data['node']}] {caption} | {text[:60]}", file=sys.stderr, flush=True)
    elif event == DONE:
        steps = "?" if data.get("steps_used") is None else data["steps_used"]
        print(f"  [{data['node']}] {data['status']} after {steps} steps", file=sys.stderr, flush=True)


def _print_event(event: str, data: dict) -> None:
    if event in (START, STEP, DONE):
        _print_step(event, data)
    elif event == "execution_error":
        print(f"error: node {data.get('node_id')} ({data.get('node_type')}): "
              f"{str(data.get('exception_message', '')).strip()[:MAX_ERROR]}", file=sys.stderr, flush=True)
    elif event not in ("progress", "progress_state", "status", "execution_start", "execution_cached", "executing",
                       "executed", "execution_success", "progress_text"):
        print(f"  {event}: {json.dumps(data)[:300]}", file=sys.stderr, flush=True)


def _report(graph: dict, uis: dict) -> None:
    describe = None
    for node_id, ui in uis.items():
        title = graph[node_id].get("_meta", {}).get("title")
        print(f"[{node_id}] {graph[node_id]['class_type']}" + (f" ({title})" if title else ""))
        for key, values in ui.items():
            for value in values:
                if not isinstance(value, str) and describe is None:
                    from .core_nodes import describe  # only in-process outputs need it (and torch)
                text = value if isinstance(value, str) else describe(value)
                print(f"  {key}: " + text.replace("\n", "\n    "))


def read_graph(path: Path) -> dict:
    """The API graph in `path`, or a ValueError that names the file and what is wrong with it."""
    try:
        graph = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"graph file {str(path)!r} does not exist; give the path of an API-format graph "
                         "(ComfyUI: Workflow > Export (API))") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"graph file {str(path)!r} cannot be read ({err}); give a readable JSON file") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"graph file {str(path)!r} is not JSON ({err.msg} at line {err.lineno}); export the "
                         "graph again with Workflow > Export (API)") from None
    if not isinstance(graph, dict):
        raise ValueError(f"graph file {str(path)!r} holds a {type(graph).__name__}, not an object of nodes; "
                         "export the graph with Workflow > Export (API)")
    return graph


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headless",
                                     description="Run an API-format graph of this pack without a ComfyUI server.")
    parser.add_argument("graph", nargs="?", type=Path, default=DEFAULT_GRAPH, help="an API-format graph (JSON)")
    parser.add_argument("--out", type=Path, default=Path("output"), help="output folder (in-process runs)")
    parser.add_argument("--server", help="URL of a running ComfyUI, e.g. http://127.0.0.1:8188")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds without an event (--server)")
    parser.add_argument("--quiet", action="store_true", help="do not print the canvas per step")
    parser.add_argument("--models-dir", type=Path, help="folder of checkpoint folders (each holding config.json), "
                                                        "as ComfyUI's models/diffusiongemma: the Loader's model "
                                                        "names one of them (in-process runs)")
    args = parser.parse_args(argv)
    if not 0 < args.timeout < float("inf"):
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    try:
        graph = read_graph(args.graph)
        server = check_server_url(args.server) if args.server else None
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if server:
        code, outputs = submit(graph, server, args.timeout, _print_event)
        _report(graph, outputs)
        return code
    return _in_process(graph, args)


def _in_process(graph: dict, args) -> int:
    """Run the graph here; a node's failure is one line with its fix, never a traceback."""
    from ..nodes import host
    from .execute import NodeFailed, run_graph

    os.environ["DGEMMA_OUTPUT_DIR"] = str(args.out.resolve())
    if args.models_dir is not None:
        if not args.models_dir.is_dir():
            print(f"error: --models-dir {str(args.models_dir)!r} is not a folder; give the folder that holds the "
                  "checkpoint folders", file=sys.stderr)
            return 2
        os.environ["DGEMMA_MODELS_DIR"] = str(args.models_dir.resolve())
    if not args.quiet:
        host.listen(_print_step)
    before = _files(args.out)
    try:
        uis = run_graph(graph)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except NodeFailed as err:
        print(f"error: {_clip(str(err))}", file=sys.stderr)
        return 1
    _report(graph, uis)
    if _files(args.out) == before:
        print(f"note: nothing was written to {args.out}: this graph has no node that saves a file (SaveImage, "
              "Video Combine, DGemmaRunLogWriter); its results are the text above", file=sys.stderr)
    return 0


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR else text[:MAX_ERROR - 1] + "…"


def _files(folder: Path) -> set:
    return {(p, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()} if folder.is_dir() else set()
