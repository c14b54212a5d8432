"""GGUF dequantization in torch equals the gguf package's numpy reference, bit for bit."""

from pathlib import Path

import numpy as np
import pytest
import torch

from dgemma.loading import gguf_quants

gguf = pytest.importorskip("gguf")

FILES = sorted((Path(__file__).parent / "fixtures" / "gguf").glob("*.gguf"))


def same(ours: torch.Tensor, ref: np.ndarray) -> bool:
    """Equal values, NaN where the reference has NaN (a random f16 scale can be NaN or infinite)."""
    return np.array_equal(ours.numpy(), np.asarray(ref, dtype=np.float32), equal_nan=True)


@pytest.mark.parametrize("qtype", sorted(gguf_quants.TYPES), ids=lambda t: gguf_quants.type_name(t))
def test_random_blocks_match_the_reference(qtype):
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


def test_every_tensor_of_the_shipped_files_matches():
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
