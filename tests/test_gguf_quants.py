"""GGUF dequantization equals the gguf package's numpy reference, bit for bit: numba's one-pass kernels on
the CPU, and torch's (what an accelerator runs, and the CPU without numba)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from dgemma.loading import gguf_numba, gguf_quants

gguf = pytest.importorskip("gguf")

FILES = sorted((Path(__file__).parent / "fixtures" / "gguf").glob("*.gguf"))


def same(ours: torch.Tensor, ref: np.ndarray) -> bool:
    """Equal values, NaN where the reference has NaN (a random f16 scale can be NaN or infinite)."""
    return np.array_equal(ours.numpy(), np.asarray(ref, dtype=np.float32), equal_nan=True)


@pytest.fixture(params=["numba", "torch"])
def engine(request, monkeypatch):
    """Each test once through numba's kernels and once through torch's alone (numba's taken away)."""
    if request.param == "numba":
        pytest.importorskip("numba")
        assert {2, 3, 6, 7, 8, 12, 13, 14} <= set(gguf_numba.KERNELS)
    else:
        monkeypatch.setattr(gguf_numba, "KERNELS", {})
    return request.param


@pytest.mark.parametrize("qtype", sorted(gguf_quants.TYPES), ids=lambda t: gguf_quants.type_name(t))
def test_random_blocks_match_the_reference(qtype, engine):
    _, size, nbytes = gguf_quants.TYPES[qtype]
    rng = np.random.default_rng(qtype)
    raw = rng.integers(0, 256, size=(24, 8 * nbytes), dtype=np.uint8)
    with np.errstate(all="ignore"):  # NaN scales are part of the test
        ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))
    ours = gguf_quants.dequantize(torch.from_numpy(raw), qtype, ref.shape)
    assert ours.dtype == torch.float32
    assert same(ours, ref)
    chunked = gguf_quants.dequantize(torch.from_numpy(raw), qtype, ref.shape, chunk_rows=5)
    assert same(chunked, ref)


def test_every_tensor_of_the_shipped_files_matches(engine):
    assert len(FILES) == 3
    seen = set()
    for path in FILES:
        for t in gguf.GGUFReader(path).tensors:
            raw = np.ascontiguousarray(t.data).view(np.uint8)
            ref = gguf.quants.dequantize(raw, t.tensor_type)
            ours = gguf_quants.dequantize(torch.from_numpy(raw.copy()), int(t.tensor_type), ref.shape)
            assert same(ours, ref), (path.name, t.name)
            seen.add(t.tensor_type.name)
    assert {"F32", "Q8_0", "Q5_0", "Q4_K"} <= seen


def test_an_unsupported_type_is_refused_by_name():
    with pytest.raises(ValueError, match="IQ2_XXS|type 16"):
        gguf_quants.dequantize(torch.zeros(1, 66, dtype=torch.uint8), 16, (256,))


KERNEL_TYPES = sorted(set(gguf_quants.KERNELS) | set(gguf_numba.KERNELS))


def reference(qtype: int, blocks: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random bytes of `blocks` blocks of `qtype` (NaN and infinite scales among them) and the reference."""
    nbytes = gguf_quants.TYPES[qtype][2]
    raw = np.random.default_rng(seed).integers(0, 256, size=(blocks, nbytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        return raw, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: gguf_quants.type_name(t))
def test_chunks_batches_and_threads_match_the_reference(qtype, threads, dtype, engine, monkeypatch):
    """Chunks of 5 blocks, scales made for 10 at once: 37 blocks end in a short batch and a short chunk."""
    size = gguf_quants.TYPES[qtype][1]
    monkeypatch.setattr(gguf_quants, "CPU_CHUNK", 5 * size)
    monkeypatch.setattr(gguf_quants, "SCALE_BATCH", 12 * size)
    raw, ref = reference(qtype, 37, 100 + qtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full(ref.shape, 7.0, dtype=dtype)
        ours = gguf_quants.dequantize(torch.from_numpy(raw), qtype, ref.shape, dtype, out=out)
    finally:
        torch.set_num_threads(before)
    assert ours.data_ptr() == out.data_ptr()
    expected = torch.from_numpy(np.asarray(ref, dtype=np.float32)).to(dtype)
    assert np.array_equal(ours.float().numpy(), expected.float().numpy(), equal_nan=True)


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: gguf_quants.type_name(t))
def test_blocks_at_an_odd_offset_match_the_reference(qtype, engine):
    """Bytes the kernels cannot view as wider types where they lie are read the same."""
    raw, ref = reference(qtype, 9, 200 + qtype)
    shifted = torch.zeros(raw.size + 1, dtype=torch.uint8)
    shifted[1:] = torch.from_numpy(raw).reshape(-1)
    ours = gguf_quants.dequantize(shifted[1:].view(raw.shape), qtype, ref.shape)
    assert same(ours, ref)
    assert shifted[1:].view(raw.shape).numpy().tobytes() == raw.tobytes()  # its bytes left as they were


def test_q5_k_scales_leave_a_single_block_as_it_was():
    raw, ref = reference(13, 1, 300)
    blocks = torch.from_numpy(raw.copy())
    assert same(gguf_quants.dequantize(blocks, 13, ref.shape), ref)
    assert blocks.numpy().tobytes() == raw.tobytes()
