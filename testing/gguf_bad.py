"""Broken DiffusionGemma GGUF files, made from a good one, each with the problem it has.

Used by the refusal tests and benchmarks/gguf.py: every one must be refused with the file named,
before any weight is allocated.
"""

from __future__ import annotations

import struct
from pathlib import Path


def _patch_type(data: bytearray, name: str, qtype: int) -> None:
    """Set the ggml type of tensor `name` in the tensor infos (name, dims, type, offset)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(key) + len(key)
    dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * dims, qtype)


def _patch_u32(data: bytearray, key: str, value: int) -> None:
    """A uint32 metadata value (key string, type id 4, value)."""
    found = struct.pack("<Q", len(key)) + key.encode()
    at = data.index(found) + len(found)
    assert struct.unpack_from("<I", data, at)[0] == 4
    struct.pack_into("<I", data, at + 4, value)


def _without(good: Path, path: Path, dropped: str) -> bytes:
    """The file rewritten by the gguf package's writer, one (float) tensor left out."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(good)
    writer = gguf.GGUFWriter(path, arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if t.name != dropped:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    data = path.read_bytes()
    path.unlink()
    return data


def bad_files(good: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """problem -> (file, words its refusal must contain)."""
    raw = bytes(good.read_bytes())
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, tuple[bytes, str]] = {}
    made["another architecture"] = (raw.replace(b"diffusion-gemma", b"diffusion-llama"), "architecture")
    made["truncated"] = (raw[: len(raw) * 2 // 3], "truncated")
    wide = bytearray(raw)
    _patch_u32(wide, "diffusion-gemma.embedding_length", 64)
    made["metadata disagree with tensors"] = (bytes(wide), "disagree")
    made["missing tensor"] = (_without(good, folder / "without.gguf", "blk.1.ffn_up.weight"), "no tensor")
    made["extra tensor"] = (raw.replace(b"blk.1.attn_q.weight", b"blk.1.attn_z.weight"), "extra tensor")
    odd = bytearray(raw)
    _patch_type(odd, "blk.0.ffn_down_exps.scale", 28)  # F32 -> F64: read by gguf, not dequantized here
    made["unsupported type"] = (bytes(odd), "F64")
    made["not GGUF at all"] = (b"<html>404 Not Found</html>\n" * 40, "not a readable GGUF")
    out = {}
    for i, (problem, (data, words)) in enumerate(made.items()):
        path = folder / f"bad-{i}.gguf"
        path.write_bytes(data)
        out[problem] = (path, words)
    return out
