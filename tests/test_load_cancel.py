"""Cancel during loading: the load stops between tensors, so a cancel after one shard never reaches the next.

transformers 5.x opens every shard lazily and places tensors in the order of their names, not
shard by shard; the checkpoint here is split so its first shard holds the first half of that order.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import core_model_loading as cml

from diffusiongemma.dgemma import load_model
from diffusiongemma.dgemma.errors import LoadCancelled
from diffusiongemma.dgemma.loading.load import cancel_checks

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


@pytest.fixture
def sharded(tiny_dir, tmp_path) -> tuple[Path, list[set[str]]]:
    """A copy of the tiny checkpoint in two shards, the first holding the tensors transformers places first."""
    folder = Path(shutil.copytree(tiny_dir, tmp_path / "ckpt"))
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    order = sorted(tensors, key=cml.dot_natural_key)
    halves = [order[: len(order) // 2], order[len(order) // 2:]]
    for name, keys in zip(SHARDS, halves):
        save_file({k: tensors[k] for k in keys}, folder / name, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    weight_map = {k: name for name, keys in zip(SHARDS, halves) for k in keys}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return folder, [set(h) for h in halves]


@pytest.fixture
def placed(monkeypatch) -> list[str]:
    """Names of the tensors transformers puts into the model, in order."""
    names, original = [], cml.set_param_for_module

    def spy(model, target_name, *args, **kwargs):
        names.append(target_name)
        return original(model, target_name, *args, **kwargs)

    monkeypatch.setattr(cml, "set_param_for_module", spy)
    return names


def test_cancel_after_the_first_shard_stops_before_the_second(sharded, placed):
    folder, (first, second) = sharded
    with pytest.raises(LoadCancelled, match=f"after {len(first)} tensors"):
        load_model(str(folder), should_cancel=lambda: first <= set(placed))
    assert set(placed) == first and not set(placed) & second
    assert cml.set_param_for_module.__name__ == "spy"  # our wrapper is gone again


def test_an_interrupt_raised_by_the_check_propagates(sharded, placed):
    class Interrupted(Exception):  # ComfyUI's check raises its own exception instead of returning True
        pass

    def interrupt():
        if len(placed) >= 3:
            raise Interrupted
        return False

    with pytest.raises(Interrupted):
        load_model(str(sharded[0]), should_cancel=interrupt)
    assert len(placed) == 3


def test_without_a_cancel_the_sharded_checkpoint_loads_whole(sharded, placed):
    folder, (first, second) = sharded
    checks = []
    dm = load_model(str(folder), should_cancel=lambda: checks.append(1) and False)
    assert set(placed) == first | second and len(checks) == len(placed)
    assert dm.model is not None and cml.set_param_for_module.__name__ == "spy"


def test_no_hook_point_or_no_check_leaves_transformers_as_it_was(monkeypatch):
    original = cml.set_param_for_module
    with cancel_checks(None):  # nothing to check: nothing wrapped
        assert cml.set_param_for_module is original
    with cancel_checks(lambda: False):
        assert cml.set_param_for_module is not original
    assert cml.set_param_for_module is original
    monkeypatch.delattr(cml, "set_param_for_module")  # another transformers: no hook point, none made
    with cancel_checks(lambda: True):
        assert not hasattr(cml, "set_param_for_module")
    assert not hasattr(cml, "set_param_for_module")


def test_both_cancels_are_the_engines_errors_wherever_they_are_named():
    from diffusiongemma.dgemma import Cancelled, errors
    from diffusiongemma.dgemma.denoising import loop
    from diffusiongemma.dgemma.loading import load

    assert errors.Cancelled is Cancelled is loop.Cancelled and errors.LoadCancelled is load.LoadCancelled
    assert str(Cancelled(3)) == "run cancelled after 3 steps" and Cancelled(3).steps_done == 3
