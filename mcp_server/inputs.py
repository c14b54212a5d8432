"""Turning tool arguments into engine inputs: images, seeds, the window's start, the output folder.

Each function refuses a bad value with an `InputError` naming the argument, before any model work.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import Path

from ..dgemma.denoising.resume import AUTO, resolve_start
from ..dgemma.errors import InputError, short
from ..dgemma.inputs.knobs import SEED_MAX
from ..dgemma.inputs.pictures import read_picture

MAX_IMAGE_BYTES = 32 * 2**20
NAME_MAX = 255  # bytes of one folder name, on every common file system
_DATA_URL = re.compile(r"^data:image/[a-z.+-]+;base64,", re.IGNORECASE)


def seed(value) -> int:
    """A seed from an integer, or from a string of digits (for seeds past 2^53 - 1, which JSON rounds)."""
    if isinstance(value, str):
        if not value.strip().isdigit() or len(value.strip()) > len(str(SEED_MAX)):
            raise InputError("seed", f"seed must be an integer or a string of digits up to {SEED_MAX}, got "
                                     f"{short(value)}; pass e.g. 0 or \"18446744073709551615\"")
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise InputError("seed", f"seed must be an integer from 0 to {SEED_MAX}, got {short(value)}; pass seeds "
                                 "above 2^53 - 1 as a string of digits")
    return value


def start_step(value, resume) -> int:
    """The window's start: an integer, or "auto" (where the resumed run paused, else 0)."""
    if isinstance(value, str) and value != "auto":
        raise InputError("start_step", f"start_step must be an integer or \"auto\", got {short(value)}")
    return resolve_start(AUTO if value == "auto" else value, resume)


def folder(value: str, name: str = "output_dir") -> Path:
    """An output folder: text without NUL bytes, not an existing file; it is created when the run writes."""
    if "\0" in value:
        raise InputError(name, f"{name} holds a NUL byte ({short(value)}); no folder name can; pass a plain path")
    try:
        path = Path(value or "output").expanduser().resolve()
        if any(len(part.encode("utf-8", "replace")) > NAME_MAX for part in path.parts):
            raise OSError(36, "File name too long")  # found here, not when the run's files are written
        for up in (path, *path.parents):
            if up.exists():
                if not up.is_dir():
                    raise InputError(name, f"{name} {short(str(path))} is not a folder ({short(str(up))} is a "
                                           "file); pass a folder, or a path where one can be made")
                break
    except (OSError, RuntimeError) as err:  # a name too long, a symlink loop
        why = getattr(err, "strerror", None) or err
        raise InputError(name, f"{name} {short(value)} cannot be used as a folder ({why}); pass a plain path") from None
    return path


def image(value: str, allowed: tuple[Path, ...]):
    """An IMAGE batch [1, H, W, 3] in 0..1 from base64 PNG/JPEG (a data URL or bare) or a path under `allowed`.

    The picture's size is read from its header and held to the pixel budget before it is decoded.
    """
    import torch

    return torch.from_numpy(read_picture(_image_bytes(value, allowed), "image"))[None]


def _image_bytes(value: str, allowed: tuple[Path, ...]) -> bytes:
    if "\0" in value:
        raise InputError("image", "image holds a NUL byte; pass base64 PNG/JPEG or a plain path")
    if not value.strip():
        raise InputError("image", "image is empty; pass base64 PNG/JPEG bytes or a path, or leave image out")
    if _DATA_URL.match(value) or len(value) > 4096:
        return _decode(_DATA_URL.sub("", value))
    path = Path(value).expanduser()
    if not path.is_absolute() and not path.exists() and re.fullmatch(r"[A-Za-z0-9+/=\s]+", value):
        return _decode(value)
    path = path.resolve()
    if not any(path.is_relative_to(root) for root in allowed):
        raise InputError("image", f"image path {str(path)!r} is outside the folders this server reads pictures "
                                  f"from ({', '.join(map(str, allowed))}); copy it there, pass its bytes as base64, "
                                  "or start the server with --image-dir")
    if not path.is_file():
        raise InputError("image", f"image path {str(path)!r} is not a file; check the path")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise InputError("image", f"image file is over {MAX_IMAGE_BYTES // 2**20} MiB; scale it down first")
    return path.read_bytes()


def _decode(text: str) -> bytes:
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InputError("image", f"image is over {MAX_IMAGE_BYTES // 2**20} MiB of base64; scale it down first")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InputError("image", "image is neither valid base64 nor a path to a file; pass base64 PNG/JPEG "
                                  "bytes (optionally as a data: URL) or a path") from None
