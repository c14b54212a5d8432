"""Frame images: deterministic, same-sized, legible cells, no tofu, nothing clipped; run log GIF."""

from __future__ import annotations

import hashlib
import json
import unicodedata

import numpy as np
import pytest
import torch
from PIL import features

from diffusiongemma.dgemma import CanvasTrace, Knobs
from diffusiongemma.dgemma.readouts import images
from diffusiongemma.dgemma.readouts.fonts import BLANK, SUBSTITUTE, WIDE_SUBSTITUTE, default_atlas
from diffusiongemma.testing.tiny_tokenizer import _filler_pieces

VOCAB = ["<pad>", "<turn|>", " The", " quick", " brown", " fox", "\n", " jumps", "Привет", " λόγος",
         "中文", "한국어", "ไทย", "\ufffd", " over", "supercalifragilistic", " the", " lazy", " dog", "."]


def make_trace(L=64, steps=(6, 4), seed=0, vocab=VOCAB, stopped=None) -> CanvasTrace:
    """A trace that anneals toward fixed target ids, block by block, with per-step masks."""
    rng = np.random.default_rng(seed)
    rows = []
    for b, n in enumerate(steps):
        target = rng.integers(0, len(vocab), L)
        order = rng.permutation(L)
        for s in range(n):
            acc = np.zeros(L, bool)
            acc[order[:L * (s + 1) // n]] = True
            ids = np.where(acc, target, rng.integers(0, len(vocab), L))
            rows.append((b, s, ids, acc, np.where(acc, 0.05, 4.0)))
    col = lambda k, dt: np.array([r[k] for r in rows], dt)
    return CanvasTrace(knobs=Knobs(confidence=0.0), canvas_length=L, blocks=col(0, np.int16),
                       steps=col(1, np.int16), ids=col(2, np.int32),
                       committed_bits=np.packbits(col(3, bool), axis=1), entropy=col(4, np.float16),
                       block_stopped_early=stopped or (False,) * len(steps))


def test_golden_hash_is_deterministic():
    frames = images.render_frames(make_trace(), VOCAB)
    again = images.render_frames(make_trace(), VOCAB)
    assert np.array_equal(frames, again)
    digest = hashlib.sha256(frames.tobytes()).hexdigest()
    # Antialiased glyph pixels belong to the FreeType that Pillow bundles, so goldens are per version.
    freetype = features.version("freetype2")
    if freetype not in GOLDEN:
        pytest.skip(f"no golden for FreeType {freetype}; add {digest} after checking the frames by eye")
    assert digest == GOLDEN[freetype], "the frames changed: layout, palette, font or glyph rendering"


GOLDEN = {"2.14.3": "97a1830f90c51eae857bdab15b9cfa6b0209272f100cfa75071123d08b018be5"}


def test_frames_same_size_across_steps_and_blocks_and_fit_the_budget():
    trace = make_trace(L=256, steps=(5, 3))
    frames = images.render_frames(trace, VOCAB)
    assert frames.shape == (8, 288, 576, 3) and frames.dtype == np.uint8
    assert frames.shape[1] * frames.shape[2] * 3 * 4 <= 2_000_000  # float32 IMAGE bytes per frame


def test_image_tensor_convention():
    frames = images.render_frames(make_trace(), VOCAB)
    tensor = images.render_images(make_trace(), VOCAB)  # what the sampler node outputs
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == frames.shape and tensor.shape[-1] == 3
    assert float(tensor.min()) >= 0.0 and float(tensor.max()) <= 1.0
    assert torch.equal(tensor, torch.from_numpy(frames).float() / 255)


def test_multilingual_noise_draws_glyphs_or_the_substitute_never_tofu():
    atlas = default_atlas()
    pieces = _filler_pieces(3000, seed=0)  # the real-vocabulary checkpoint's filler pieces
    renderer = images.FrameRenderer(256)
    for piece in pieces:
        renderer.units(piece.replace("▁", " "))
    stack = atlas.stack
    assert not any(np.array_equal(tile, atlas.notdef) for tile in stack), "a .notdef box was drawn"
    drawn_in_cells = lambda c: c != "▁" and unicodedata.category(c) not in ("Mn", "Me", "Cc", "Cf")
    chars = {c for p in pieces for c in unicodedata.normalize("NFC", p) if drawn_in_cells(c)}
    missing = {c for c in chars if not atlas.drawable(c)}
    assert missing and missing <= atlas.substituted
    for c in missing:
        assert atlas.tiles(c) == (WIDE_SUBSTITUTE if unicodedata.east_asian_width(c) in "WF" else (SUBSTITUTE,))
    assert atlas.tiles("中") == WIDE_SUBSTITUTE and atlas.tiles("ক") == (SUBSTITUTE,)
    for drawn in "ЖλéßA":
        assert atlas.tiles(drawn)[0] > max(WIDE_SUBSTITUTE)
    assert stack[SUBSTITUTE].any() and not np.array_equal(stack[SUBSTITUTE], atlas.notdef)


def _glyph_cells(renderer, tokens):
    tiles, owner = renderer.fit(tokens)
    return sum(t != BLANK for t in tiles), len(tiles) // renderer.cols


def test_long_runs_without_spaces_wrap_inside_the_base_frame():
    renderer = images.FrameRenderer(256)
    cells, rows = _glyph_cells(renderer, ["abcdefgh"] * 256)
    assert cells == 2048 and rows <= renderer.base_rows
    trace = make_trace(L=256, steps=(2,), vocab=["abcdefgh"])
    assert images.render_frames(trace, ["abcdefgh"]).shape[1:3] == (288, 576)


def test_runs_break_at_token_boundaries_when_they_can():
    renderer = images.FrameRenderer(256)
    tiles, owner = renderer.fit(["abc"] * 100)
    cols = renderer.cols
    rows = [[o for o in owner[r * cols:(r + 1) * cols] if o >= 0] for r in range(len(owner) // cols)]
    assert sum(map(len, rows)) == 300 and all(len(r) % 3 == 0 for r in rows)
    assert all(row.count(row[0]) == 3 for row in rows)  # no token is split over two rows


def test_overflow_grows_every_frame_instead_of_clipping():
    renderer = images.FrameRenderer(16)
    tokens = ["x" * 30] * 16
    cells, rows = _glyph_cells(renderer, tokens)
    assert cells == 480 and rows > renderer.base_rows
    states = [np.zeros(16, np.uint8)] * 2
    out = renderer.render([tokens, ["y"] * 16], states, [[("a", images.CAPTION)]] * 2)
    assert out.shape[1] == renderer.size(rows)[0] and out[0].shape == out[1].shape


def test_newlines_break_lines_then_show_inline_when_they_would_not_fit():
    renderer = images.FrameRenderer(32)
    tiles, _ = renderer.fit([" a", "\n", " b"])
    assert len(tiles) // renderer.cols == 2
    mark = renderer.units(images.NEWLINE_MARK)[0]
    tiles, _ = renderer.fit(["w\n"] * 32)
    assert tiles.count(mark) == 32 and len(tiles) // renderer.cols <= renderer.base_rows


def test_wide_characters_never_split_across_rows():
    renderer = images.FrameRenderer(64)
    tiles, _ = renderer.fit(["a"] + ["中"] * 100)
    cols = renderer.cols
    for r in range(len(tiles) // cols):
        row = tiles[r * cols:(r + 1) * cols]
        assert row[-1] != WIDE_SUBSTITUTE[0] and row[0] != WIDE_SUBSTITUTE[1]


def test_accepted_positions_bright_new_amber_noise_dim():
    vocab = ["\u2588"]  # a full block: pixels of exactly the state colour
    trace = make_trace(L=8, steps=(2,), vocab=vocab)
    frames = images.render_frames(trace, vocab, legend=False)
    states = trace.states()
    assert (states[0][trace.committed[0]] == images.NEW).all()
    text = frames[:, images.MARGIN_Y + 12 + images.CAPTION_GAP:]
    colours = lambda f: {tuple(p) for p in f.reshape(-1, 3)}
    assert images.COLOURS[images.NEW] in colours(text[0]) and images.COLOURS[images.NOISE] in colours(text[0])
    assert images.COLOURS[images.SETTLED] in colours(text[1])
    assert images.COLOURS[images.NOISE] not in colours(text[1])  # the last step accepts all


def test_caption_is_block_local_with_the_blocks_own_total():
    trace = make_trace(L=16, steps=(6, 4), stopped=(False, True))
    caps = [c[0][0] for c in images.captions(trace)]
    assert caps[0].startswith("block 1/2  step 1/6  T 0.800")
    assert caps[6].startswith("block 2/2  step 1/4") and caps[-1].endswith("committed 100.0%")


def _load_tool():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "runlog_gif.py"
    spec = importlib.util.spec_from_file_location("runlog_gif", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runlog_gif_refuses_logs_it_cannot_replay(tmp_path, capsys):
    runlog_gif = _load_tool()
    log, gif = tmp_path / "run.jsonl", tmp_path / "run.gif"
    header = {"record_type": "header", "schema": "dg-runlog/1", "canvas_length": 8}
    old_frame = {"record_type": "frame", "block": 0, "step": 0, "decoded_text": "abc", "canvas_ids": [0] * 8}
    log.write_text("\n".join(json.dumps(r) for r in (header, old_frame)) + "\n")
    assert runlog_gif.main([str(log), str(gif)]) == 2
    assert "per-position tokens" in capsys.readouterr().err
    log.write_text(json.dumps({"record_type": "header", "schema": "other/9"}) + "\n")
    assert runlog_gif.main([str(log), str(gif)]) == 2
    assert not gif.exists()
