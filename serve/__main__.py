"""Start the server: `python -m serve --host 127.0.0.1 --port 8190 --model <folder, hub id or diffusiongemma-demo>`.

Binds loopback unless told otherwise, and refuses any other address without a bearer token
(`--token`, or the environment variable named by `--token-env`, DGEMMA_SERVE_TOKEN by default).
Every flag is checked and the port bound before the model loads, so a mistake costs no load.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path

from .safety import HOST_NAME, ORIGIN  # the standard library only: no model code loads before the flags are checked


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def int_in(lo: int, hi: int | None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            span = f"from {lo} to {hi}" if hi is not None else f"of {lo} or more"
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text[:40]!r}")
        return value
    return parse


def host_arg(text: str) -> str:
    if not HOST_NAME.match(text.lower()):
        raise argparse.ArgumentTypeError(f"must be a host name or address (like myserver.lan or 10.0.0.5), "
                                         f"got {text[:60]!r}")
    return text.lower().strip("[]")


def origin_arg(text: str) -> str:
    if not ORIGIN.match(text.lower().rstrip("/")):
        raise argparse.ArgumentTypeError(f"must be an origin scheme://host[:port] (like http://localhost:3000), "
                                         f"got {text[:60]!r}")
    return text.lower().rstrip("/")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m serve", description=
                                "Serve the DiffusionGemma engine over an OpenAI-compatible HTTP API.")
    p.add_argument("--model", default=None, help="checkpoint folder, hub id, or diffusiongemma-demo (the default)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int_in(0, 65535), default=8190, help="TCP port; 0 picks a free one (printed)")
    p.add_argument("--token", default=None, help="bearer token clients must send")
    p.add_argument("--token-env", default="DGEMMA_SERVE_TOKEN", help="environment variable holding the token")
    p.add_argument("--device", default="auto", help="auto, cuda, cuda:N (a GPU by index) or cpu")
    p.add_argument("--dtype", default="auto", help="auto, bfloat16, float16 or float32")
    p.add_argument("--quant", default="auto", help="auto, none, autoround, 4bit or 8bit (see the Loader's quant)")
    p.add_argument("--max-queue", type=int_in(0, None), default=8, help="requests waiting behind the running one")
    p.add_argument("--max-body-mb", type=int_in(1, 1024), default=64, help="largest request body in MiB (1-1024)")
    p.add_argument("--allowed-host", action="append", type=host_arg, default=[], metavar="NAME",
                   help="a name clients use in the Host header besides localhost, 127.0.0.1, ::1 and --host "
                        "(repeatable)")
    p.add_argument("--allow-origin", action="append", type=origin_arg, default=[], metavar="ORIGIN",
                   help="a web page origin allowed to call the server, with CORS (repeatable; none by default)")
    p.add_argument("--lenient", action="store_true",
                   help="ignore request fields the server does not implement (tools, temperature, ...) with an "
                        "X-DGemma-Warning header instead of a 400")
    p.add_argument("--no-warm", action="store_true",
                   help="do not compile json_object and the example schemas in the background at start (they are "
                        "kept on disk, so only a server's first start with a tokenizer compiles them)")
    return p.parse_args(argv)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads (a busy port is found at once)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    token = args.token or os.environ.get(args.token_env, "")
    if not is_loopback(args.host) and not token:
        print(f"refusing to bind {args.host} without a bearer token: pass --token or set {args.token_env} "
              "(or bind 127.0.0.1)", file=sys.stderr)
        return 2
    try:
        sock = bind(args.host, args.port)
    except OSError as err:
        print(f"cannot listen on {args.host} port {args.port} ({err.strerror or err}); pick another --port, or "
              "--port 0 for a free one", file=sys.stderr)
        return 2
    with sock:
        return run(args, token, sock)


def run(args, token: str, sock: socket.socket) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from headless import load_pack

    load_pack()
    from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_NAME
    from diffusiongemma.serve.app import build_app
    from diffusiongemma.serve.runs import Engine
    from diffusiongemma.serve.safety import Policy
    from diffusiongemma.serve.structured import common

    name = args.model or DEMO_NAME
    try:
        dm = load(str(DEMO_DIR) if name == DEMO_NAME else name, args)
    except (ValueError, OSError, ImportError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"cannot load model {name!r}: {first[:300]}", file=sys.stderr)
        return 2
    engine = Engine(dm, name if name == DEMO_NAME else Path(name).name or name, max_queue=args.max_queue)
    policy = Policy.of(token, args.host, args.allowed_host, args.allow_origin)
    app = build_app(engine, policy, args.max_body_mb * 2**20, lenient=args.lenient)
    if not args.no_warm:
        engine.warm(common())
    return serve(app, args.host, sock)


def load(source: str, args):
    from diffusiongemma.dgemma.loading.load import load_model

    return load_model(source, quant=args.quant, dtype=args.dtype, device=args.device)


def serve(app, host: str, sock: socket.socket) -> int:
    import asyncio

    from aiohttp import web

    from diffusiongemma.serve.app import CONNECTIONS
    from diffusiongemma.serve.connections import HEADER_TIMEOUT, serve_on

    async def start():
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=HEADER_TIMEOUT)
        await runner.setup()
        await serve_on(runner, sock, app[CONNECTIONS])
        shown = f"[{host}]" if ":" in host else host
        print(f"serving on http://{shown}:{sock.getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(start())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
