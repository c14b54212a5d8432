"""Images in the turn and in encoded context: the processor path, what the encoder sees, records, refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.tokens import frame_texts, prompt_ids
from diffusiongemma.dgemma.inputs.vision import MAX_IMAGES, prepare_images
from diffusiongemma.dgemma.readouts.runlog import records

Sampler, Denoise, Encode = (NODE_CLASS_MAPPINGS[n] for n in ("DGemmaSampler", "DGemmaDenoise", "DGemmaEncode"))
FAST = Knobs(seed=5, num_inference_steps=3, gen_length=8, confidence=0.0)
IMAGE_ID, BOI_ID, EOI_ID = 109, 108, 110


@pytest.fixture
def encoder_calls(tiny_model, monkeypatch):
    """Every encoder forward's ids and image tensors, with the real forward still run."""
    encoder = tiny_model.model.model.encoder
    seen, forward = [], encoder.forward

    def spy(*args, **kwargs):
        seen.append({k: kwargs.get(k) for k in ("input_ids", "pixel_values", "image_position_ids",
                                                "mm_token_type_ids")})
        return forward(*args, **kwargs)

    monkeypatch.setattr(encoder, "forward", spy)
    return seen


def red(width=64, height=64):
    return colour_image("red", width, height)


def test_tiny_checkpoints_ship_an_image_processor(tiny_dir, tiny_model):
    assert (tiny_dir / "preprocessor_config.json").is_file()
    assert tiny_model.image_processor is not None and tiny_model.processor is tiny_model.tokenizer


def test_the_encoder_reads_the_image_soft_tokens(tiny_model, encoder_calls):
    result = generate(tiny_model, "What colour is this?", FAST, image=red())
    prefill = encoder_calls[0]
    ids = prefill["input_ids"][0].tolist()
    soft = ids.count(IMAGE_ID)
    assert soft == 64 and ids.count(BOI_ID) == ids.count(EOI_ID) == 1
    assert ids[ids.index(BOI_ID) + 1:ids.index(EOI_ID)] == [IMAGE_ID] * soft  # one block, before the text
    assert prefill["pixel_values"].shape == (1, 630, 768) and prefill["image_position_ids"].shape == (1, 630, 2)
    assert prefill["mm_token_type_ids"][0].sum() == soft
    # The image lives in the prefill only: later forwards (committed blocks) carry no pixels, and
    # the canvas is the model's canvas length, with no room made for image tokens.
    assert all(c["pixel_values"] is None for c in encoder_calls[1:])
    assert result.trace.ids.shape[1] == tiny_model.canvas_length


def test_the_image_changes_the_run_and_a_seed_repeats_it(tiny_model):
    knobs = dataclasses.replace(FAST, confidence=0.0)
    first, again = (generate(tiny_model, "Describe it.", knobs, image=red()) for _ in range(2))
    blue = generate(tiny_model, "Describe it.", knobs, image=colour_image("blue", 64, 64))
    text = generate(tiny_model, "Describe it.", knobs)
    assert np.array_equal(first.trace.ids, again.trace.ids) and first.state == again.state
    assert np.array_equal(first.trace.entropy, again.trace.entropy)
    assert not np.array_equal(first.trace.entropy, blue.trace.entropy)
    assert not np.array_equal(first.trace.entropy, text.trace.entropy)


def test_user_text_stays_text_beside_an_image(tiny_model):
    images = prepare_images(tiny_model, red())
    ids = prompt_ids(tiny_model, "<|image|><image|> what?", False, images=images)
    assert ids.count(IMAGE_ID) == 64 and ids.count(BOI_ID) == ids.count(EOI_ID) == 1
    assert ids[:3] == [2, 105, *tiny_model.tokenizer.encode("u", add_special_tokens=False)]
    plain = prompt_ids(tiny_model, "<|image|><image|> what?", False)
    assert IMAGE_ID not in plain and plain == [i for i in ids if i not in (IMAGE_ID, BOI_ID, EOI_ID)]


