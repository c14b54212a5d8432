"""Stand-ins for ComfyUI core preview/save nodes (and Video Combine) in headless runs.

Their inputs mirror the real nodes', so a graph that validates here validates in ComfyUI.
"""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from ..dgemma.readouts.outfiles import save_new, target_folder
from ..nodes import host

VIDEO_FORMATS = ["image/gif", "image/webp", "video/h264-mp4", "video/webm"]


def _pil_frames(images) -> list[Image.Image]:
    array = (np.clip(images.cpu().numpy(), 0.0, 1.0) * 255).round().astype(np.uint8)
    return [Image.fromarray(frame) for frame in array]


def _save_pngs(images, prefix: str) -> list[str]:
    paths = []
    for frame in _pil_frames(images):
        paths.append(str(save_new(host.output_dir(), prefix, "_.png", lambda fh, f=frame: f.save(fh, "PNG"))))
    return paths


def describe(value) -> str:
    """What ComfyUI's PreviewAny shows: text as is, JSON when it serialises, else str() (the
    payloads' short summaries)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    try:
        return json.dumps(value, indent=4)
    except (TypeError, ValueError):
        return str(value)


class PreviewAny:
    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"source": ("*", {})}}

    def run(self, source=None):
        return {"ui": {"text": [describe(source)]}}


class _Saver:
    """A saving node: its filename_prefix is refused while the graph is validated, before any node runs."""

    OUTPUT_NODE = True
    RETURN_TYPES = ()
    FUNCTION = "run"

    @classmethod
    def VALIDATE_INPUTS(cls, filename_prefix=None, **_):
        if filename_prefix is None:
            return True
        try:
            target_folder(host.output_dir(), filename_prefix)
        except ValueError as err:
            return str(err)
        return True


class SaveImage(_Saver):

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE", {}), "filename_prefix": ("STRING", {"default": "ComfyUI"})}}

    def run(self, images, filename_prefix="ComfyUI"):
        return {"ui": {"images": _save_pngs(images, filename_prefix)}}


class PreviewImage(SaveImage):
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"images": ("IMAGE", {})}}

    def run(self, images):
        return {"ui": {"images": _save_pngs(images, "preview/ComfyUI_temp")}}


def _save_animation(images, prefix: str, fps: float, loop: int, fmt: str, pingpong: bool) -> str:
    frames = _pil_frames(images)
    if pingpong and len(frames) > 2:
        frames = frames + frames[-2:0:-1]
    kind = {"image/gif": ("GIF", ".gif"), "image/webp": ("WEBP", ".webp")}.get(fmt)
    if kind is None:
        raise ValueError(f"format {fmt!r} needs ffmpeg through VideoHelperSuite; headless runs write "
                         "image/gif or image/webp (or run the graph in ComfyUI with --server)")

    def write(fh):
        buffer = io.BytesIO()
        frames[0].save(buffer, kind[0], save_all=True, append_images=frames[1:],
                       duration=max(1, round(1000 / fps)), loop=loop)
        fh.write(buffer.getvalue())

    return str(save_new(host.output_dir(), prefix, kind[1], write))


class SaveAnimatedWEBP(_Saver):

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE", {}), "filename_prefix": ("STRING", {"default": "ComfyUI"}),
            "fps": ("FLOAT", {"default": 6.0, "min": 0.01, "max": 1000.0}),
            "lossless": ("BOOLEAN", {"default": True}), "quality": ("INT", {"default": 80, "min": 0, "max": 100}),
            "method": (["default", "fastest", "slowest"], {})}}

    def run(self, images, filename_prefix, fps, lossless, quality, method):
        return {"ui": {"images": [_save_animation(images, filename_prefix, fps, 0, "image/webp", False)]}}


class VHS_VideoCombine(_Saver):
    RETURN_TYPES = ("VHS_FILENAMES",)
    FUNCTION = "run"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "images": ("IMAGE", {}), "frame_rate": ("FLOAT", {"default": 8, "min": 1}),
            "loop_count": ("INT", {"default": 0, "min": 0, "max": 100}),
            "filename_prefix": ("STRING", {"default": "AnimateDiff"}), "format": (VIDEO_FORMATS, {}),
            "pingpong": ("BOOLEAN", {"default": False}), "save_output": ("BOOLEAN", {"default": True})}}

    def run(self, images, frame_rate, loop_count, filename_prefix, format, pingpong=False, save_output=True):
        prefix = filename_prefix if save_output else f"preview/{filename_prefix}"
        path = _save_animation(images, prefix, frame_rate, loop_count, format, pingpong)
        return {"ui": {"gifs": [path]}, "result": ((save_output, [path]),)}


class EmptyImage:
    """A solid colour IMAGE batch; `color` is 0xRRGGBB, as ComfyUI's colour widget gives it."""

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls):
        size = {"default": 512, "min": 1, "max": 16384, "step": 1}
        return {"required": {"width": ("INT", size), "height": ("INT", size),
                             "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
                             "color": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1,
                                               "display": "color"})}}

    def generate(self, width, height, batch_size=1, color=0):
        import torch

        rgb = torch.tensor([(color >> 16) & 0xFF, (color >> 8) & 0xFF, color & 0xFF], dtype=torch.float32) / 0xFF
        return (rgb.expand(batch_size, height, width, 3).clone(),)


CORE_NODES = {c.__name__: c for c in (PreviewAny, SaveImage, PreviewImage, SaveAnimatedWEBP, VHS_VideoCombine,
                                      EmptyImage)}
