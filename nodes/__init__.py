"""The ComfyUI nodes: thin classes over the engine in dgemma/."""

from . import host, wiring
from .decide import DGemmaDecide
from .encode import DGemmaEncode
from .join_texts import DGemmaJoinTexts
from .loader import DGemmaLoader
from .lora_loader import DGemmaLoraLoader
from .prompt_list import DGemmaPromptList
from .remote_loader import DGemmaRemoteLoader
from .runlog_writer import DGemmaRunLogWriter
from .sampler import DGemmaDenoise, DGemmaSampler
from .sampler_advanced import DGemmaSamplerAdvanced
from .trace_heatmap import DGemmaTrace

host.register_model_folder()

NODE_CLASS_MAPPINGS = {
    "DGemmaLoader": DGemmaLoader,
    "DGemmaRemoteLoader": DGemmaRemoteLoader,
    "DGemmaSampler": DGemmaSampler,
    "DGemmaDenoise": DGemmaDenoise,
    "DGemmaSamplerAdvanced": DGemmaSamplerAdvanced,
    "DGemmaEncode": DGemmaEncode,
    "DGemmaTrace": DGemmaTrace,
    "DGemmaRunLogWriter": DGemmaRunLogWriter,
    "DGemmaPromptList": DGemmaPromptList,
    "DGemmaDecide": DGemmaDecide,
    "DGemmaJoinTexts": DGemmaJoinTexts,
    "DGemmaLoraLoader": DGemmaLoraLoader,
}

# every queued prompt says which of these nodes' frames and images it reads (nodes/wiring.py)
ON_DEMAND_CLASSES = {name: cls for name, cls in NODE_CLASS_MAPPINGS.items() if getattr(cls, "ON_DEMAND", ())}
host.on_prompt(wiring.on_prompt(ON_DEMAND_CLASSES))

NODE_DISPLAY_NAME_MAPPINGS = {
    "DGemmaLoader": "DiffusionGemma Loader",
    "DGemmaRemoteLoader": "DiffusionGemma Remote Loader",
    "DGemmaSampler": "DiffusionGemma Sampler",
    "DGemmaDenoise": "DiffusionGemma Denoise (KV Cache)",
    "DGemmaSamplerAdvanced": "DiffusionGemma Sampler (Advanced)",
    "DGemmaEncode": "DiffusionGemma Encode (KV Cache)",
    "DGemmaTrace": "DiffusionGemma Trace",
    "DGemmaRunLogWriter": "DiffusionGemma Run Log Writer",
    "DGemmaPromptList": "DiffusionGemma Prompt List",
    "DGemmaDecide": "DiffusionGemma Decide",
    "DGemmaJoinTexts": "DiffusionGemma Join Texts",
    "DGemmaLoraLoader": "DiffusionGemma LoRA Loader",
}
