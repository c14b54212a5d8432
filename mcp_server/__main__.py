"""Start the MCP server on stdio: `python -m mcp_server [--model NAME_OR_PATH]` from the pack's folder.

stdout carries the protocol, so everything else (loading bars, logs) goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

INSTALL = "the MCP server needs the MCP SDK: pip install 'mcp>=2,<3' (or the pack's extra: pip install '.[mcp]')"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mcp_server", description=
                                     "Serve the DiffusionGemma engine to MCP clients over stdio.")
    parser.add_argument("--model", default=None, help="model loaded on first use (default: the shipped demo "
                        "model); a checkpoint folder or a hub id; the load_model tool can change it")
    parser.add_argument("--image-dir", action="append", default=None, help="a folder the image argument may "
                        "name files under (repeatable; default: ./input)")
    parser.add_argument("--max-paused", type=int, default=4, help="paused runs kept for resume; past it the "
                        "oldest is freed (default: 4)")
    args = parser.parse_args(argv)
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        print(INSTALL, file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from headless import load_pack

    load_pack()
    from diffusiongemma.dgemma.demo import DEMO_NAME
    from diffusiongemma.mcp_server.engine import Engine
    from diffusiongemma.mcp_server.server import build_server

    engine = Engine(default_model=args.model or DEMO_NAME, max_paused=max(1, args.max_paused),
                    image_dirs=tuple(args.image_dir or ("input",)))
    build_server(engine).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