def test_a_batch_is_one_turn_with_several_images(tiny_model, encoder_calls):
    batch = torch.cat([red(), colour_image("green", 64, 64)])
    result = generate(tiny_model, "Which two colours?", FAST, image=batch)
    ids = encoder_calls[0]["input_ids"][0].tolist()
    assert ids.count(BOI_ID) == 2 and ids.count(IMAGE_ID) == 128
    assert encoder_calls[0]["pixel_values"].shape[0] == 2
    assert result.config.image["count"] == 2 and result.config.image["sizes"] == [[64, 64], [64, 64]]


def test_an_image_alone_is_a_turn(tiny_model, encoder_calls):
    generate(tiny_model, "", FAST, image=red())
    assert encoder_calls[0]["input_ids"][0].tolist().count(IMAGE_ID) == 64


def test_run_config_and_run_log_record_the_image_not_its_pixels(tiny_model):
    from diffusiongemma.dgemma.readouts.images import Asked

    result = generate(tiny_model, "What colour is this?", FAST, image=red(96, 48))
    record = result.config.image
    assert set(record) == {"count", "sizes", "sha256", "thumbnail"} and record["sizes"] == [[96, 48]]
    thumb = Asked.of("q", record).thumbnail  # a 24-pixel-high picture for the frames' header, no more
    assert thumb.shape == (24, 48, 3) and (thumb[..., 0] > 200).all() and (thumb[..., 1:] < 50).all()
    assert record == prepare_images(tiny_model, red(96, 48)).record
    assert record["sha256"] != prepare_images(tiny_model, colour_image("blue", 96, 48)).record["sha256"]
    header = records(result.trace, result.config, result.state, frame_texts(result.trace, tiny_model.token_strings))[0]
    assert header["image_present"] is True and header["image"] == record
    assert result.config.asdict()["image"] == record
    plain = generate(tiny_model, "What colour is this?", FAST)
    assert plain.config.image is None


def test_encode_takes_an_image_as_context_and_records_it(tiny_model, encoder_calls):
    context = encode_context(tiny_model, "a picture", image=red())
    ids = list(context.token_ids)
    assert ids[:2] == [2, BOI_ID] and ids[2:66] == [IMAGE_ID] * 64 and ids[66] == EOI_ID
    assert encoder_calls[0]["pixel_values"] is not None and encoder_calls[0]["input_ids"].shape[1] == 67
    assert context.summary()["images"] == [prepare_images(tiny_model, red()).record]
    alone = encode_context(tiny_model, "", image=red())
    assert alone.length == 67
    # A different picture is a different context even though the ids are the same.
    other = encode_context(tiny_model, "", image=colour_image("blue", 64, 64))
    assert other.token_ids == alone.token_ids and other.summary() != alone.summary()
    more = encode_context(tiny_model, "and then", onto=alone)
    assert more.summary()["images"] == alone.summary()["images"]


def test_denoise_carries_the_turns_image_into_the_advanced_cache(tiny_model):
    (_, _, _, _, _, config, advanced), _ = call(Denoise, model=tiny_model, prompt="What colour?", image=red(),
                                                **{k: v for k, v in FAST.asdict().items()})
    assert advanced.summary()["images"] == [config.image]
    turn = prompt_ids(tiny_model, "What colour?", False, images=prepare_images(tiny_model, red()))
    assert list(advanced.token_ids[:len(turn)]) == turn  # the random model may write any id after it


def test_sampler_and_encode_nodes_take_an_optional_image(tiny_model):
    for cls in (Sampler, Denoise, Encode):
        assert cls.INPUT_TYPES()["optional"]["image"][0] == "IMAGE"
    (text, state, trace, frames, images, config), _ = call(Sampler, model=tiny_model, prompt="What colour?",
                                                           image=red(), **FAST.asdict())
    assert config.image["count"] == 1 and len(frames) == len(trace)
    (cache,), _ = call(Encode, model=tiny_model, text="", image=red())
    assert cache.summary()["images"][0]["sizes"] == [[64, 64]]


