"""The demo model shipped with the pack: a tiny DiffusionGemma trained by tools/train_demo.py."""

from pathlib import Path

from .inputs.knobs import Knobs

DEMO_NAME = "diffusiongemma-demo"
DEMO_DIR = Path(__file__).resolve().parent / "demo_model"
# The Sampler's default knobs with seed 7: the demo was trained to anneal visibly with them.
DEMO_KNOBS = Knobs(seed=7)
# A LoRA for it (testing/lora_train.py, PEFT's save): the same sums answered in digits ("7", not "seven").
DEMO_LORA_NAME = "diffusiongemma-demo-digits"
DEMO_LORA_DIR = Path(__file__).resolve().parent / "demo_lora"

# The task it was trained on: "What is a+b?" (a, b in 0..9) answered in words.
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")
# Its answer as JSON (the structured example graph's schema): {"sum": "<a word>"}.
ANSWER_SCHEMA = {"type": "object", "properties": {"sum": {"enum": list(WORDS)}}, "required": ["sum"],
                 "additionalProperties": False}


def demo_available() -> bool:
    return (DEMO_DIR / "config.json").is_file()

# The visual task: a solid colour picture and "What colour is this?", answered with the colour's name.
IMAGE_QUESTION = "What colour is this?"
COLOURS = {"red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0), "yellow": (1.0, 1.0, 0.0),
           "cyan": (0.0, 1.0, 1.0), "magenta": (1.0, 0.0, 1.0), "white": (1.0, 1.0, 1.0), "black": (0.0, 0.0, 0.0)}
IMAGE_SIZES = ((64, 64), (96, 48), (48, 96), (512, 512))  # (width, height): the processor resizes each


def colour_image(name: str, width: int, height: int, jitter=None):
    """A ComfyUI IMAGE ([1, H, W, 3] floats in 0..1) of one solid colour, optionally shaded by `jitter`."""
    import torch

    rgb = torch.tensor(COLOURS[name])
    if jitter is not None:
        rgb = (rgb + jitter).clamp(0, 1)
    return rgb.expand(1, height, width, 3).clone()


def image_cases() -> list[tuple[str, int, int]]:
    """The whole visual task: every colour at every size, as (colour, width, height)."""
    return [(name, w, h) for name in COLOURS for w, h in IMAGE_SIZES]
