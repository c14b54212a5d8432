"""DGemmaTrace maths: commit heatmap from the committed mask, entropy on a fixed scale, summary."""

from __future__ import annotations

import numpy as np
import pytest

from diffusiongemma.dgemma import CanvasTrace, Knobs
from diffusiongemma.dgemma.readouts import heatmap as hm
from diffusiongemma.dgemma.readouts.states import NEW, NOISE, PALETTE, SETTLED


def trace_of(accepted, entropy=None, blocks=None, stopped=(False, True)) -> CanvasTrace:
    accepted = np.asarray(accepted, bool)
    S, L = accepted.shape
    blocks = np.array(blocks if blocks is not None else [0] * S, np.int16)
    steps = np.concatenate([np.arange((blocks == b).sum()) for b in np.unique(blocks)]).astype(np.int16)
    entropy = np.full((S, L), 1.0) if entropy is None else entropy
    return CanvasTrace(knobs=Knobs(confidence=0.0), canvas_length=L, blocks=blocks, steps=steps,
                       ids=np.zeros((S, L), np.int32), committed_bits=np.packbits(accepted, axis=1),
                       entropy=np.asarray(entropy, np.float16), block_stopped_early=stopped)


MASK = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1],  # block 1
        [0, 1, 0, 0], [1, 1, 0, 1]]                 # block 2
BLOCKS = [0, 0, 0, 1, 1]


def test_commit_heatmap_reads_the_accepted_mask_with_block_separator():
    image = hm.heatmap(trace_of(MASK, blocks=BLOCKS), "commit", 3)
    assert image.dtype == np.float32 and image.shape == (1, (5 + 1) * 3, 4 * 3, 3)
    assert image.min() >= 0 and image.max() <= 1
    cells = np.rint(image[0, ::3, ::3] * 255).astype(int)  # one pixel per cell
    c = lambda colour: list(colour)
    assert cells[0].tolist() == [c(PALETTE[NEW])] + [c(PALETTE[NOISE])] * 3
    assert cells[1].tolist() == [c(PALETTE[SETTLED]), c(PALETTE[NEW])] + [c(PALETTE[NOISE])] * 2
    assert cells[2].tolist() == [c(PALETTE[SETTLED])] * 2 + [c(PALETTE[NEW])] * 2
    assert cells[3].tolist() == [c(hm.SEPARATOR)] * 4
    # A new block starts fresh: what the previous block accepted does not count as held.
    assert cells[4].tolist() == [c(PALETTE[NOISE]), c(PALETTE[NEW])] + [c(PALETTE[NOISE])] * 2
    assert cells[5].tolist() == [c(PALETTE[NEW]), c(PALETTE[SETTLED]), c(PALETTE[NOISE]), c(PALETTE[NEW])]
    # Nearest-neighbour upscale: every cell is a flat cell_px square.
    assert (image[0, 3:6, 0:3] == image[0, 3, 0]).all()


def test_entropy_scale_is_fixed_across_traces():
    a = hm.heatmap(trace_of([[1, 0]], entropy=[[0.5, 0.01]]), "entropy", 1)
    b = hm.heatmap(trace_of([[1, 0]], entropy=[[0.5, 9.0]]), "entropy", 1)
    assert np.array_equal(a[0, 0, 0], b[0, 0, 0]) and not np.array_equal(a[0, 0, 1], b[0, 0, 1])
    ends = hm.heatmap(trace_of([[1, 1, 1]], entropy=[[0.0, hm.ENTROPY_CAP, 40.0]]), "entropy", 1)[0, 0]
    assert np.allclose(ends[0] * 255, hm.RAMP[0]) and np.allclose(ends[1] * 255, hm.RAMP[-1])
    assert np.array_equal(ends[1], ends[2])  # clipped at the cap
    assert hm.entropy_level(np.array([hm.anchor_nats(2)])) == pytest.approx(2 / (len(hm.RAMP) - 1))


@pytest.mark.parametrize("mode, cell_px, words", [("heat", 6, ["mode", "'heat'", "commit", "entropy"]),
                                                  ("commit", 0, ["cell_px", "0", "1 to 32"]),
                                                  ("commit", 2.5, ["cell_px", "2.5"]),
                                                  ("entropy", True, ["cell_px", "True"])])
def test_bad_inputs_name_the_input_value_and_fix(mode, cell_px, words):
    with pytest.raises(ValueError) as err:
        hm.heatmap(trace_of(MASK, blocks=BLOCKS), mode, cell_px)
    for word in words:
        assert word in str(err.value)


def test_summary_is_readable_and_states_legend_and_scale():
    text = hm.summary(trace_of(MASK, blocks=BLOCKS), "entropy")
    assert "EntropyBoundScheduler" in text and "entropy_bound=0.1" in text
    assert "block 1: 3 of 48 steps, no early stop" in text and "block 2: 2 of 48 steps, stopped early" in text
    assert " 25  50 100" in text and "mean entropy 1.000 nats" in text
    assert "0..12.48 nats" in text and "magenta row separates blocks" in text
    assert "new (amber) = newly committed" in hm.summary(trace_of(MASK, blocks=BLOCKS), "commit")


def test_this_run_scale_spreads_a_confident_runs_small_entropies_and_says_so():
    trace = trace_of([[1, 0, 0]], entropy=[[0.001, 0.02, 0.04]])
    fixed = hm.heatmap(trace, "entropy", 1)[0, 0]
    own = hm.heatmap(trace, "entropy", 1, "this run")[0, 0]
    assert np.allclose(fixed[0], fixed[2], atol=0.05)  # one flat colour on the fixed scale
    assert np.abs(own[0] - own[2]).max() > 0.5 and own[2] == pytest.approx(hm.RAMP[-1] / 255, abs=0.01)
    text = hm.summary(trace, "entropy", "this run")
    assert "this run's own range" in text and "0..0.04 nats" in text
    with pytest.raises(ValueError, match="scale must be"):
        hm.heatmap(trace, "entropy", 1, "log")


def test_a_long_run_wraps_into_bands_side_by_side():
    """600 steps of a 32-position canvas was a 1-pixel-wide sliver in a preview: it now wraps into bands, the
    rows in order, each band top to bottom, with no more than half again as tall as wide."""
    rng = np.random.default_rng(0)
    accepted = rng.random((600, 32)) < 0.5
    trace = trace_of(accepted, blocks=[0] * 600, stopped=(False,))
    image = hm.heatmap(trace, "commit", 1)[0]
    tall, wide = image.shape[:2]
    assert tall <= hm.WRAP_ASPECT * wide and tall * wide >= 600 * 32
    bands = hm.band_count(600, 32)
    assert bands > 1 and f"{bands} bands side by side" in hm.summary(trace)
    plain = hm.grid(trace, "commit")
    for b in range(bands):
        x = b * (32 + hm.BAND_GAP)
        rows = plain[b * tall:(b + 1) * tall]
        assert np.array_equal(np.rint(image[:len(rows), x:x + 32] * 255).astype(np.uint8), rows)
    short = trace_of(MASK, blocks=BLOCKS)
    assert hm.band_count(6, 4) == 1 and np.array_equal(hm.wrapped(hm.grid(short, "commit")), hm.grid(short, "commit"))