BAD_IMAGES = {
    "empty batch": (torch.zeros(0, 64, 64, 3), "empty"),
    "no pixels": (torch.zeros(1, 0, 64, 3), "empty"),
    "a mask": (torch.zeros(1, 64, 64), "MASK"),
    "a bare mask": (torch.zeros(64, 64), "MASK"),
    "no batch axis": (torch.zeros(64, 64, 3), "shape"),
    "channels first": (torch.zeros(1, 3, 64, 64), "shape"),
    "integers": (torch.zeros(1, 64, 64, 3, dtype=torch.uint8), "dtype"),
    "not finite": (torch.full((1, 8, 8, 3), float("nan")), "NaN"),
    "enormous": (torch.zeros(1, 9000, 2, 3), "over 8192"),
    "too many": (torch.zeros(MAX_IMAGES + 1, 4, 4, 3), "limit"),
    "a list": ([[0.0]], "IMAGE tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_IMAGES))
def test_bad_images_are_refused_before_any_work(tiny_model, encoder_calls, case):
    image, words = BAD_IMAGES[case]
    with pytest.raises(InputError, match=words) as err:
        generate(tiny_model, "What colour?", FAST, image=image)
    assert err.value.name == "image" and not encoder_calls
    with pytest.raises(InputError, match=words):
        encode_context(tiny_model, "text", image=image)
    assert not encoder_calls


def test_node_refusals_add_the_comfy_hint(tiny_model):
    with pytest.raises(InputError, match="in ComfyUI: wire an IMAGE"):
        call(Sampler, model=tiny_model, prompt="x", image=torch.zeros(1, 64, 64), **FAST.asdict())


def test_a_model_that_cannot_see_refuses_an_image(tiny_model, encoder_calls, monkeypatch):
    blind = dataclasses.replace(tiny_model, image_processor=None)
    with pytest.raises(InputError, match="no image processor"):
        generate(blind, "What colour?", FAST, image=red())
    monkeypatch.setitem(tiny_model.model.model.encoder._modules, "vision_tower", None)  # undone as a dict item
    with pytest.raises(InputError, match="no vision tower"):
        generate(tiny_model, "What colour?", FAST, image=red())
    with pytest.raises(InputError, match="no vision tower"):
        encode_context(tiny_model, "", image=red())
    assert not encoder_calls


def test_a_template_without_image_parts_is_refused(tiny_model, monkeypatch):
    template = tiny_model.tokenizer.chat_template
    monkeypatch.setattr(tiny_model.tokenizer, "chat_template", template.replace("'<|image|>'", "''"))
    with pytest.raises(InputError, match="cannot take images"):
        generate(tiny_model, "What colour?", FAST, image=red())


def test_the_advanced_sampler_reads_an_image_too(demo_model):
    import torch
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.dgemma import Knobs

    red = torch.zeros(1, 64, 64, 3)
    red[..., 0] = 1.0
    knobs = Knobs(seed=7).asdict()
    out, _ = call(NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"], model=demo_model, prompt="What colour is this?",
                  scheduler="entropy_bound", start_step=0, end_step=knobs["num_inference_steps"], pins="",
                  image=red, **knobs)
    assert out[0] == "red" and out[5].image["count"] == 1


def test_a_picture_below_the_processors_minimum_is_refused_by_name(demo_model, no_model_work):
    """The processor stretches a 3-pixel side to one pooled patch: the picture would reach the model as one
    row of soft tokens (the demo reads 64x3 blue as 'ubue'), so it is refused before any model work."""
    knobs = Knobs(seed=7)
    with pytest.raises(InputError) as caught:
        generate(demo_model, "What colour is this?", knobs, image=colour_image("blue", 64, 3))
    assert caught.value.name == "image" and str(caught.value).startswith(
        "image: image 1 (64x3 pixels) is below the image processor's minimum: it would reach the model as a single "
        "row of 38 soft tokens") and "pad it" in str(caught.value)
    with pytest.raises(InputError, match="single column"):
        prepare_images(demo_model, colour_image("blue", 3, 64))
    for width, height in ((64, 64), (96, 48), (64, 8), (2, 2)):
        assert "warnings" not in prepare_images(demo_model, colour_image("blue", width, height)).record


def test_a_picture_with_its_shape_kept_runs_without_a_warning(demo_model):
    knobs = Knobs(seed=7)
    plain = generate(demo_model, "What colour is this?", knobs, image=colour_image("blue", 64, 64))
    assert plain.text == "blue" and "warning" not in str(plain.config)
