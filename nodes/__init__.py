"""The ComfyUI nodes: thin classes over the engine in dgemma/."""

from ..dgemma.loading import machine
from . import host, memory, queue_check, wiring
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
machine.use(memory.host_machine)  # loads plan on ComfyUI's device and free memory when it runs the pack

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
host.on_prompt(queue_check.on_prompt(NODE_CLASS_MAPPINGS))  # each node's queue-time rules, listed once

# What each node is, short enough not to wrap in the node library; the category names the pack.
NODE_DISPLAY_NAME_MAPPINGS = {
    "DGemmaLoader": "Model Loader",
    "DGemmaRemoteLoader": "Remote Model Loader",
    "DGemmaSampler": "Sampler",
    "DGemmaDenoise": "Denoise (KV Cache)",
    "DGemmaSamplerAdvanced": "Sampler (Advanced)",
    "DGemmaEncode": "Encode Context",
    "DGemmaTrace": "Trace Heatmap",
    "DGemmaRunLogWriter": "Save Run Log",
    "DGemmaPromptList": "Prompt List",
    "DGemmaDecide": "Decide",
    "DGemmaJoinTexts": "Join Texts",
    "DGemmaLoraLoader": "LoRA Loader",
}
