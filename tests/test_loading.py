"""Loading: every refusal comes with its fix and before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest

from diffusiongemma.dgemma import load_model, versions
from diffusiongemma.dgemma.loading import preflight
from diffusiongemma.dgemma.loading.deviceplan import GIB, Need, plan
from diffusiongemma.nodes import host

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture
def no_weights_read(monkeypatch):
    from transformers import DiffusionGemmaForBlockDiffusion

    def refuse(*args, **kwargs):
        pytest.fail("weights were read")

    monkeypatch.setattr(DiffusionGemmaForBlockDiffusion, "from_pretrained", refuse)


def copy_of(tiny_dir, tmp_path, without=()):
    folder = shutil.copytree(tiny_dir, tmp_path / "ckpt")
    for name in without:
        (folder / name).unlink()
    return folder


def test_folder_without_config(tmp_path, no_weights_read):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        load_model(str(tmp_path / "empty"))


def test_truncated_weights(tiny_dir, tmp_path, no_weights_read):
    folder = copy_of(tiny_dir, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ValueError, match="model.safetensors is truncated"):
        load_model(str(folder))


def test_missing_tokenizer(tiny_dir, tmp_path, no_weights_read):
    folder = copy_of(tiny_dir, tmp_path, without=TOKENIZER_FILES)
    with pytest.raises(ValueError, match="no tokenizer matching the model"):
        load_model(str(folder))


def test_quant_mismatch_is_refused(tiny_dir, no_weights_read):
    with pytest.raises(ValueError, match="needs an AutoRound checkpoint.*has no quantization_config"):
        load_model(str(tiny_dir), quant="autoround")
    with pytest.raises(ValueError, match="quant must be one of"):
        load_model(str(tiny_dir), quant="q4_k_m")
    with pytest.raises(ValueError, match="quant 'gguf' needs a .gguf file"):
        load_model(str(tiny_dir), quant="gguf")


def test_unknown_source_and_offline_hub_id(no_weights_read):
    with pytest.raises(ValueError, match="neither a checkpoint folder nor a hub id"):
        load_model("/no/such/folder")
    with pytest.raises(ValueError, match="cannot read the config"):
        load_model("google/diffusiongemma-26B-A4B-it", local_files_only=True)


def test_processor_falls_back_to_the_tokenizer(tiny_dir, tmp_path):
    folder = copy_of(tiny_dir, tmp_path)
    config = folder / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("processor_class")
    config.write_text(json.dumps(data))
    dm = load_model(str(folder))
    assert dm.processor is dm.tokenizer and dm.eos_ids == (1, 106) and dm.channel_ids == (100, 101)


def test_dtype_choice_and_size(tiny_dir):
    stored, per_dtype = preflight.checkpoint_bytes(tiny_dir)
    assert set(per_dtype) == {"F32"}
    import torch

    assert preflight.loaded_bytes(stored, per_dtype, torch.bfloat16) == stored // 2
    assert load_model(str(tiny_dir), dtype="bfloat16").dtype == "bfloat16"


def test_preflight_refuses_what_cannot_fit_and_plans_offload():
    need = Need(50 * GIB, 50 * GIB)
    with pytest.raises(ValueError, match=r"needs 50.0 GiB but only 8.0 GiB of RAM is free"):
        plan(need, "cpu", ram=8 * GIB, vram=0)
    with pytest.raises(ValueError, match="device cuda keeps it whole on the GPU.*quant none with device auto"):
        plan(need, "cuda", ram=64 * GIB, vram=24 * GIB)
    with pytest.raises(ValueError, match="GPU and RAM together have 37.9 GiB to spare"):
        plan(need, "auto", ram=16 * GIB, vram=24 * GIB)
    offload = plan(need, "auto", ram=64 * GIB, vram=24 * GIB)
    assert offload.device_map == "sequential" and offload.max_memory == {0: int(23.5 * GIB), "cpu": int(64 * GIB * 0.9)}
    assert offload.streamed == int(26.5 * GIB) and "26.5 GiB of weights stay in CPU RAM" in offload.note
    assert plan(Need(10 * GIB, 10 * GIB), "auto", ram=64 * GIB, vram=24 * GIB).device_map == {"": 0}


def test_the_step_and_the_dropped_copies_count():
    assert Need(20 * GIB, 12 * GIB, 2 * GIB).peak == 20 * GIB  # loading holds every copy
    assert Need(20 * GIB, 19 * GIB, 2 * GIB).peak == 21 * GIB  # a run holds the resident weights and a step
    with pytest.raises(ValueError, match="needs 21.0 GiB on the GPU"):
        plan(Need(20 * GIB, 19 * GIB, 2 * GIB), "cuda", ram=64 * GIB, vram=21 * GIB)


def test_cuda_asked_without_a_gpu(tiny_dir, no_weights_read):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        load_model(str(tiny_dir), device="cuda")


@pytest.mark.parametrize("name", ["..", ".", "a/b", "a\\b", "../x", ""])
def test_model_folder_names_cannot_escape(name):
    with pytest.raises(ValueError, match="single folder name"):
        host.resolve_local_model(name)


@pytest.mark.parametrize("found, words", [
    ({"transformers": (5, 12, 0), "diffusers": (0, 42, 1)}, "needs transformers 5.13 to 5.25 (found 5.12.0)"),
    ({"transformers": (5, 26, 0), "diffusers": (0, 42, 1)}, "needs transformers 5.13 to 5.25 (found 5.26.0)"),
    ({"transformers": None, "diffusers": (0, 42, 1)}, "(found not installed)"),
    ({"transformers": (5, 23, 0), "diffusers": (0, 38, 0)}, "needs diffusers 0.39 or newer (found 0.38.0)"),
])
def test_version_guard_names_the_fix(monkeypatch, found, words):
    monkeypatch.setattr(versions, "_release", lambda dist: found[dist])
    with pytest.raises(ImportError) as err:
        versions.check_versions()
    assert words in str(err.value) and 'pip install "transformers>=5.13,<5.26"' in str(err.value)


def test_cache_argument_name_follows_the_signature():
    def old(self, past_key_values=None):
        pass

    def new(self, cache=None):
        pass

    assert versions.cache_kw(old) == "past_key_values" and versions.cache_kw(new) == "cache"
