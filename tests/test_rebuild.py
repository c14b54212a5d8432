"""Test checkpoints rebuild byte for byte from their recipe: a cache built elsewhere can never change a result."""

from __future__ import annotations

import hashlib
from pathlib import Path

from conftest import cache_base, checkpoint

from diffusiongemma.testing import realslice, tiny


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def test_the_tiny_checkpoint_rebuilds_byte_for_byte(tmp_path):
    assert digests(tiny.build_checkpoint(tmp_path / "random", "random")) == digests(checkpoint("random"))


def test_the_small_real_geometry_slice_rebuilds_byte_for_byte(tmp_path):
    cached = realslice.slice_dir(realslice.SMALL, cache_base())
    (tmp_path / "small").mkdir()
    again = realslice.build_slice(tmp_path / "small", size=realslice.SMALL)
    assert digests(again) == digests(cached)  # every tensor set, none left as the memory's garbage
