"""DGemmaLoraLoader: a LoRA adapter (PEFT's format) over a DGEMMA_MODEL, as a new model over the same weights."""

from __future__ import annotations

from ..dgemma.demo import DEMO_LORA_DIR, DEMO_LORA_NAME
from ..dgemma.errors import InputError, short
from ..dgemma.loading.lora import adapt, check_strength, read_adapter
from ..dgemma.payloads import DGemmaModel
from . import host
from .schema import CATEGORY, MODEL


def lora_choices() -> list[str]:
    """The adapters under models/loras, then the demo's digits adapter shipped with the pack."""
    choices = host.local_loras()
    if (DEMO_LORA_DIR / "adapter_config.json").is_file() and DEMO_LORA_NAME not in choices:
        choices.append(DEMO_LORA_NAME)
    return choices


def resolve_lora(choice) -> str:
    if choice == DEMO_LORA_NAME and DEMO_LORA_NAME not in host.local_loras():
        return str(DEMO_LORA_DIR)
    path = host.resolve_lora(choice)
    if path is None:
        raise InputError("lora", f"lora {short(choice)} is neither a PEFT adapter folder (adapter_config.json + "
                                 f"adapter_model.safetensors) nor a .safetensors file under models/"
                                 f"{host.LORA_FOLDER}; pick one of {lora_choices()}")
    return str(path)


class DGemmaLoraLoader:
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The model with this adapter added to any it had: the same weights, read through the "
                       "adapter only by the nodes it feeds (the input model is unchanged).",)
    DESCRIPTION = ("Adds a LoRA adapter (PEFT's format, as TRL, Unsloth and NeMo save them) to a DiffusionGemma "
                   "model, at a strength; chain loaders to stack adapters. Works over bf16, 8bit, 4bit and GGUF "
                   "weights; the input model stays as it was, so a branch without the adapter is unchanged.")

    @classmethod
    def INPUT_TYPES(cls):
        choices = lora_choices() or [DEMO_LORA_NAME]
        return {
            "required": {
                "model": (MODEL, {"tooltip": "A loaded DiffusionGemma model (from DGemmaLoader, or another "
                                             "LoRA loader to stack adapters)."}),
                "lora": (choices, {"default": choices[0], "tooltip":
                         "The adapter: a PEFT adapter folder or a .safetensors file with PEFT keys under "
                         "models/loras, or the demo's digits adapter shipped with the pack."}),
                "strength": ("FLOAT", {"default": 1.0, "min": -4.0, "max": 4.0, "step": 0.05, "tooltip":
                             "How much of the adapter's delta is added (a factor, no unit): 1 as trained, 0 the "
                             "base model exactly, negative subtracts it."}),
            },
        }

    def load(self, model, lora, strength=1.0):
        if not isinstance(model, DGemmaModel):
            raise InputError("model", f"a LoRA applies to a model loaded here (DGemmaLoader), not to "
                                      f"{type(model).__name__}; a remote model's server applies its own adapters")
        check_strength(strength)
        # named as picked: the shipped demo's folder name (demo_lora) is not what the widget shows
        return (adapt(model, read_adapter(resolve_lora(lora), name=str(lora)), strength),)
