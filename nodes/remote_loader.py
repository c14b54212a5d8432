"""DGemmaRemoteLoader: a DGEMMA_MODEL served by another machine (this pack's server, a shim, vLLM)."""

from __future__ import annotations

from ..dgemma.errors import InputError, short
from ..remote.access import checked_url, token_of
from ..remote.connect import connect
from ..remote.dialects import carried
from . import host
from .queue_check import HIDDEN, QueueChecked
from .schema import CATEGORY, MODEL

URL_TOOLTIP = "Base URL of the server, e.g. http://127.0.0.1:8190 (no /v1)."
TOKEN_TOOLTIP = ("Name of an environment variable (of the ComfyUI process) holding the server's bearer token: "
                 "one starting with DGEMMA_ (e.g. DGEMMA_REMOTE_TOKEN), or one listed in DGEMMA_REMOTE_TOKEN_VARS "
                 "in ComfyUI's environment; any other name is refused. The token goes only over https, or plain "
                 "http to this machine (DGEMMA_REMOTE_ALLOW_HTTP_TOKEN=1 allows other hosts), and never into the "
                 "workflow, a message or the run log. Empty: no token.")
MODEL_TOOLTIP = "The served model's id from /v1/models; empty takes the first one listed."


class DGemmaRemoteLoader(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "load"
    RETURN_TYPES = (MODEL, "STRING")
    RETURN_NAMES = ("model", "dialect")
    OUTPUT_TOOLTIPS = ("The remote model: Sampler, Denoise, Encode and the Advanced sampler take it as they take "
                       "a local one.", carried())
    DESCRIPTION = ("Uses a DiffusionGemma served on another machine: this pack's server (python -m serve) gives "
                   "the same tokens, frames, trace and run log as a local run; a llama.cpp/Unsloth "
                   "diffusion_frame server paints each step's text; vLLM paints one frame per canvas. Checks "
                   "/health and /v1/models first and says which dialect it found.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"url": ("STRING", {"default": "http://127.0.0.1:8190", "tooltip": URL_TOOLTIP})},
            "optional": {"token_env": ("STRING", {"default": "", "tooltip": TOKEN_TOOLTIP}),
                         "model_id": ("STRING", {"default": "", "tooltip": MODEL_TOOLTIP})},
            "hidden": HIDDEN,
        }

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The URL's shape and the token's variable, when the graph is queued: no traffic, no secret shown."""
        url, token_env = inputs.get("url"), inputs.get("token_env")
        try:
            if isinstance(token_env, str) and (url is None or isinstance(url, str)):
                token = token_of(token_env.strip())
                if url is not None:
                    checked_url(url.strip().rstrip("/"), token, token_env.strip())
            elif isinstance(url, str):
                checked_url(url.strip().rstrip("/"))
        except InputError as err:
            return str(err)
        return None

    @classmethod
    def IS_CHANGED(cls, url, token_env="", model_id=""):
        return float("nan")  # the server may have restarted or changed model: check it every run

    def load(self, url, token_env="", model_id=""):
        for name, value in (("url", url), ("token_env", token_env), ("model_id", model_id)):
            if not isinstance(value, str):
                raise ValueError(f"RemoteLoader input {name} must be text, got {short(value)}")
        model = connect(url.strip(), token_env.strip(), model_id.strip(), should_cancel=host.check_interrupt)
        return (model, model.dialect)
