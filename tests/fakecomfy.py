"""Stand-ins for the ComfyUI modules the host adapter imports, recording what the pack does."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

import torch


class InterruptProcessingException(Exception):
    pass


class Recorder:
    def __init__(self, tmp_path):
        self.events: list[tuple[str, dict, object]] = []
        self.progress: list[tuple[int, int]] = []
        self.interrupt = False
        self.interrupt_after_steps: int | None = None
        self.models_dir = tmp_path / "models"
        self.output_dir = tmp_path / "output"
        self.folders: dict[str, list[str]] = {}
        self.memory: list[tuple[str, str]] = []  # ("load" | "unload", model class name), in order
        self.text: list[tuple[str, str]] = []    # send_progress_text calls: (node id, text)
        self.registry = None                      # comfy_execution.progress's registry of the prompt
        self.prompt_handlers: list = []           # the server's on-prompt handlers, in order
        self.device = "cpu"                       # what get_torch_device names (a test may name "cuda:1")
        self.vram = (0, 0)                        # (free, total) bytes get_free_memory / get_total_memory give

    def steps(self) -> list[dict]:
        return [data for event, data, _ in self.events if event == "dgemma.step"]


@contextmanager
def installed(tmp_path):
    """Put fake `server`, `comfy.*` and `folder_paths` modules in sys.modules for the block."""
    rec = Recorder(tmp_path)

    class Instance:
        client_id = "client-1"

        def add_on_prompt_handler(self, handler):
            rec.prompt_handlers.append(handler)

        def send_progress_text(self, text, node_id, sid=None):
            rec.text.append((str(node_id), text))

        def send_sync(self, event, data, sid=None):
            rec.events.append((event, data, sid))
            if event == "dgemma.step" and rec.interrupt_after_steps == len(rec.steps()):
                rec.interrupt = True

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            rec.progress.append((value, total or self.total))

    def throw_exception_if_processing_interrupted():
        if rec.interrupt:
            rec.interrupt = False
            raise InterruptProcessingException()

    server = types.ModuleType("server")
    server.PromptServer = types.SimpleNamespace(instance=Instance())
    comfy = types.ModuleType("comfy")
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = ProgressBar
    mm = types.ModuleType("comfy.model_management")
    mm.InterruptProcessingException = InterruptProcessingException
    mm.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
    comfy.utils, comfy.model_management = utils, mm
    mm.__dict__.update(_model_management(rec))
    patcher = types.ModuleType("comfy.model_patcher")
    patcher.ModelPatcher = _patcher_class(rec)
    comfy.model_patcher = patcher
    execution = types.ModuleType("comfy_execution")
    progress = types.ModuleType("comfy_execution.progress")
    progress.get_progress_state = lambda: rec.registry
    rec.registry = Registry()
    execution.progress = progress
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(rec.models_dir)
    fp.add_model_folder_path = lambda name, path: rec.folders.setdefault(name, []).append(path)
    fp.get_folder_paths = lambda name: list(rec.folders[name])
    fp.get_output_directory = lambda: str(rec.output_dir)
    modules = {"server": server, "comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm,
               "comfy.model_patcher": patcher, "comfy_execution": execution, "comfy_execution.progress": progress,
               "folder_paths": fp}
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield rec
    finally:
        from diffusiongemma.nodes import memory

        memory._owed.clear()  # what a test's prompt still owed when it ended is never told elsewhere
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class Registry:
    """comfy_execution.progress's per-prompt registry: handlers hear when each node finishes."""

    def __init__(self):
        self.handlers: dict = {}

    def register_handler(self, handler):
        self.handlers[handler.name] = handler

    def finish_progress(self, node_id):
        for handler in list(self.handlers.values()):
            if handler.enabled:
                handler.finish_handler(node_id, {"state": "finished"}, "prompt-1")

    def new_prompt(self):
        """What ComfyUI does at a prompt's start: reset the handlers, then a fresh registry."""
        for handler in self.handlers.values():
            handler.reset()
        self.handlers = {}


def _patcher_class(rec):
    class ModelPatcher:
        """comfy.model_patcher.ModelPatcher's part the pack uses: load to / detach from a device."""

        def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
            self.model, self.load_device, self.offload_device = model, load_device, offload_device
            self.size = size
            self.parent = None
            if getattr(model, "device", None) is None:
                model.device = offload_device

        def load(self, device_to):
            self.model.to(device_to)
            self.model.device = device_to
            rec.memory.append(("load", type(self.model).__name__))

        def detach(self, unpatch_all=True):
            self.model.to(self.offload_device)
            self.model.device = self.offload_device
            rec.memory.append(("unload", type(self.model).__name__))
            return self.model

        def current_loaded_device(self):
            return self.model.device

        def model_size(self):
            return self.size

    return ModelPatcher


