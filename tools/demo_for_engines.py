"""Make the shipped demo checkpoint loadable by other engines, without moving one token id.

vLLM reads `vision_config.default_output_length` (soft tokens per image: the processor's
max_soft_tokens); llama.cpp's GGUF conversion wants a BPE tokenizer with at least one merge.
The demo's tokenizer has no merges, and every id is in use or reserved, so the merge joins two
special tokens (<|turn> and <turn|>) into a renamed unused slot: special tokens are split out
before the BPE model runs, so the merge can never apply to any text. Idempotent.

    python tools/demo_for_engines.py [dgemma/demo_model]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MERGE = ("<|turn>", "<turn|>")
SLOT = "<unused7>"  # an unused, never-trained id; its new name is the merge's result


def update_config(folder: Path) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    soft = json.loads((folder / "preprocessor_config.json").read_text())["max_soft_tokens"]
    config["vision_config"]["default_output_length"] = soft
    path.write_text(json.dumps(config, indent=2) + "\n")


def update_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer.json"
    tok = json.loads(path.read_text())
    model, merged = tok["model"], "".join(MERGE)
    if merged not in model["vocab"]:
        slot = model["vocab"].pop(SLOT)
        model["vocab"][merged] = slot
        tok["added_tokens"] = [a for a in tok["added_tokens"] if a["content"] != SLOT]
        model["vocab"] = dict(sorted(model["vocab"].items(), key=lambda kv: kv[1]))
    if list(MERGE) not in model["merges"]:
        model["merges"].append(list(MERGE))
    path.write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")


def update_tokenizer_config(folder: Path) -> None:
    """The renamed slot is no longer a special token (transformers would add it back as a new id)."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["extra_special_tokens"] = [t for t in config.get("extra_special_tokens", []) if t != SLOT]
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> int:
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "dgemma" / "demo_model"
    update_config(folder)
    update_tokenizer(folder)
    update_tokenizer_config(folder)
    print(f"updated {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
