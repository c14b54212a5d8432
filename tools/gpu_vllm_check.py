"""On a machine with a CUDA GPU: serve the demo checkpoint with vLLM, run the remote node against it,
and save the real stream as a fixture (replacing the hand-written one in tests/fixtures/remote).

    python tools/gpu_vllm_check.py                 # pip install vllm, serve, run, record
    python tools/gpu_vllm_check.py --url URL       # an engine already serving (no install): run, record

Not yet run: the machine this was written on has no GPU (vLLM's CUDA build needs one, and its CPU
wheel cannot serve the model's diffusion path). `--url` against tests' replay server dry-runs it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "remote"
sys.path.insert(0, str(REPO))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.dgemma.inputs.knobs import Knobs  # noqa: E402
from diffusiongemma.remote.connect import connect  # noqa: E402
from diffusiongemma.remote.text import VllmBackend  # noqa: E402

PORT = 8300
PROMPT = "What is 3+4?"


def start_vllm(install: bool) -> subprocess.Popen:
    if install:
        subprocess.run([sys.executable, "-m", "pip", "install", "vllm>=0.33"], check=True)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(DEMO_DIR),
               "--served-model-name", "demo_model", "--dtype", "float32", "--max-num-seqs", "4",
               "--reasoning-parser", "gemma4", "--port", str(PORT)]
    print("starting:", " ".join(command), flush=True)
    return subprocess.Popen(command)


def wait_healthy(url: str, seconds: float = 900) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(3)
    raise SystemExit(f"{url} did not become healthy in {seconds:.0f} s")


def record(url: str, model) -> None:
    """The raw stream of the request the remote node sends, and the model card, saved as fixtures."""
    body = VllmBackend(None).body(model, PROMPT, Knobs(thinking=True), None)
    request = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as answer:
        (FIXTURES / "vllm_stream.recorded.sse").write_bytes(answer.read())
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as answer:
        (FIXTURES / "vllm_models.recorded.json").write_bytes(answer.read())
    print("saved", FIXTURES / "vllm_stream.recorded.sse")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default=None, help="an engine already serving the demo model")
    parser.add_argument("--no-install", action="store_true", help="vLLM is installed already")
    args = parser.parse_args()
    server = None if args.url else start_vllm(not args.no_install)
    url = args.url or f"http://127.0.0.1:{PORT}"
    try:
        wait_healthy(url)
        model = connect(url)
        print("dialect:", model.dialect)
        frames = []
        result = model.backend.run(model, PROMPT, Knobs(thinking=True), on_frame=frames.append)
        print(f"text={result.text!r} thought={result.state.thought!r} frames={len(frames)} "
              f"not_sent={sorted(result.config.readings.knobs_not_sent)}")
        record(url, model)
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
