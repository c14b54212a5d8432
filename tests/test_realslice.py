"""The real-geometry slice and its AutoRound twin: the published layout, loading, token parity.

Every test runs on the small twin (realslice.SMALL: the same builder and auto-round call at narrower
widths, 128 experts, group 64, built in seconds into the test cache). The real-size slice (2 text
layers at the released widths, vocabulary 262,144; 4.9 GB) and its twin take up to 13 minutes, 9.8 GB
of disk and 24 GB of RAM to build on 2 cores, so its variants run only where it is cached (testing/realslice.py,
~/.cache/dgemma-real-slice) or when DGEMMA_REAL_SLICE=build asks to build it;
benchmarks/real_geometry.py builds it too.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from conftest import cache_base

from diffusiongemma.testing import realscale, realslice


def _available() -> bool:
    if os.environ.get("DGEMMA_REAL_SLICE") == "build":
        return True
    root = realslice.cache_root() / realslice.REAL.name
    return (root / "bf16" / "config.json").is_file() and (root / "int4" / "config.json").is_file()


SIZES = [pytest.param(realslice.SMALL, id="small"),
         pytest.param(realslice.REAL, id="real", marks=pytest.mark.skipif(
             not _available(), reason="real-geometry slice not built (DGEMMA_REAL_SLICE=build)"))]


def _base(size):
    """The small twin lives in the test cache; the real slice in its own (see realslice.cache_root)."""
    return cache_base() if size is realslice.SMALL else None


def slice_dir(size):
    return realslice.slice_dir(size, _base(size))


@pytest.fixture(scope="module", params=SIZES)
def size(request):
    return request.param


@pytest.fixture(scope="module", autouse=True)
def one_thread(size):
    """The small twin's 128 experts are many tiny matmuls: a second thread only spins (10x slower here)."""
    import torch

    threads = torch.get_num_threads()
    if size is realslice.SMALL:
        torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def int4(size):
    return realslice.int4_dir(size, _base(size))


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


def test_twin_has_the_published_layout(size, int4):
    files = headers(int4)
    stored = {k: v for f in files.values() for k, v in f.items()}
    expected = realscale.autoround_layout(realscale.meta_model(size.config()))
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
    # as published: the encoder's embedding and norm in the last numbered shard, after the packed layers
    assert {"model.encoder.language_model.embed_tokens.weight", "model.encoder.language_model.norm.weight"} <= set(
        files[shards[-1]])
    index = json.loads((int4 / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {k: f for f, names in files.items() for k in names}


def test_twin_quantization_config(int4):
    qc = json.loads((int4 / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"], qc["sym"], qc["packing_format"]) == (
        "auto-round", 4, 64, True, "auto_round:auto_gptq")
    routers = {k for k, v in qc["extra_config"].items() if k.endswith("router.proj") and v["bits"] == 16}
    assert len(routers) == 2 * realslice.LAYERS
    expected = realscale.quantization_config(realslice.LAYERS)  # what the pack's meta-device checks assume
    assert {k: qc.get(k) for k in expected} == expected


def test_both_load_through_the_loader_and_generate(size, int4):
    from diffusiongemma.dgemma import Knobs, generate, load_model

    knobs = Knobs(seed=3, num_inference_steps=2, gen_length=256, confidence=0.0)
    for folder, quant in ((slice_dir(size), "none"), (int4, "autoround")):
        dm = load_model(str(folder), quant=quant, device="cpu")
        result = generate(dm, "What is 3+4?", knobs)
        assert len(result.trace) == 2 and result.trace.ids.shape == (2, 256)
        del dm, result


@pytest.mark.pipeline
def test_engine_matches_the_pipeline_on_the_slice(size):
    import torch
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    from diffusiongemma.dgemma import Knobs, generate, load_model

    dm = load_model(str(slice_dir(size)), device="cpu")
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
