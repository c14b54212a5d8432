"""DGemmaEncode: raw context text into a DGEMMA_KV_CACHE (mint, or advance a wired cache)."""

from __future__ import annotations

from ..dgemma.backend import backend_of
from ..dgemma.errors import InputError
from ..dgemma.inputs.tokens import check_text
from . import host, memory
from .queue_check import HIDDEN, QueueChecked
from .schema import CATEGORY, KV_CACHE, comfy_hints, model_input


class DGemmaEncode(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "encode"
    RETURN_TYPES = (KV_CACHE,)
    RETURN_NAMES = ("kv_cache",)
    OUTPUT_TOOLTIPS = ("Encoded context with its provenance (the token ids that minted it); never modified "
                       "by the nodes that use it.",)
    DESCRIPTION = ("Encodes CONTEXT (a document, a prior turn, a constraint) into a KV cache for DGemmaDenoise, "
                   "with no chat framing. Unwired kv_cache mints a new cache; wired, it returns a new cache that "
                   "continues the given one with this text. Put the turn on Denoise's prompt.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": model_input(),
                "text": ("STRING", {"multiline": True, "default": "", "tooltip":
                         "Raw CONTEXT, not a prompt: encoded as is, no role markers or generation suffix. "
                         "When minting it opens the sequence (with the only BOS)."}),
            },
            "optional": {"kv_cache": (KV_CACHE, {"tooltip": "A cache to continue with this text; it is not "
                                                            "changed, a new one is returned."}),
                         "image": ("IMAGE", {"tooltip": "Optional picture(s) encoded as context before the "
                                                        "text, with no chat framing; text may then be empty."})},
            "hidden": {"unique_id": "UNIQUE_ID", **HIDDEN},
        }

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The text's type and Unicode when the graph is queued; its length in tokens needs the model."""
        try:
            if inputs.get("text") is not None:
                check_text("text", inputs["text"])
        except InputError as err:
            return str(err)
        return None

    def encode(self, model, text, kv_cache=None, image=None, unique_id=None):
        with memory.running(model, unique_id), comfy_hints():
            cache = backend_of(model).encode(model, text, onto=kv_cache, should_cancel=host.check_interrupt,
                                             image=image)
        return (cache,)
