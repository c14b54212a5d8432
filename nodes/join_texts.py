"""DGemmaJoinTexts: a list of texts (a list run's answers, say) as one text, for previews and files."""

from __future__ import annotations

import json

from ..dgemma.errors import InputError
from .queue_check import HIDDEN, QueueChecked
from .schema import CATEGORY, widget_values

FORMATS = ("separator", "json", "numbered")
SEPARATOR = "\\n\\n"
MAX_ITEMS = 10_000        # texts one join takes: a sampler's longest list
MAX_SEPARATOR = 1_000     # characters of the separator
MAX_JOINED = 16 * 2**20   # characters of the joined text, counted before it is built


def _one(values, default):
    """A widget's value on a list node (ComfyUI hands every input as a list)."""
    value = values[0] if isinstance(values, list) and values else values
    return default if value is None else value


def join_texts(texts: list, form: str = FORMATS[0], separator: str = SEPARATOR) -> str:
    """The texts as one: joined by `separator` (`\\n` is a newline), one JSON list, or numbered lines."""
    if not isinstance(form, str) or form not in FORMATS:
        raise InputError("format", f"format must be one of {', '.join(FORMATS)}, got {str(form)[:40]!r}")
    check_separator(separator)
    if len(texts) > MAX_ITEMS:
        raise InputError("text", f"text is a list of {len(texts)} items, over the {MAX_ITEMS} one join takes; "
                                 "join fewer")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InputError("text", f"list item {index} is a {type(text).__name__}, not text; wire a STRING "
                                     "output (a sampler's text or frames)")
    # Counted before building: 10,000 items with a long separator would otherwise build gigabytes.
    size = sum(len(t) for t in texts) + (len(separator) if form == "separator" else 8) * len(texts)
    if form == "json" and size <= MAX_JOINED:  # escapes may make an item up to six times as long
        size = sum(len(json.dumps(t, ensure_ascii=False)) + 3 for t in texts)
    if size > MAX_JOINED:
        raise InputError("text", f"the joined text would be about {size} characters, over the limit of {MAX_JOINED}; "
                                 "join fewer or shorter texts, or a shorter separator")
    if form == "json":
        return json.dumps(texts, ensure_ascii=False, indent=1)
    if form == "numbered":
        return "\n".join(f"{i + 1}. {' '.join(t.splitlines())}" for i, t in enumerate(texts))
    return separator.replace("\\n", "\n").join(texts)


def check_separator(separator) -> None:
    if not isinstance(separator, str):
        raise InputError("separator", f"separator must be text, got {type(separator).__name__}")
    if len(separator) > MAX_SEPARATOR:
        raise InputError("separator", f"separator is {len(separator)} characters, over the limit of "
                                      f"{MAX_SEPARATOR}; shorten it")


class DGemmaJoinTexts(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "join"
    INPUT_IS_LIST = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("text",)
    OUTPUT_TOOLTIPS = ("Every item's text as one: what Preview as Text, Save Text or a file node shows whole.",)
    DESCRIPTION = ("Joins a list of texts (a prompt list's answers, a sampler's frames) into one text: with a "
                   "separator, as one JSON list of strings, or as numbered lines. Core Preview as Text shows only "
                   "the first item of a list; wire this in between to see them all.")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "text": ("STRING", {"forceInput": True, "tooltip": "The texts of a list (one item each)."}),
            "format": (list(FORMATS), {"default": FORMATS[0], "tooltip": "separator: the texts joined by the "
                                       "separator; json: one JSON list of strings; numbered: one line per item, "
                                       "its newlines made spaces."}),
            "separator": ("STRING", {"default": SEPARATOR, "tooltip": "Between two texts when format is "
                                     "separator; \\n is a newline."}),
        }, "hidden": HIDDEN}

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The separator when the graph is queued (ComfyUI checks the format, a choice); a linked one is checked
        when the node runs. A list node's constant comes as a list when the node runs, as one value here."""
        try:
            for value in widget_values(inputs.get("separator")):
                if value is not None:
                    check_separator(value)
        except InputError as err:
            return str(err)
        return None

    def join(self, text, format=None, separator=None):
        texts = text if isinstance(text, list) else [text]
        return (join_texts(texts, _one(format, FORMATS[0]), _one(separator, SEPARATOR)),)
