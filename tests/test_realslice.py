"""The real-geometry slice and its AutoRound twin: the published layout, loading, token parity.

The slice (2 real-size text layers, vocabulary 262,144; 4.9 GB) and its twin take ~11 minutes
and ~8 GB to build on 2 cores, so these tests run only where they are cached
(testing/realslice.py, ~/.cache/dgemma-real-slice) or when DGEMMA_REAL_SLICE=build asks to
build them; benchmarks/real_geometry.py builds them too.
"""

from __future__ import annotations

import json
import os
import struct

import pytest

from diffusiongemma.testing import realscale, realslice


def _available() -> bool:
    if os.environ.get("DGEMMA_REAL_SLICE") == "build":
        return True
    root = realslice.cache_root()
    return (root / "bf16" / "config.json").is_file() and (root / "int4" / "config.json").is_file()


pytestmark = pytest.mark.skipif(not _available(), reason="real-geometry slice not built (DGEMMA_REAL_SLICE=build)")


def headers(folder) -> dict[str, dict[str, tuple[str, tuple[int, ...]]]]:
    """file name -> tensor name -> (dtype, shape)."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            head = json.loads(fh.read(n))
        head.pop("__metadata__", None)
        out[path.name] = {k: (v["dtype"], tuple(v["shape"])) for k, v in head.items()}
    return out


@pytest.fixture(scope="module")
def int4():
    return realslice.int4_dir()


def test_twin_has_the_published_layout(int4):
    files = headers(int4)
    stored = {k: v for f in files.values() for k, v in f.items()}
    expected = realscale.autoround_layout(realscale.meta_model(realscale.real_config(
        realslice.LAYERS, realslice.VISION_LAYERS)))
    # auto-round saves a tied tensor once per shard. In the published checkpoint an encoder layer and
    # its decoder twin are 30 layers apart, in different shards, so both router scales are stored;
    # the slice's layers share one shard, so the decoder's tied router scales are saved once (as the
    # encoder's) and load through the tie.
    deduped = {k for k in expected if k.startswith("model.decoder.layers.") and
               k.endswith(("router.scale", "router.per_expert_scale"))}
    assert len(deduped) == 2 * realslice.LAYERS
    assert stored == {k: v for k, v in expected.items() if k not in deduped}  # names, dtypes, shapes
    assert {d for d, _ in stored.values()} == {"I32", "F16", "BF16"}
    assert "model.decoder.layers.1.experts.127.down_proj.qweight" in stored  # multi-digit indices
    shards = sorted(f for f in files if f != "model_extra_tensors.safetensors")
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert len(shards) >= 2
    assert set(files["model_extra_tensors.safetensors"]) == {"model.decoder.embed_tokens.weight",
                                                             "model.decoder.norm.weight"}
    index = json.loads((int4 / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {k: f for f, names in files.items() for k in names}


def test_twin_quantization_config(int4):
    qc = json.loads((int4 / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["sym"], qc["packing_format"]) == (
        "auto-round", 4, 64, True, "auto_round:auto_gptq")
    routers = {k for k, v in qc["extra_config"].items() if k.endswith("router.proj") and v["bits"] == 16}
    assert len(routers) == 2 * realslice.LAYERS


def test_both_load_through_the_loader_and_generate(int4):
    from diffusiongemma.dgemma import Knobs, generate, load_model

    knobs = Knobs(seed=3, num_inference_steps=2, gen_length=256, confidence=0.0)
    for folder, quant in ((realslice.slice_dir(), "none"), (int4, "autoround")):
        dm = load_model(str(folder), quant=quant, device="cpu")
        result = generate(dm, "What is 3+4?", knobs)
        assert len(result.trace) == 2 and result.trace.ids.shape == (2, 256)
        del dm, result


@pytest.mark.pipeline
def test_engine_matches_the_pipeline_on_the_slice():
    import torch
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    from diffusiongemma.dgemma import Knobs, generate, load_model

    dm = load_model(str(realslice.slice_dir()), device="cpu")
    for confidence in (0.005, 0.0):
        knobs = Knobs(seed=3, num_inference_steps=3, gen_length=256, confidence=confidence)
        ours = generate(dm, "What is 3+4?", knobs)
        scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                          num_inference_steps=knobs.num_inference_steps)
        pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
        out = pipe(prompt="What is 3+4?", gen_length=256, num_inference_steps=3,
                   confidence_threshold=confidence or None, generator=torch.Generator().manual_seed(3),
                   eos_early_stop=False, output_type="seq")
        assert list(ours.state.raw_ids) == out.sequences[0].tolist()
