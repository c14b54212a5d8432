"""Shared fixtures: the pack imported as ComfyUI imports it, and tiny real checkpoints."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # test helpers (executor, fakecomfy) import by name

_spec = importlib.util.spec_from_file_location("headless", REPO / "headless.py")
_headless = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_headless)
pack = _headless.load_pack()

from diffusiongemma.dgemma import load_model  # noqa: E402
from diffusiongemma.testing import tiny  # noqa: E402


def cache_base() -> Path:
    """Where test checkpoints are cached, each under a key of its builder's sources and versions."""
    return Path(os.environ.get("DGEMMA_TEST_CACHE", Path.home() / ".cache" / "dgemma-tests"))


def _cache_root() -> Path:
    import transformers

    sources = b"".join((REPO / "testing" / f).read_bytes() for f in ("tiny.py", "tiny_tokenizer.py"))
    key = hashlib.sha256(sources + transformers.__version__.encode()).hexdigest()[:12]
    return cache_base() / key


def checkpoint(preset: str) -> Path:
    """A tiny checkpoint built once per machine and source version."""
    out = _cache_root() / preset
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tiny.build_checkpoint(tmp, preset)
        tmp.rename(out)
    return out


def quantized(source: Path, name: str) -> Path:
    """The AutoRound INT4 version of `source` (tools/quantize_tiny.py), built once per tool, weights and
    auto-round version."""
    import auto_round

    spec = importlib.util.spec_from_file_location("quantize_tiny", REPO / "tools" / "quantize_tiny.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    digest = hashlib.sha256((REPO / "tools" / "quantize_tiny.py").read_bytes() + auto_round.__version__.encode())
    for path in sorted(source.glob("*.safetensors")):
        digest.update(path.read_bytes())
    out = _cache_root() / f"autoround-{digest.hexdigest()[:12]}" / name
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tool.quantize(source, tmp)
        tmp.rename(out)
    return out


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return checkpoint("random")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    return load_model(str(tiny_dir))


@pytest.fixture(scope="session")
def demo_model():
    from diffusiongemma.dgemma.demo import DEMO_DIR

    return load_model(str(DEMO_DIR))


@pytest.fixture(scope="session")
def realvocab_model():
    return load_model(str(checkpoint("real-vocab")))


@pytest.fixture
def no_model_work(monkeypatch):
    """Any encode or decoder forward fails the test: a refusal must come before model work."""
    from diffusiongemma.dgemma.denoising import context, loop, run

    def refuse(*args, **kwargs):
        pytest.fail("the model ran before the input was refused")

    for module in (run, context, loop):
        monkeypatch.setattr(module, "encode_ids", refuse)
    monkeypatch.setattr(loop.BlockDecoder, "logits", refuse)


@pytest.fixture(autouse=True)
def constraint_cache(tmp_path_factory, monkeypatch):
    """Each test its own compiled-automaton cache: a test that counts compiles never reads another's files."""
    where = tmp_path_factory.mktemp("constraints")
    monkeypatch.setenv("DGEMMA_CONSTRAINT_CACHE", str(where))
    return where
