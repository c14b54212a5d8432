"""DGemmaLoader: a checkpoint (shipped demo, local folder or hub id) into a DGEMMA_MODEL."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from ..dgemma.demo import DEMO_DIR, DEMO_NAME, demo_available
from ..dgemma.loading import DEFAULT_HUB_ID, DEVICES, DTYPES, load_model
from ..dgemma.preflight import short
from ..dgemma.quant import QUANTS
from . import host
from .schema import CATEGORY, MODEL

HUB_IDS = (DEFAULT_HUB_ID, "Intel/diffusiongemma-26B-A4B-it-int4-AutoRound")

log = logging.getLogger("dgemma")


def model_choices() -> list[str]:
    """Real local checkpoints first, then the demo model, then the hub ids."""
    choices = host.local_models()
    if demo_available() and DEMO_NAME not in choices:
        choices.append(DEMO_NAME)
    return choices + [h for h in HUB_IDS if h not in choices]


def resolve_choice(choice: str) -> str:
    if choice in HUB_IDS:
        return choice
    if choice == DEMO_NAME and demo_available():
        return str(DEMO_DIR)
    folder = host.resolve_local_model(choice)
    if folder is None:
        raise ValueError(f"model {choice!r} is not a folder with config.json under models/{host.MODEL_FOLDER}; "
                         f"put the checkpoint folder there or pick one of {model_choices()}")
    return str(folder)


def check_inputs(quant, model, device, dtype, local_files_only, after_run="keep") -> None:
    """ComfyUI's UI sends list values, but API prompts and scripts can send anything: refuse wrong types."""
    for name, value, choices in (("quant", quant, QUANTS), ("device", device, DEVICES), ("dtype", dtype, DTYPES),
                                 ("after_run", after_run, host.AFTER_RUN)):
        if not isinstance(value, str):
            raise ValueError(f"Loader input {name} must be text, got {short(value)} ({type(value).__name__}); "
                             f"pick one of {choices}")
    if after_run not in host.AFTER_RUN:
        raise ValueError(f"Loader input after_run is {short(after_run)}; pick one of {host.AFTER_RUN}")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"Loader input model must be text, got {short(model)} ({type(model).__name__}); pick a "
                         f"folder under models/{host.MODEL_FOLDER} or a hub id such as {DEFAULT_HUB_ID!r}")
    if not isinstance(local_files_only, bool):
        raise ValueError(f"Loader input local_files_only must be true or false, got {short(local_files_only)} "
                         f"({type(local_files_only).__name__}); set it to true or false")


class DGemmaLoader:
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The loaded model; it lives only in this output, so freeing ComfyUI's node cache frees it.",)
    DESCRIPTION = ("Loads DiffusionGemma through transformers (safetensors, no remote code): the real 26B model "
                   "from a folder under models/diffusiongemma or the hub, or the tiny demo model shipped with the "
                   "pack, which runs on any CPU.")

    @classmethod
    def INPUT_TYPES(cls):
        choices = model_choices()
        return {
            "required": {
                "quant": (list(QUANTS), {"default": "none", "tooltip":
                          "none: the checkpoint's own dtype (bf16, about 54 GB for the real model); "
                          "autoround: a pre-quantized AutoRound INT4 checkpoint (about 30 GB, needs auto-round)."}),
            },
            "optional": {
                "model": (choices, {"default": choices[0], "tooltip":
                          "Checkpoint: a folder under models/diffusiongemma, the shipped demo model, or a hub id "
                          "(downloaded on first use)."}),
                "device": (list(DEVICES), {"default": "auto", "tooltip":
                           "auto: the GPU when there is one, offloading to CPU RAM when VRAM is short; "
                           "cuda: all on the GPU; cpu: all on the CPU."}),
                "dtype": (list(DTYPES), {"default": "auto", "tooltip":
                          "Weight dtype; auto keeps the checkpoint's own (bfloat16 for the real model)."}),
                "local_files_only": ("BOOLEAN", {"default": False, "tooltip":
                                     "Never contact the hub: load a hub id only from the local HF cache."}),
                "after_run": (list(host.AFTER_RUN), {"default": "keep", "tooltip": host.AFTER_RUN_TOOLTIP}),
            },
        }

    def load(self, quant, model=None, device="auto", dtype="auto", local_files_only=False, after_run="keep"):
        check_inputs(quant, model, device, dtype, local_files_only, after_run)
        source = resolve_choice(model or model_choices()[0])
        host.check_interrupt()

        def load(should_cancel=None):
            with quiet_load_bars():
                return load_model(source, quant=quant, dtype=dtype, device=device,
                                  local_files_only=local_files_only, should_cancel=should_cancel)

        loaded = load(host.check_interrupt)
        if loaded.placement_note:  # a split pays PCIe traffic every step: say so where the user looks
            log.warning("DiffusionGemma %s", loaded.placement_note)
        host.manage(loaded, after_run, reload=load)
        return (loaded,)


@contextmanager
def quiet_load_bars():
    """transformers prints a "Loading weights" bar per load into the server log; keep it quiet."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
