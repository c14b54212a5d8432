"""Image input: check a ComfyUI-style IMAGE batch, run it through the model's own image processor.

The encoder alone sees images: each one becomes `<|image>` + one `<|image|>` placeholder per soft
token + `<image|>` (Gemma4Processor's expansion), and the vision tower's features replace the
placeholders in the encoder prefill. The canvas never holds image tokens.
"""

from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InputError

MAX_SIDE = 8192      # pixels a side: larger images are refused before any resize
MAX_IMAGES = 16      # one turn holds the whole batch as several images
SLACK = 0.5 / 255    # values this far outside 0..1 still round to a valid 8-bit level


@dataclass(frozen=True, eq=False)
class ImageInput:
    """A checked image batch as the model will see it: the processor's tensors and a provenance record."""

    pixel_values: torch.Tensor
    position_ids: torch.Tensor
    soft_tokens: tuple[int, ...]   # placeholders per image, as the processor counted them
    record: dict                   # count, sizes and a content hash; never the pixels

    def expand(self, ids: list[int], image_id: int, boi_id: int, eoi_id: int) -> list[int]:
        """Replace each image placeholder the template placed by the processor's full image block."""
        out, n = [], 0
        for i in ids:
            if i == image_id:
                out += [boi_id] + [image_id] * self.soft_tokens[n] + [eoi_id]
                n += 1
            else:
                out.append(i)
        return out

    def encoder_kwargs(self, ids: torch.Tensor, image_id: int, device, dtype) -> dict:
        """What the encoder prefill takes beside the ids, as the diffusers pipeline passes it."""
        return {"pixel_values": self.pixel_values.to(device=device, dtype=dtype),
                "image_position_ids": self.position_ids.to(device),
                "mm_token_type_ids": (ids == image_id).long()}


def check_image_tensor(name: str, image) -> torch.Tensor:
    """Refuse anything but a float [B, H, W, C] batch (C 3 or 4, values in 0..1) of a sane size."""
    if not isinstance(image, torch.Tensor):
        raise InputError(name, f"{name} must be an IMAGE tensor, got {type(image).__name__}; wire an IMAGE output "
                               "(Load Image, a VAE Decode)")
    _check_shape(name, image)
    _check_values(name, image)
    return image


def _check_shape(name: str, image: torch.Tensor) -> None:
    """An IMAGE's [B, H, W, C] layout, not a MASK, not empty, within the count and side limits."""
    shape = tuple(image.shape)
    if image.ndim == 2 or (image.ndim == 3 and shape[-1] not in (3, 4)):
        raise InputError(name, f"{name} has shape {list(shape)}, which is a MASK, not an IMAGE; wire an IMAGE "
                               "output, or convert it with Convert Mask to Image")
    if image.ndim != 4 or shape[-1] not in (3, 4):
        raise InputError(name, f"{name} has shape {list(shape)}; an IMAGE is [batch, height, width, 3 or 4 "
                               "channels]; wire an IMAGE output")
    if shape[0] == 0 or shape[1] == 0 or shape[2] == 0:
        raise InputError(name, f"{name} is empty (shape {list(shape)}); give at least one image with pixels")
    if shape[0] > MAX_IMAGES:
        raise InputError(name, f"{name} holds {shape[0]} images, over the limit of {MAX_IMAGES} for one turn; "
                               "pick fewer (Image From Batch)")
    if max(shape[1], shape[2]) > MAX_SIDE:
        raise InputError(name, f"{name} is {shape[2]}x{shape[1]} pixels, over {MAX_SIDE} a side; scale it down "
                               "first (the processor resizes it to a few hundred pixels anyway)")


def _check_values(name: str, image: torch.Tensor) -> None:
    """Real floats in 0..1 (within SLACK), none of them NaN or infinite."""
    if not image.is_floating_point():
        raise InputError(name, f"{name} has dtype {str(image.dtype).removeprefix('torch.')}; an IMAGE holds "
                               "floats in 0..1; convert it, or wire an IMAGE output")
    if image.device.type == "meta":
        raise InputError(name, f"{name} is a meta tensor (a shape with no pixels); give a real tensor from a node "
                               "that loads or makes pixels")
    if not bool(torch.isfinite(image).all()):
        raise InputError(name, f"{name} holds NaN or infinite values; check the node that made it")
    lo, hi = float(image.min()), float(image.max())
    if lo < -SLACK or hi > 1 + SLACK:
        fix = "divide it by 255 (it looks like 0..255 pixel levels)" if lo >= -SLACK and hi <= 255 + SLACK \
            else "rescale it into 0..1"
        raise InputError(name, f"{name} holds values from {lo:g} to {hi:g}, but an IMAGE holds floats in 0..1 and "
                               f"nothing is guessed; {fix}")


