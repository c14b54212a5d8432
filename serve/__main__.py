"""Start the server: `python -m serve --host 127.0.0.1 --port 8190 --model <folder or hub id>`.

Binds loopback unless told otherwise, and refuses any other address without a bearer token
(`--token`, or the environment variable named by `--token-env`, DGEMMA_SERVE_TOKEN by default).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse(argv):
    parser = argparse.ArgumentParser(prog="python -m serve", description=
                                     "Serve the DiffusionGemma engine over an OpenAI-compatible HTTP API.")
    parser.add_argument("--model", default=None, help="checkpoint folder or hub id (default: the shipped demo)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8190, help="TCP port; 0 picks a free one (printed)")
    parser.add_argument("--token", default=None, help="bearer token clients must send")
    parser.add_argument("--token-env", default="DGEMMA_SERVE_TOKEN", help="environment variable holding the token")
    parser.add_argument("--device", default="auto", help="auto, cuda or cpu")
    parser.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    parser.add_argument("--quant", default="none", help="none or autoround")
    parser.add_argument("--max-queue", type=int, default=8, help="requests waiting behind the running one")
    parser.add_argument("--max-body-mb", type=int, default=64, help="largest request body in MiB")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    token = args.token or os.environ.get(args.token_env, "")
    if not is_loopback(args.host) and not token:
        print(f"refusing to bind {args.host} without a bearer token: pass --token or set {args.token_env} "
              "(or bind 127.0.0.1)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from headless import load_pack

    load_pack()
    from aiohttp import web

    from diffusiongemma.dgemma.demo import DEMO_DIR
    from diffusiongemma.dgemma.loading import load_model
    from diffusiongemma.serve.app import build_app
    from diffusiongemma.serve.runs import Engine

    source = args.model or str(DEMO_DIR)
    dm = load_model(source, quant=args.quant, dtype=args.dtype, device=args.device)
    engine = Engine(dm, Path(source).name or source, max_queue=args.max_queue)
    app = build_app(engine, token, args.max_body_mb * 2**20)
    runner = web.AppRunner(app, access_log=None)
    return _serve(runner, args.host, args.port)


def _serve(runner, host: str, port: int) -> int:
    import asyncio

    from aiohttp import web

    async def start():
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1]
        print(f"serving on http://{host}:{bound}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(start())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
