"""DGemmaTrace: a heatmap of a run (committed mask or entropy, positions x steps) and a summary."""

from __future__ import annotations

import torch

from ..dgemma.readouts.heatmap import CELL_PX_DEFAULT, CELL_PX_MAX, MODES, SCALES, heatmap, summary
from .schema import CANVAS_TRACE, CATEGORY, comfy_hints


class DGemmaTrace:
    CATEGORY = CATEGORY
    FUNCTION = "render"
    RETURN_TYPES = ("IMAGE", "STRING")
    RETURN_NAMES = ("heatmap", "summary")
    OUTPUT_TOOLTIPS = ("Rows are executed steps (blocks stacked, boundaries marked), columns canvas positions.",
                       "Readable account of the run with the heatmap's legend and scale.")
    DESCRIPTION = ("Reads a canvas_trace after the run: commit mode shows which positions the scheduler "
                   "committed at each step (the real committed mask), entropy mode the entropy of the "
                   "distribution it committed from, on a fixed scale so runs compare.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "canvas_trace": (CANVAS_TRACE, {"tooltip": "The canvas_trace output of a sampler node."}),
                "mode": (list(MODES), {"default": MODES[0], "tooltip":
                         "commit: committed (bright) vs renoised (dark) per step; entropy: nats of logits / T."}),
                "cell_px": ("INT", {"default": CELL_PX_DEFAULT, "min": 1, "max": CELL_PX_MAX, "step": 1, "tooltip":
                            "Pixels per cell (positions x steps), nearest-neighbour."}),
            },
            "optional": {
                "scale": (list(SCALES), {"default": SCALES[0], "tooltip":
                          "Entropy mode's colour scale: fixed (0 to ln 262144 nats, runs compare) or this run "
                          "(0 to the run's highest entropy: shows a confident model's small entropies)."}),
            },
        }

    def render(self, canvas_trace, mode=MODES[0], cell_px=CELL_PX_DEFAULT, scale=SCALES[0]):
        with comfy_hints():
            image = heatmap(canvas_trace, mode, cell_px, scale)
        return (torch.from_numpy(image), summary(canvas_trace, mode, scale))
