"""The one bridge to ComfyUI: events, progress, interrupt, model and output folders.

Every ComfyUI import is lazy and optional, so the pack runs (and is tested) without ComfyUI:
events go nowhere, progress is silent, nothing interrupts, folders default to the working dir.
"""

from __future__ import annotations

import html
import os
import sys
import time
from pathlib import Path

from ..dgemma.paths import add_root
from .events import DONE

MODEL_FOLDER = "diffusiongemma"


_absent: set[str] = set()  # modules not found: an import that fails searches every path again (per step)


def comfy(module: str):
    found = sys.modules.get(module)
    if found is not None:
        return found
    if module in _absent:
        return None
    try:
        return __import__(module, fromlist=["_"])
    except ModuleNotFoundError:  # ComfyUI absent: degrade to no-ops
        _absent.add(module)
        return None
    except ImportError:  # a ComfyUI module that cannot be imported here: no-ops too
        return None


_listeners = []  # in-process consumers of events (the headless runner), beside the websocket


def _server():
    return getattr(getattr(comfy("server"), "PromptServer", None), "instance", None)


def listen(callback) -> None:
    _listeners.append(callback)


def live() -> bool:
    """Whether events reach anyone, so payloads are built only when they are used."""
    return bool(_listeners) or _server() is not None


def send(event: str, data: dict) -> None:
    """Send a websocket event to the client that queued the running prompt."""
    instance = _server()
    if instance is not None:
        instance.send_sync(event, data, instance.client_id)
    for callback in _listeners:
        callback(event, data)


def send_failed(stream, note, err: BaseException) -> None:
    """A live run ended by `err`: the stream's last event, and the progress text saying where it stopped."""
    ended = stream.failed(err)
    note.show(f"{ended['status']} after {ended['steps_used']} steps", force=True)
    send(DONE, ended)


class Progress:
    """ComfyUI's progress bar for one node, advanced to absolute values. Each update is two websocket
    messages the page handles, so it moves by at least 1/`moves` of the bar or after `every` seconds:
    a list of a thousand items takes tens of thousands of steps."""

    moves, every = 200, 0.1

    def __init__(self, total: int, node_id: str | None = None):
        utils = comfy("comfy.utils")
        self._bar = utils.ProgressBar(total, node_id=node_id) if utils else None
        self.total, self.shown, self.when = total, 0, float("-inf")

    def to(self, value: int, total: int | None = None) -> None:
        """Move to `value`; `total` resizes the bar (a run that ends before its budget)."""
        now = time.monotonic()
        resized = total is not None and total != self.total
        self.total = total if total is not None else self.total
        due = resized or value >= self.total or value - self.shown >= self.total / self.moves or \
            now - self.when >= self.every
        if self._bar is not None and due:
            if resized:
                self._bar.total = self.total
            self._bar.update_absolute(value, self.total)
            self.shown, self.when = value, now


# ComfyUI 0.8's frontend shows progress text as markup: the classic renderer puts it in a
# `word-break: break-all` box as HTML (newlines become <br>), the Vue renderer as Markdown. So the text
# is escaped (a token such as <pad> would vanish as a tag), each line ends in a Markdown hard break, and
# one span wraps at spaces again (a run without spaces, such as the canvas, still breaks where it must).
_WRAP_AT_SPACES = '<span style="word-break:normal;overflow-wrap:anywhere">'
_MARKDOWN = str.maketrans({c: f"&#{ord(c)};" for c in "\\*_`[]~#"})


def node_text(text: str) -> str:
    """`text` as the frontend's progress text: shown as written, lines kept, wrapped at spaces."""
    lines = html.escape(text, quote=False).translate(_MARKDOWN).split("\n")
    return _WRAP_AT_SPACES + "  \n".join(lines) + "</span>"


class ProgressText:
    """A short text shown on the node by ComfyUI itself (send_progress_text), which every renderer
    draws, at most once per `every` seconds so a fast model does not flood the websocket."""

    every = 0.25  # seconds

    def __init__(self, node_id):
        self.node_id, self.last = node_id, float("-inf")

    def show(self, text, force: bool = False) -> None:
        """Show `text` (or what the callable `text` makes, made only when it is shown)."""
        instance = _server()
        if instance is None or self.node_id is None or not hasattr(instance, "send_progress_text"):
            return
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            text = text() if callable(text) else text
            instance.send_progress_text(node_text(text), str(self.node_id), instance.client_id)


