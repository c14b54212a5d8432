"""Quantize a tiny DiffusionGemma checkpoint to AutoRound INT4 with the auto-round package, on the CPU.

Round-to-nearest (iters=0, no calibration data, so nothing is downloaded), 4-bit symmetric
integers in groups of 32 (the tiny layers are 32 to 128 wide), saved in auto-round's own format,
which transformers loads through its `quant_method: auto-round` quantizer.

    python tools/quantize_tiny.py --out /tmp/tiny-int4                    # from the random preset
    python tools/quantize_tiny.py --source dgemma/demo_model --out /tmp/demo-int4
"""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GROUP_SIZE = 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _pack():
    sys.path.insert(0, str(ROOT))
    import headless

    headless.load_pack()
    from diffusiongemma.testing import tiny

    return tiny


def quantize(source: str | Path, out: str | Path) -> Path:
    """Write the AutoRound INT4 version of the checkpoint folder `source` to `out`."""
    import torch
    from auto_round import AutoRound
    from auto_round.algorithms.quantization.rtn.config import RTNConfig
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    tiny = _pack()
    source, out = Path(source), Path(out)
    # bfloat16 as the release ships; no hub kernels (transformers 5.25 wants a kernels pin that cannot install)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(source, dtype=torch.bfloat16, use_kernels=False)
    tokenizer = AutoTokenizer.from_pretrained(source)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        ar = AutoRound(model, tokenizer=tokenizer, scheme="W4A16", device_map="cpu",
                       alg_configs=RTNConfig(disable_opt_rtn=True, group_size=GROUP_SIZE))
        ar.quantize_and_save(tmp, format="auto_round")
        # auto-round names a subfolder after the model and scheme
        written = next(p.parent for p in Path(tmp).rglob("config.json"))
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(written), out)
    _shard_by_index(out)
    for name in TOKENIZER_FILES:  # the source's, untouched (auto-round re-saves them in the newest layout)
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    global_head_dim = json.loads((source / "config.json").read_text())["text_config"]["global_head_dim"]
    tiny._rewrite_release_config(out / "config.json", global_head_dim)
    return out


def _shard_by_index(folder: Path) -> None:
    """Give every weight file the sharded name its index uses.

    auto-round writes model.safetensors plus model_extra_tensors.safetensors (the tensors it did
    not touch, e.g. the decoder's embedding) and an index over both; transformers loads a
    model.safetensors on its own and ignores the index, so the extra tensors would be lost.
    """
    index_path = folder / "model.safetensors.index.json"
    if not index_path.is_file():
        return
    index = json.loads(index_path.read_text())
    files = sorted(set(index["weight_map"].values()))
    if len(files) < 2:
        return
    names = {f: f"model-{i:05d}-of-{len(files):05d}.safetensors" for i, f in enumerate(files, 1)}
    for old, new in names.items():
        (folder / old).rename(folder / new)
    index["weight_map"] = {k: names[v] for k, v in index["weight_map"].items()}
    index["metadata"] = {**index.get("metadata", {}), "total_size": sum(
        _header_bytes(folder / n) for n in names.values())}
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _header(path: Path) -> dict:
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    header.pop("__metadata__", None)
    return header


def _header_bytes(path: Path) -> int:
    return sum(info["data_offsets"][1] - info["data_offsets"][0] for info in _header(path).values())


def describe(folder: str | Path) -> dict:
    """What the checkpoint stores: packed INT4 modules, full-precision tensors, bytes on disk."""
    folder = Path(folder)
    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(_header(path))
    packed = sorted({k.rsplit(".", 1)[0] for k in tensors if k.endswith(".qweight")})
    full = sorted(k for k, v in tensors.items()
                  if v["dtype"] in ("F32", "F16", "BF16") and k.rsplit(".", 1)[0] not in packed)
    return dict(packed=packed, full_precision=full,
                weight_bytes=sum(p.stat().st_size for p in folder.glob("*.safetensors")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", help="an unquantized checkpoint folder (default: build the random preset)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # tiny layers: threads only add overhead
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(args.source) if args.source else _pack().build_checkpoint(Path(tmp) / "random", "random")
        before = describe(source)["weight_bytes"]
        out = quantize(source, args.out)
    after = describe(out)
    print(f"{out}: {before} -> {after['weight_bytes']} bytes of safetensors")
    print(f"packed INT4 ({len(after['packed'])}):", *after["packed"], sep="\n  ")
    print(f"full precision ({len(after['full_precision'])}):", *after["full_precision"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
