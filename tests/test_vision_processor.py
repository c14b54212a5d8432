"""The real Gemma4Processor (needs torchvision): a turn with an image is what the processor makes of it.

Skipped where torchvision is missing (its video processor imports it); ComfyUI always has it.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import checkpoint

from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.inputs.tokens import prompt_ids
from diffusiongemma.dgemma.inputs.vision import prepare_images, to_uint8

pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def real_processor_model(tmp_path_factory):
    """A tiny checkpoint that ships a full Gemma4Processor (processor_config.json), loaded by the pack."""
    from transformers import AutoTokenizer, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor

    folder = tmp_path_factory.mktemp("gemma4proc") / "ckpt"
    shutil.copytree(checkpoint("random"), folder)
    (folder / "preprocessor_config.json").unlink()
    tok = AutoTokenizer.from_pretrained(folder)
    processor = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(),
                                image_processor=Gemma4ImageProcessor(max_soft_tokens=70), tokenizer=tok,
                                video_processor=Gemma4VideoProcessor(), chat_template=tok.chat_template,
                                image_seq_length=70)
    processor.save_pretrained(folder)
    return load_model(str(folder)), processor


def test_the_pack_loads_the_real_processor(real_processor_model):
    dm, _ = real_processor_model
    assert type(dm.processor).__name__ == "Gemma4Processor"
    assert dm.image_processor is dm.processor.image_processor


@pytest.mark.parametrize("size", [(64, 64), (96, 48), (700, 300)])
def test_turn_ids_and_pixels_match_the_processors_chat_template(real_processor_model, size):
    from PIL import Image

    dm, processor = real_processor_model
    image = colour_image("magenta", *size)
    pil = Image.fromarray(to_uint8(image)[0])
    messages = [{"role": "user", "content": [{"type": "image", "image": pil},
                                             {"type": "text", "text": "What colour is this?"}]}]
    theirs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    images = prepare_images(dm, image)
    ours = prompt_ids(dm, "What colour is this?", False, images=images)
    assert ours == theirs["input_ids"][0].tolist()
    assert torch.allclose(images.pixel_values, theirs["pixel_values"].to(images.pixel_values.dtype), atol=1e-6)
    assert np.array_equal(images.position_ids.numpy(), theirs["image_position_ids"].numpy())


def test_a_run_through_the_real_processor(real_processor_model):
    dm, _ = real_processor_model
    result = generate(dm, "What colour is this?", Knobs(seed=1, num_inference_steps=3, gen_length=8, confidence=0),
                      image=colour_image("red", 64, 64))
    assert result.config.image["count"] == 1 and result.state.steps_used == 3
