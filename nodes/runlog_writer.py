"""DGemmaRunLogWriter: a run's trace, config, frames and readout as a dg-runlog/1 file."""

from __future__ import annotations

from ..dgemma.paths import shown_path
from ..dgemma.readouts.outfiles import target_folder
from ..dgemma.readouts.runlog import records, write_jsonl
from . import host
from .queue_check import HIDDEN, QueueChecked
from .schema import CANVAS_STATE, CANVAS_TRACE, CATEGORY, RUN_CONFIG, comfy_hints, widget_values


class DGemmaRunLogWriter(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "write"
    OUTPUT_NODE = True
    INPUT_IS_LIST = True  # frames arrives as the whole list, so every input does
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("log_path",)
    OUTPUT_TOOLTIPS = ("Path of the written .jsonl file.",)
    DESCRIPTION = ("Writes one run (wire all four inputs from the same sampler node) as JSON Lines, schema "
                   "dg-runlog/1: a header, one record per step, a final record. The file lands in ComfyUI's "
                   "output folder, numbered like SaveImage; it is written whole or not at all.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "canvas_trace": (CANVAS_TRACE, {"tooltip": "canvas_trace of the run."}),
                "run_config": (RUN_CONFIG, {"tooltip": "run_config of the same run."}),
                "frames": ("STRING", {"forceInput": True, "tooltip": "frames of the same run (the list)."}),
                "canvas_state": (CANVAS_STATE, {"tooltip": "canvas_state of the same run."}),
                "filename_prefix": ("STRING", {"default": "dgemma_run_log", "tooltip":
                                    "File name prefix inside the output folder; 'sub/name' makes a subfolder."}),
            },
            "hidden": HIDDEN,
        }

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """A bad prefix, refused when the graph is queued, before anything runs."""
        for prefix in widget_values(inputs.get("filename_prefix")):
            if prefix is None:  # linked: checked when the node runs
                continue
            try:
                target_folder(host.output_dir(), prefix)
            except ValueError as err:
                return str(err)
        return None

    def write(self, canvas_trace, run_config, frames, canvas_state, filename_prefix):
        with comfy_hints():
            rows = records(canvas_trace[0], run_config[0], canvas_state[0], list(frames))
        path = str(write_jsonl(rows, host.output_dir(), filename_prefix[0]))
        return {"ui": {"text": [shown_path(path)]}, "result": (path,)}
