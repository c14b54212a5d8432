"""DGemmaPromptList: one prompt per line, as a ComfyUI list that a sampler runs as one batch."""

from __future__ import annotations

from ..dgemma.errors import InputError
from .queue_check import HIDDEN, QueueChecked
from .schema import CATEGORY, MAX_LIST

MAX_CHARS = 4 * 2**20  # characters of the whole list: 10,000 prompts of a few hundred characters


def split_prompts(text: str) -> list[str]:
    """The non-empty lines of `text`, each a prompt (`\\n` inside a line is a newline of that prompt)."""
    if not isinstance(text, str):
        raise InputError("prompts", f"prompts must be text, got {type(text).__name__}")
    if len(text) > MAX_CHARS:  # bounded before it is split
        raise InputError("prompts", f"prompts is {len(text)} characters, over the limit of {MAX_CHARS}; split the "
                                    "list")
    prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts:
        raise InputError("prompts", "prompts is empty; type one prompt per line")
    if len(prompts) > MAX_LIST:
        raise InputError("prompts", f"prompts has {len(prompts)} lines, over {MAX_LIST}; split the list")
    return prompts


class DGemmaPromptList(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "split"
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("prompt",)
    OUTPUT_IS_LIST = (True,)
    OUTPUT_TOOLTIPS = ("The prompts as a list (one item per line): wire it into a sampler's prompt to denoise "
                       "them as one batch.",)
    DESCRIPTION = ("Turns text with one prompt per line into a list of prompts. A sampler given the list "
                   "denoises every item in one batch and returns one output per item; the live view paints "
                   "every canvas at once.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"prompts": ("STRING", {"multiline": True, "default": "What is 2+2?\nName a colour.",
                                                    "tooltip": "One prompt per line (text); empty lines are "
                                                               "skipped, \\n is a newline inside a prompt."})},
                "hidden": HIDDEN}

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The lines, when the graph is queued; linked text (absent here) is checked when the node runs."""
        if inputs.get("prompts") is None:
            return None
        try:
            split_prompts(inputs["prompts"])
        except InputError as err:
            return str(err)
        return None

    def split(self, prompts):
        return (split_prompts(prompts),)