def check_vision(name: str, dm) -> None:
    """Refuse an image before work when the model cannot read one."""
    encoder = dm.model.model.encoder
    if getattr(dm, "quant", None) == "gguf":
        raise InputError(name, f"model {dm.source!r} is a GGUF, which has no vision tower (llama.cpp's converter "
                               f"drops it), so it cannot read an {name}; unwire {name}, or load the safetensors "
                               "checkpoint (google/diffusiongemma-26B-A4B-it) for images")
    if getattr(encoder, "vision_tower", None) is None or getattr(dm.model.config, "vision_config", None) is None:
        raise InputError(name, f"model {dm.shown!r} has no vision tower, so it cannot read an {name}; unwire "
                               f"{name} or load a checkpoint with vision")
    if dm.image_processor is None:
        raise InputError(name, f"model {dm.shown!r} ships no image processor (preprocessor_config.json), so an "
                               f"{name} cannot be prepared for it; unwire {name}, or add the checkpoint's "
                               "processor files (the real Gemma4Processor also needs torchvision)")
    if image_token_ids(dm) is None:
        raise InputError(name, f"the tokenizer of {dm.shown!r} has no image tokens (<|image>, <|image|>, "
                               f"<image|>); unwire {name} or load a checkpoint with vision")


def image_token_ids(dm) -> tuple[int, int, int] | None:
    """(image placeholder, begin-of-image, end-of-image) ids, as the model's config names them."""
    config = dm.model.config
    ids = tuple(getattr(config, k, None) for k in ("image_token_id", "boi_token_id", "eoi_token_id"))
    return None if None in ids else ids


def to_uint8(image: torch.Tensor) -> list[np.ndarray]:
    """RGB uint8 arrays the way ComfyUI saves an IMAGE (alpha dropped); the processor resizes them."""
    pixels = np.clip(255.0 * image[..., :3].detach().float().cpu().numpy(), 0, 255).astype(np.uint8)
    return [np.ascontiguousarray(p) for p in pixels]


def record(arrays: list[np.ndarray]) -> dict:
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(f"{a.shape}".encode())
        digest.update(a.tobytes())
    return {"count": len(arrays), "sizes": [[int(a.shape[1]), int(a.shape[0])] for a in arrays],
            "sha256": digest.hexdigest()[:16], "thumbnail": thumbnail(arrays[0]) if arrays else None}


THUMB_H = 24  # pixels: two text rows of a frame's header


def thumbnail(pixels: np.ndarray) -> str:
    """The first image, THUMB_H pixels high (at most twice as wide), as base64 PNG: small enough for
    the run config and run log, so frames replayed from a log show it too."""
    from PIL import Image

    h, w = pixels.shape[:2]
    size = (max(1, min(2 * THUMB_H, round(THUMB_H * w / h))), THUMB_H)
    out = io.BytesIO()
    Image.fromarray(pixels).resize(size, Image.Resampling.BOX).save(out, "PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode()



def image_record(image) -> dict | None:
    """The record of a checked IMAGE batch (None for no image), without the processor."""
    return None if image is None else record(to_uint8(image))


def prepare_images(dm, image, name: str = "image") -> ImageInput:
    """Check `image`, then run it through the model's image processor (which resizes it)."""
    check_image_tensor(name, image)
    check_vision(name, dm)
    arrays = to_uint8(image)
    try:
        # Said outright: a picture 1-3 pixels high would otherwise be guessed to be channels first.
        out = dm.image_processor(images=arrays, return_tensors="pt", input_data_format="channels_last")
    except (ValueError, TypeError) as err:
        raise InputError(name, f"the model's image processor refused {name} ({err}); try an image with a less "
                               "extreme aspect ratio") from None
    counts = tuple(int(n) for n in out["num_soft_tokens_per_image"])
    thin = thin_warnings(arrays, out["image_position_ids"], getattr(dm.image_processor, "pooling_kernel_size", 1),
                         counts)
    if thin:  # refused, not warned: a warning in the run config alone reaches no one, and the answer is wrong
        raise InputError(name, f"{name}: {thin[0]}")
    return ImageInput(out["pixel_values"], out["image_position_ids"], counts, record(arrays))


def thin_warnings(arrays, position_ids: torch.Tensor, pool: int, counts) -> list[str]:
    """Pictures the processor turns into one row (or column) of soft tokens: it stretches the short side up
    to one pooled patch, so the picture's shape is lost and a model may misread it."""
    out = []
    for i, (pixels, ids) in enumerate(zip(arrays, position_ids)):
        used = ids[(ids >= 0).all(-1)]
        if not len(used):
            continue
        cols, rows = (int(used[:, 0].max()) // max(pool, 1) + 1, int(used[:, 1].max()) // max(pool, 1) + 1)
        if min(cols, rows) == 1 and max(cols, rows) > 1:
            h, w = pixels.shape[:2]
            line = "row" if rows == 1 else "column"
            out.append(f"image {i + 1} ({w}x{h} pixels) is below the image processor's minimum: it would reach "
                       f"the model as a single {line} of {counts[i]} soft tokens (the processor stretches its short "
                       "side to one pooled patch), its shape lost and misread; pad it to a less extreme shape "
                       "(e.g. Pad Image for Outpainting) or scale it up")
    return out
