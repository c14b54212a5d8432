"""A checkpoint's identity: equal only when two loads read the same files, so nothing stale runs.

It joins the stored size, a hash of the small files that define the model and its tokenizer
(config, index, tokenizer, chat template, processor), each weight file's size and modification
time (hashing 50 GB of weights on every load would cost more than the load), and the tokenizer's
fingerprint. A reload after `after_run = unload` and every KV cache are checked against it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DEFINING_FILES = ("config.json", "model.safetensors.index.json", "generation_config.json", "tokenizer.json",
                  "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                  "preprocessor_config.json", "processor_config.json")


def _snapshot(where: str) -> Path | None:
    """The local folder of a hub checkpoint (its cached snapshot), when there is one."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(where, "config.json")
    except (ImportError, ValueError, OSError):
        return None
    return Path(found).parent if isinstance(found, str) else None


def checkpoint_identity(folder: Path | None, where: str, stored: int, tokenizer_fingerprint: str) -> str:
    """`<stored bytes>:<16 hex digits>` for the checkpoint at `folder` (or hub id `where`)."""
    folder = folder if folder is not None else _snapshot(where)
    digest = hashlib.sha256(f"{stored}\n{tokenizer_fingerprint}\n".encode())
    if folder is not None:
        for name in DEFINING_FILES:
            path = folder / name
            if path.is_file():
                digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
        for path in sorted(folder.glob("*.safetensors")):
            st = path.stat()  # follows the hub cache's links to the blobs
            digest.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{stored}:{digest.hexdigest()[:16]}"
