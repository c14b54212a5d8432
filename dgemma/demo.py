"""The demo model shipped with the pack: a tiny DiffusionGemma trained by tools/train_demo.py."""

from pathlib import Path

DEMO_NAME = "diffusiongemma-demo"
DEMO_DIR = Path(__file__).resolve().parent / "demo_model"


def demo_available() -> bool:
    return (DEMO_DIR / "config.json").is_file()
