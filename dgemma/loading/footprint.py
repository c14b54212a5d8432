"""What a loaded model holds in memory, as ComfyUI's model management should count it."""

from __future__ import annotations

import itertools


def held_bytes(model) -> int:
    """Bytes of every tensor the model holds, each storage once: a tied weight (the encoder's layers are the
    decoder's, the output head is the embedding) counts once, and GGUF blocks count at their stored size
    (they are uint8 buffers). ComfyUI's own count reads the state dict, where each tie appears again."""
    seen: dict = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.is_meta:
            continue
        storage = t.untyped_storage()
        seen[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())