def on_prompt(handler) -> bool:
    """Have ComfyUI's server pass every queued prompt through `handler` (json -> json) before it is
    validated; False outside ComfyUI."""
    instance = _server()
    if instance is None or not hasattr(instance, "add_on_prompt_handler"):
        return False
    instance.add_on_prompt_handler(handler)
    return True


def prompt_handler(work):
    """An on-prompt handler (json -> json) that runs `work(graph)` on the queued prompt's graph, in place."""
    def handler(json_data):
        if isinstance(json_data, dict):
            work(json_data.get("prompt"))
        return json_data

    return handler


def unmade(message: str):
    """What an output that was not made holds: ComfyUI's ExecutionBlocker, so a node that reads it anyway
    stops with `message` instead of taking an empty value; None outside ComfyUI."""
    utils = comfy("comfy_execution.graph_utils")
    blocker = getattr(utils, "ExecutionBlocker", None)
    return blocker(message) if blocker is not None else None


def check_interrupt() -> bool:
    """Raise ComfyUI's own interrupt exception when the user pressed Cancel, so nothing partial is cached."""
    mm = comfy("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()
    return False


def register_model_folder() -> None:
    folder_paths = comfy("folder_paths")
    if folder_paths is not None:
        folder_paths.add_model_folder_path(MODEL_FOLDER, os.path.join(folder_paths.models_dir, MODEL_FOLDER))


def model_roots() -> list[Path]:
    folder_paths = comfy("folder_paths")
    if folder_paths is None:  # outside ComfyUI the headless runner may name one (--models-dir)
        named = os.environ.get("DGEMMA_MODELS_DIR")
        return [Path(named)] if named else []
    try:
        roots = [Path(p) for p in folder_paths.get_folder_paths(MODEL_FOLDER)]
    except KeyError:
        return []
    for root in roots:  # a checkpoint is shown relative to its models folder, never by its absolute path
        add_root(root, f"models/{MODEL_FOLDER}")
    return roots


def local_models() -> list[str]:
    """Names of the checkpoint folders (holding config.json) and GGUF files directly under the model folders."""
    names = set()
    for root in model_roots():
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if (p / "config.json").is_file()
                         or (p.suffix.lower() == ".gguf" and p.is_file()))
    return sorted(names)


def resolve_local_model(name: str) -> Path | None:
    """The folder for a listed name; a name is one path component, so it cannot escape the roots."""
    if not name or name in (".", "..") or Path(name).name != name or "/" in name or "\\" in name:
        raise ValueError(f"model folder name {name!r} must be a single folder name under models/{MODEL_FOLDER}")
    for root in model_roots():
        if (root / name / "config.json").is_file() or (name.lower().endswith(".gguf") and (root / name).is_file()):
            return root / name
    return None


LORA_FOLDER = "loras"


def lora_roots() -> list[Path]:
    """ComfyUI's models/loras; headless, `loras` beside and inside the --models-dir folder."""
    folder_paths = comfy("folder_paths")
    if folder_paths is None:
        named = os.environ.get("DGEMMA_MODELS_DIR")
        return [Path(named).parent / LORA_FOLDER, Path(named) / LORA_FOLDER] if named else []
    try:
        return [Path(p) for p in folder_paths.get_folder_paths(LORA_FOLDER)]
    except KeyError:
        return []


def _is_lora(path: Path) -> bool:
    if path.is_dir():
        return (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()
    return path.suffix.lower() == ".safetensors" and path.is_file()


def local_loras() -> list[str]:
    """PEFT adapter folders and single .safetensors files under the lora folders (paths relative to their
    root, '/'-separated, as ComfyUI lists loras in subfolders)."""
    names = set()
    for root in lora_roots():
        if root.is_dir():
            for path in root.rglob("*"):
                if _is_lora(path) and not _is_lora(path.parent):  # an adapter folder's own weights file
                    names.add(path.relative_to(root).as_posix())
    return sorted(names)


def resolve_lora(name: str) -> Path | None:
    """The adapter a listed name stands for; a name never leaves its root."""
    if not isinstance(name, str) or not name or name.startswith(("/", "\\")) or ".." in Path(name).parts:
        raise ValueError(f"lora name {name!r} must be a path under models/{LORA_FOLDER}, as listed")
    for root in lora_roots():
        path = root / name
        if _is_lora(path):
            return path
    return None


def output_dir() -> Path:
    folder_paths = comfy("folder_paths")
    if folder_paths is not None:
        found = Path(folder_paths.get_output_directory())
    else:
        found = Path(os.environ.get("DGEMMA_OUTPUT_DIR", "output")).resolve()
    add_root(found, "output")  # a file written there is shown as output/…
    return found