def _model_management(rec) -> dict:
    """comfy.model_management's loaded-model list with its load, free and unload functions."""
    current = []

    class LoadedModel:
        def __init__(self, patcher):
            self.model, self.device = patcher, patcher.load_device

        def model_unload(self, memory_to_free=None, unpatch_weights=True):
            self.model.detach(unpatch_weights)
            return True

    def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                        force_full_load=False):
        for patcher in models:
            if any(loaded.model is patcher for loaded in current):
                continue  # already loaded: nothing moves
            patcher.load(patcher.load_device)
            current.insert(0, LoadedModel(patcher))

    def free_memory(memory_required, device, keep_loaded=()):
        """Another model needs the device: unload everything else there (the fake has no sizes)."""
        rec.memory.append(("free", f"{memory_required} on {device}"))
        freed = [m for m in current if device in (None, m.device) and m not in keep_loaded]
        for loaded in freed:
            loaded.model_unload()
            current.remove(loaded)
        return freed

    return {"current_loaded_models": current, "load_models_gpu": load_models_gpu, "free_memory": free_memory,
            "loaded_models": lambda only_currently_used=False: [m.model for m in current],
            "soft_empty_cache": lambda force=False: None,
            "unload_all_models": lambda: free_memory(1e30, None),
            "get_torch_device": lambda: torch.device(rec.device),
            "get_free_memory": lambda dev=None, torch_free_too=False: rec.vram[0],
            "get_total_memory": lambda dev=None, torch_free_too=False: rec.vram[1]}


def cache_key(graph: dict, node_id: str, classes: dict) -> str:
    """ComfyUI 0.8's key of a node's cached outputs (comfy_execution/caching.py, the input signature):
    its class, IS_CHANGED (none of these nodes has one), its id when it declares UNIQUE_ID, and every input
    in name order, a link standing for its ancestor's place in the ordered ancestry, then each ancestor's."""
    from diffusiongemma.runner.graph import is_link

    ancestors: list[str] = []

    def walk(nid):
        inputs = graph[nid]["inputs"]
        for name in sorted(inputs):
            if is_link(inputs[name]) and inputs[name][0] not in ancestors:
                ancestors.append(inputs[name][0])
                walk(inputs[name][0])

    def immediate(nid):
        node = graph[nid]
        key = [node["class_type"], False]
        if "UNIQUE_ID" in classes[node["class_type"]].INPUT_TYPES().get("hidden", {}).values():
            key.append(nid)
        for name in sorted(node["inputs"]):
            value = node["inputs"][name]
            key.append((name, ("ANCESTOR", ancestors.index(value[0]), value[1]) if is_link(value) else value))
        return key

    walk(node_id)
    return repr([immediate(node_id)] + [immediate(a) for a in ancestors])


class CachingExecutor:
    """Queues API graphs as ComfyUI's server does: the on-prompt handlers first, then each node run unless
    its cache key holds outputs already; `ran` lists the nodes each queue executed."""

    def __init__(self, rec, classes: dict):
        self.rec, self.classes, self.cache, self.ran = rec, classes, {}, []

    def queue(self, graph: dict) -> dict:
        from diffusiongemma.runner import execute

        data = {"prompt": graph}
        for handler in self.rec.prompt_handlers:
            data = handler(data)
        graph, results, listed, ran = data["prompt"], {}, {}, []
        for node_id in execute.execution_order(graph, self.classes):
            key = cache_key(graph, node_id, self.classes)
            if key not in self.cache:
                self.cache[key] = self._run(graph, node_id, results, listed)
                ran.append(node_id)
            results[node_id], listed[node_id] = self.cache[key]
        self.ran.append(ran)
        return results

    def _run(self, graph, node_id, results, listed):
        from diffusiongemma.runner import execute

        cls = self.classes[graph[node_id]["class_type"]]
        kwargs, is_list = {}, {}
        for name, value in graph[node_id]["inputs"].items():
            if name in {**cls.INPUT_TYPES().get("required", {}), **cls.INPUT_TYPES().get("optional", {})}:
                linked = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
                kwargs[name] = results[value[0]][value[1]] if linked else value
                is_list[name] = listed[value[0]][value[1]] if linked else False
        hidden = execute.hidden_values(cls, node_id, graph)
        outs = [execute.call_node(cls, c, hidden)[0] for c in execute._calls(cls, kwargs, is_list)]
        as_list = getattr(cls, "OUTPUT_IS_LIST", (False,) * len(cls.RETURN_TYPES))
        if len(outs) == 1:
            return outs[0], as_list
        return tuple(zip(*outs)), (True,) * len(cls.RETURN_TYPES)
