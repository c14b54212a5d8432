"""The loaded model in ComfyUI's model management: weights ready before a run, the after-run policy after.

`running(dm, node_id)` is the one lifecycle every node that runs the model uses (Sampler, Encode).
Without ComfyUI the policy still applies by hand (offload, unload) and nothing else happens.
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager

from ..dgemma.errors import InputError
from ..dgemma.loading import machine, preflight
from .host import comfy

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


def host_machine() -> machine.Machine:
    """The machine a load plans on: inside ComfyUI its device, its free memory and its freeing of other models
    (so a load makes room as ComfyUI's own loaders do); torch's own figures without ComfyUI."""
    mm = comfy("comfy.model_management")
    if mm is None:
        return machine.torch_machine()
    device = mm.get_torch_device()
    gpu = f"cuda:{machine.gpu_index(str(device))}" if device.type == "cuda" else None
    return machine.Machine(gpu, lambda d: preflight.free_ram() if d.type == "cpu" else mm.get_free_memory(d),
                           lambda d: mm.get_total_memory(d) if d.type != "cpu" else 0,
                           lambda need, d: mm.free_memory(need, d))


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
    mm, mp = comfy("comfy.model_management"), comfy("comfy.model_patcher")
    patcher = None
    devices = {p.device for p in dm.model.parameters()}
    home = devices.pop() if len(devices) == 1 else None
    if mm is not None and mp is not None and home is not None:
        import torch

        patcher = mp.ModelPatcher(_weights_module(dm.model), load_device=home, offload_device=torch.device("cpu"),
                                  size=machine.held_bytes(dm.model))  # ties once: ComfyUI's own sum counts both
        mm.load_models_gpu([patcher], force_full_load=True)
    _held[dm] = _Held(patcher, after_run, reload, home)


def _root(dm):
    """The loaded model under a LoRA view: the view shares its weights, so it shares their management."""
    return getattr(dm, "base", None) or dm


def _record(dm) -> _Held | None:
    try:
        return _held.get(_root(dm))
    except TypeError:  # not a loaded model at all: the engine's own check names it
        return None


def model_ready(dm) -> None:
    """Before a run: weights back from an unload, then on the GPU through ComfyUI's loader, which
    frees VRAM held by other models if needed."""
    held = _record(dm)
    if held is None:
        return
    dm = _root(dm)
    if held.unloaded:
        fresh = held.reload()
        if fresh.identity != dm.identity:
            raise InputError("model", f"the checkpoint at {dm.shown!r} changed on disk since it was loaded "
                                      f"({dm.identity} then, {fresh.identity} now), so its unloaded weights are not "
                                      "read back from it; load it again with DGemmaLoader (in ComfyUI: Free model "
                                      "and node cache, then queue)")
        _transplant(dm.model, fresh.model)
        held.unloaded = False
    if held.patcher is not None:
        comfy("comfy.model_management").load_models_gpu([held.patcher], force_full_load=True)
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


_owed: dict[str, list] = {}  # node id -> what to do once it has returned (its outputs cached)


def when_returned(node_id, then) -> None:
    """Call `then()` once node `node_id` has returned and the executor has its outputs; at once where no
    executor tells us (a direct call: the caller returns right after)."""
    if node_id is None or not _watch_node_ends():
        then()
        return
    _owed.setdefault(str(node_id), []).append(then)


def node_finished(node_id) -> None:
    """A node finished (all its list items, or it failed): apply the after-run policy it owes."""
    for then in _owed.pop(str(node_id), ()):
        then()
    for dm, held in list(_held.items()):
        if str(node_id) in held.pending:
            held.pending.discard(str(node_id))
            if not held.pending:
                _after_run(dm, held)


def _after_run(dm, held) -> None:
    if held.patcher is not None:
        _evict(comfy("comfy.model_management"), held.patcher)
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
        for node_id in list(_owed):  # a node that ended untold still says so, late rather than never
            for then in _owed.pop(node_id, ()):
                then()

    def enable(self):
        self.enabled = True

    def disable(self):
        self.enabled = False


def _watch_node_ends() -> bool:
    """Hear when nodes finish in the running prompt (ComfyUI makes a progress registry per prompt)."""
    if _ends_reported:
        return True
    progress = comfy("comfy_execution.progress")
    if progress is None:
        return False
    registry = progress.get_progress_state()
    if _HANDLER not in registry.handlers:
        registry.register_handler(_NodeEnds())
    return True


class Lease:
    """One run's hold on the weights; `keep()` leaves them in place (a paused canvas resumes on them)."""

    def __init__(self):
        self.kept = False

    def keep(self) -> None:
        self.kept = True


@contextmanager
def running(dm, node_id):
    """Weights ready before the body; after it the after-run policy (at once when it raised)."""
    model_ready(dm)
    lease = Lease()
    try:
        yield lease
    except BaseException:
        run_finished(dm, node_id, failed=True)
        raise
    if not lease.kept:
        run_finished(dm, node_id)
