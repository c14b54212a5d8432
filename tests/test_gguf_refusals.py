"""Bad GGUF input is refused with the file and the problem named, before any weight is allocated."""

from __future__ import annotations

from pathlib import Path

import pytest

from diffusiongemma.dgemma import load_model
from diffusiongemma.dgemma.demo import DEMO_DIR
from diffusiongemma.testing.gguf_bad import bad_files

pytest.importorskip("gguf")
from diffusiongemma.dgemma.loading import gguf_load  # noqa: E402

GOOD = Path(__file__).parent / "fixtures" / "gguf" / "demo-f32.gguf"


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    return bad_files(GOOD, tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("problem", ["another architecture", "truncated", "metadata disagree with tensors",
                                     "missing tensor", "extra tensor", "unsupported type", "not GGUF at all"])
def test_a_bad_file_is_refused_by_name(bad, problem, monkeypatch):
    path, words = bad[problem]
    allocated = []
    monkeypatch.setattr(gguf_load, "_blocks", lambda *a: allocated.append(a) or pytest.fail("allocated"))
    with pytest.raises(ValueError) as refused:
        load_model(str(path), quant="gguf")
    assert path.name in str(refused.value) and words in str(refused.value), str(refused.value)
    assert not allocated


def test_other_modes_are_refused_for_a_gguf_and_gguf_for_a_folder():
    with pytest.raises(ValueError, match="demo-f32.gguf is a GGUF file.*quant 'gguf'"):
        load_model(str(GOOD), quant="none")
    with pytest.raises(ValueError, match="quant 'gguf' needs a .gguf file"):
        load_model(str(DEMO_DIR), quant="gguf")


def test_auto_picks_gguf_for_a_gguf():
    assert load_model(str(GOOD), quant="auto").quant == "gguf"


def test_without_the_gguf_package_a_gguf_is_refused_naming_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # what `import gguf` meets where it is not installed
    with pytest.raises(ValueError, match="pip install gguf"):
        load_model(str(GOOD), quant="gguf")
