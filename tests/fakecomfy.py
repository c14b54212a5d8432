"""Stand-ins for the ComfyUI modules the host adapter imports, recording what the pack does."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager


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

    def steps(self) -> list[dict]:
        return [data for event, data, _ in self.events if event == "dgemma.step"]


@contextmanager
def installed(tmp_path):
    """Put fake `server`, `comfy.*` and `folder_paths` modules in sys.modules for the block."""
    rec = Recorder(tmp_path)

    class Instance:
        client_id = "client-1"

        def send_sync(self, event, data, sid=None):
            rec.events.append((event, data, sid))
            if event == "dgemma.step" and rec.interrupt_after_steps == len(rec.steps()):
                rec.interrupt = True

    class ProgressBar:
        def __init__(self, total, node_id=None):
            self.total = total

        def update_absolute(self, value, total=None, preview=None):
            rec.progress.append((value, self.total))

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
    fp = types.ModuleType("folder_paths")
    fp.models_dir = str(rec.models_dir)
    fp.add_model_folder_path = lambda name, path: rec.folders.setdefault(name, []).append(path)
    fp.get_folder_paths = lambda name: list(rec.folders[name])
    fp.get_output_directory = lambda: str(rec.output_dir)
    modules = {"server": server, "comfy": comfy, "comfy.utils": utils, "comfy.model_management": mm,
               "folder_paths": fp}
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield rec
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
