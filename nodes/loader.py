"""DGemmaLoader: a checkpoint (shipped demo, local folder or hub id) into a DGEMMA_MODEL."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from ..dgemma.demo import DEMO_DIR, DEMO_NAME, demo_available
from ..dgemma.errors import InputError, short
from ..dgemma.loading.load import DEFAULT_HUB_ID, load_model
from ..dgemma.loading.load_options import DEVICES, DTYPES, LOAD_OPTIONS
from ..dgemma.loading.quant import QUANTS
from ..dgemma.paths import scrub
from . import host, memory
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
        raise ValueError(f"model {choice!r} is not a folder with config.json nor a .gguf file under "
                         f"models/{host.MODEL_FOLDER}; "
                         f"put the checkpoint folder there or pick one of {model_choices()}")
    return str(folder)


def check_inputs(quant, model, device, dtype, local_files_only, after_run="keep") -> None:
    """ComfyUI's UI sends list values, but API prompts and scripts can send anything: refuse wrong types."""
    for name, value, choices in (("quant", quant, QUANTS), ("device", device, DEVICES), ("dtype", dtype, DTYPES),
                                 ("after_run", after_run, memory.AFTER_RUN)):
        if not isinstance(value, str):
            raise ValueError(f"Loader input {name} must be text, got {short(value)} ({type(value).__name__}); "
                             f"pick one of {choices}")
    if after_run not in memory.AFTER_RUN:
        raise ValueError(f"Loader input after_run is {short(after_run)}; pick one of {memory.AFTER_RUN}")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"Loader input model must be text, got {short(model)} ({type(model).__name__}); pick a "
                         f"folder under models/{host.MODEL_FOLDER} or a hub id such as {DEFAULT_HUB_ID!r}")
    if not isinstance(local_files_only, bool):
        raise ValueError(f"Loader input local_files_only must be true or false, got {short(local_files_only)} "
                         f"({type(local_files_only).__name__}); set it to true or false")


def option_input(name: str) -> tuple:
    """A widget from the loader's one table of options (dgemma/loading/load_options.py)."""
    option = LOAD_OPTIONS[name]
    kind = "BOOLEAN" if option.choices is None else list(option.choices)
    return (kind, {"default": option.default, "tooltip": option.tooltip})


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
                "quant": option_input("quant"),
            },
            "optional": {
                "model": (choices, {"default": choices[0], "tooltip":
                          "Checkpoint: a folder or a .gguf file under models/diffusiongemma, the shipped demo model, "
                          "or a hub id (downloaded on first use)."}),
                **{name: option_input(name) for name in ("device", "dtype", "local_files_only")},
                "after_run": (list(memory.AFTER_RUN), {"default": "keep", "tooltip": memory.AFTER_RUN_TOOLTIP}),
            },
        }

    def load(self, quant, model=None, device="auto", dtype="auto", local_files_only=False, after_run="keep"):
        try:
            return self._load(quant, model, device, dtype, local_files_only, after_run)
        except ValueError as err:  # the engine names the folder it read: shown without the disk's layout
            if isinstance(err, InputError) or scrub(err) == str(err):
                raise
            raise ValueError(scrub(err)) from None

    def _load(self, quant, model, device, dtype, local_files_only, after_run):
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
        memory.manage(loaded, after_run, reload=load)
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
