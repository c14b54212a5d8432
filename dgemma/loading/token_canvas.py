"""A checkpoint's tokenizer and canvas length without its weights, read the way the Loader reads them, for the
checks a queued graph can make before the Loader runs. Kept per path and modification time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import preflight

CACHED = 4  # checkpoints whose tokenizers are kept: a real one's is tens of MB


@dataclass(frozen=True)
class TokenCanvas:
    tokenizer: object
    canvas_length: int


_cache: dict[tuple, TokenCanvas] = {}


def _stamp(path: Path) -> tuple:
    """What changes when the checkpoint's tokenizer or config is replaced in place."""
    files = [path] if path.is_file() else [path / n for n in ("config.json", "tokenizer.json",
                                                              "tokenizer_config.json", "chat_template.jinja")]
    return tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None for f in files)


def token_canvas(path) -> TokenCanvas:
    """The tokenizer and canvas length of a local checkpoint folder or .gguf file; ValueError when unreadable."""
    path = Path(path)
    key = (str(path), _stamp(path))
    if key not in _cache:
        found = _read_gguf(path) if path.suffix.lower() == ".gguf" else _read_folder(path)
        while len(_cache) >= CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key] = found
    return _cache[key]


def _read_folder(folder: Path) -> TokenCanvas:
    from transformers import AutoConfig

    from .load import load_tokenizer

    preflight.check_folder(folder)  # no checkpoint code runs, as when the Loader reads it
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    tokenizer, _ = load_tokenizer(str(folder), True, config.get_text_config(decoder=True).vocab_size)
    return TokenCanvas(tokenizer, int(config.canvas_length))


def _read_gguf(path: Path) -> TokenCanvas:
    from . import gguf_config, gguf_file

    g = gguf_file.read(path)  # the header and tensor table only; no tensor is read
    return TokenCanvas(gguf_config.tokenizer(g), int(g.need("diffusion.canvas_length")))
