"""Run an API-format graph of this pack without a ComfyUI server.

    python -m headless                      # the demo smoke graph, outputs in ./output
    python -m headless graph.json [--out DIR] [--server URL]

Also the one place that loads this folder as the package `diffusiongemma`, the way ComfyUI
loads a custom node pack, so relative imports resolve outside ComfyUI too.
"""

import importlib.util
import sys
from pathlib import Path

PACK_NAME = "diffusiongemma"


def load_pack(bare: bool = False):
    """Import the pack (this folder) as the package `diffusiongemma`, once. `bare` skips its __init__ (the
    node registry, and with it torch): submitting a graph to a server needs only the runner's client."""
    if PACK_NAME in sys.modules:
        return sys.modules[PACK_NAME]
    root = Path(__file__).resolve().parent
    spec = importlib.util.spec_from_file_location(PACK_NAME, root / "__init__.py",
                                                  submodule_search_locations=[str(root)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACK_NAME] = module
    if not bare:
        spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    load_pack(bare=any(arg == "--server" or arg.startswith("--server=") for arg in sys.argv[1:]))
    from diffusiongemma.runner.cli import main

    sys.exit(main())
