"""The one bridge to ComfyUI: events, progress, interrupt, model and output folders.

Every ComfyUI import is lazy and optional, so the pack runs (and is tested) without ComfyUI:
events go nowhere, progress is silent, nothing interrupts, folders default to the working dir.
"""

from __future__ import annotations

import os
import time
import weakref
from contextlib import contextmanager
from pathlib import Path

from ..dgemma.errors import InputError

MODEL_FOLDER = "diffusiongemma"


def _comfy(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except Exception:  # ComfyUI absent (or broken): degrade to no-ops
        return None


_listeners = []  # in-process consumers of events (the headless runner), beside the websocket


def _server():
    return getattr(getattr(_comfy("server"), "PromptServer", None), "instance", None)


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


class Progress:
    """ComfyUI's progress bar for one node, advanced to absolute values."""

    def __init__(self, total: int, node_id: str | None = None):
        utils = _comfy("comfy.utils")
        self._bar = utils.ProgressBar(total, node_id=node_id) if utils else None

    def to(self, value: int) -> None:
        if self._bar is not None:
            self._bar.update_absolute(value)


class ProgressText:
    """A short text shown on the node by ComfyUI itself (send_progress_text), which every renderer
    draws, at most once per `every` seconds so a fast model does not flood the websocket."""

    every = 0.25  # seconds

    def __init__(self, node_id):
        self.node_id, self.last = node_id, float("-inf")

    def show(self, text: str, force: bool = False) -> None:
        instance = _server()
        if instance is None or self.node_id is None or not hasattr(instance, "send_progress_text"):
            return
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            instance.send_progress_text(text, str(self.node_id), instance.client_id)


def check_interrupt() -> bool:
    """Raise ComfyUI's own interrupt exception when the user pressed Cancel, so nothing partial is cached."""
    mm = _comfy("comfy.model_management")
    if mm is not None:
        mm.throw_exception_if_processing_interrupted()
    return False


def register_model_folder() -> None:
    folder_paths = _comfy("folder_paths")
    if folder_paths is not None:
        folder_paths.add_model_folder_path(MODEL_FOLDER, os.path.join(folder_paths.models_dir, MODEL_FOLDER))


def model_roots() -> list[Path]:
    folder_paths = _comfy("folder_paths")
    if folder_paths is None:  # outside ComfyUI the headless runner may name one (--models-dir)
        named = os.environ.get("DGEMMA_MODELS_DIR")
        return [Path(named)] if named else []
    try:
        return [Path(p) for p in folder_paths.get_folder_paths(MODEL_FOLDER)]
    except KeyError:
        return []


def local_models() -> list[str]:
    """Names of the checkpoint folders (holding config.json) directly under the model folders."""
    names = set()
    for root in model_roots():
        if root.is_dir():
            names.update(p.name for p in root.iterdir() if (p / "config.json").is_file())
    return sorted(names)


def resolve_local_model(name: str) -> Path | None:
    """The folder for a listed name; a name is one path component, so it cannot escape the roots."""
    if not name or name in (".", "..") or Path(name).name != name or "/" in name or "\\" in name:
        raise ValueError(f"model folder name {name!r} must be a single folder name under models/{MODEL_FOLDER}")
    for root in model_roots():
        if (root / name / "config.json").is_file():
            return root / name
    return None


def output_dir() -> Path:
    folder_paths = _comfy("folder_paths")
    if folder_paths is not None:
        return Path(folder_paths.get_output_directory())
    return Path(os.environ.get("DGEMMA_OUTPUT_DIR", "output")).resolve()


# --- GPU memory: the loaded model takes part in ComfyUI's model management ------------------------

AFTER_RUN = ("keep", "offload to CPU", "unload")
AFTER_RUN_TOOLTIP = ("What happens to the weights after a run (after the last item of a list run, never "
                     "between items): keep them where they are (ComfyUI still offloads them when another model "
                     "needs the VRAM), offload to CPU RAM (back on the GPU at the next run), or unload them "
                     "from memory (read again from disk at the next run).")
_HANDLER = "diffusiongemma.after_run"
_ends_reported = False


class _Held:
    """What the host keeps beside one loaded model: its ComfyUI patcher, policy and reloader."""

    def __init__(self, patcher, after_run: str, reload, home):
        self.patcher, self.after_run, self.reload = patcher, after_run, reload
        self.home = home  # the one device of the weights; None when accelerate split them
        self.unloaded = False
        self.pending: set[str] = set()  # node ids whose runs end with the policy


_held: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DGemmaModel -> _Held


def _weights_module(model):
    """ModelPatcher writes `device` and bookkeeping attributes onto the module it manages; a
    transformers model's `device` is read-only, so it manages a plain holder of the model instead."""
    import torch

    class DiffusionGemmaWeights(torch.nn.Module):
        def __init__(self, inner, device):
            super().__init__()
            self.inner = inner
            self.device = device

    return DiffusionGemmaWeights(model, next(model.parameters()).device)


def manage(dm, after_run: str = "keep", reload=None) -> None:
    """Register a freshly loaded model with ComfyUI's model management (when present and when its
    weights sit on one device; a GPU/CPU split by accelerate stays where it was placed)."""
    mm, mp = _comfy("comfy.model_management"), _comfy("comfy.model_patcher")
    patcher = None
    devices = {p.device for p in dm.model.parameters()}
    home = devices.pop() if len(devices) == 1 else None
    if mm is not None and mp is not None and home is not None:
        import torch

        patcher = mp.ModelPatcher(_weights_module(dm.model), load_device=home, offload_device=torch.device("cpu"))
        mm.load_models_gpu([patcher], force_full_load=True)
    _held[dm] = _Held(patcher, after_run, reload, home)


def _record(dm) -> _Held | None:
    try:
        return _held.get(dm)
    except TypeError:  # not a loaded model at all: the engine's own check names it
        return None


def model_ready(dm) -> None:
    """Before a run: weights back from an unload, then on the GPU through ComfyUI's loader, which
    frees VRAM held by other models if needed."""
    held = _record(dm)
    if held is None:
        return
    if held.unloaded:
        fresh = held.reload()
        if fresh.identity != dm.identity:
            raise InputError("model", f"the checkpoint at {dm.source!r} changed on disk since it was loaded "
                                      f"({dm.identity} then, {fresh.identity} now), so its unloaded weights are not "
                                      "read back from it; load it again with DGemmaLoader (in ComfyUI: Free model "
                                      "and node cache, then queue)")
        _transplant(dm.model, fresh.model)
        held.unloaded = False
    if held.patcher is not None:
        _comfy("comfy.model_management").load_models_gpu([held.patcher], force_full_load=True)
    elif held.home is not None:
        dm.model.to(held.home)  # no ComfyUI: back from an offload by hand


def run_finished(dm, node_id, failed: bool = False) -> None:
    """After one call of a node: the policy waits until the node has finished every list item
    (a failed call ends the node, so it applies at once)."""
    held = _record(dm)
    if held is None or held.after_run == "keep" or held.home is None:  # a GPU/CPU split stays as placed
        return
    held.pending.add(str(node_id))
    if failed or not _watch_node_ends():
        node_finished(node_id)  # no executor to tell us: a call is the whole node


@contextmanager
def reporting_node_ends():
    """For an in-process executor (the headless runner) that calls node_finished itself."""
    global _ends_reported
    saved, _ends_reported = _ends_reported, True
    try:
        yield
    finally:
        _ends_reported = saved


def node_finished(node_id) -> None:
    """A node finished (all its list items, or it failed): apply the after-run policy it owes."""
    for dm, held in list(_held.items()):
        if str(node_id) in held.pending:
            held.pending.discard(str(node_id))
            if not held.pending:
                _after_run(dm, held)


def _after_run(dm, held) -> None:
    if held.patcher is not None:
        _evict(_comfy("comfy.model_management"), held.patcher)
    elif held.after_run == "offload to CPU":
        dm.model.to("cpu")
    if held.after_run == "unload" and held.reload is not None:
        dm.model.to("meta")  # frees RAM too; the same module gets fresh tensors at the next run
        held.unloaded = True


def _evict(mm, patcher) -> None:
    """Unload one model the way ComfyUI's free_memory does: detach it to its offload device."""
    for i, loaded in enumerate(mm.current_loaded_models):
        if loaded.model is patcher:
            loaded.model_unload()
            mm.current_loaded_models.pop(i)
            mm.soft_empty_cache()
            return


def _transplant(shell, fresh) -> None:
    """Give every module of `shell` the tensors of the same module in `fresh` (ties included)."""
    for name, module in fresh.named_modules():
        target = shell.get_submodule(name)
        target._parameters.update(module._parameters)
        target._buffers.update(module._buffers)


class _NodeEnds:
    """A ComfyUI progress handler that is told when each node of the prompt finishes."""

    name, enabled = _HANDLER, True

    def set_registry(self, registry):
        pass

    def start_handler(self, node_id, state, prompt_id):
        pass

    def update_handler(self, node_id, value, max_value, state, prompt_id, image=None):
        pass

    def finish_handler(self, node_id, state, prompt_id):
        node_finished(node_id)

    def reset(self):  # the next prompt starts: what a stopped prompt left pending is dropped
        for held in _held.values():
            held.pending.clear()

    def enable(self):
        self.enabled = True

    def disable(self):
        self.enabled = False


def _watch_node_ends() -> bool:
    """Hear when nodes finish in the running prompt (ComfyUI makes a progress registry per prompt)."""
    if _ends_reported:
        return True
    progress = _comfy("comfy_execution.progress")
    if progress is None:
        return False
    registry = progress.get_progress_state()
    if _HANDLER not in registry.handlers:
        registry.register_handler(_NodeEnds())
    return True
