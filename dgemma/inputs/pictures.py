"""Picture files from untrusted bytes (PNG, JPEG, WebP, GIF): the size read from the header and
held to a pixel budget before a single pixel is decoded; any broken or hostile file is an
InputError naming the input. The server and the MCP server both read pictures through here.
"""

from __future__ import annotations

import io
import struct
import warnings

import numpy as np

from ..errors import InputError

# The image processor resizes every picture to a few hundred pixels a side (its soft-token budget),
# so pixels past this only cost memory: 4096 x 4096 decodes to 50 MB of RGB and 200 MB as floats.
MAX_PIXELS = 4096 * 4096
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")  # what OpenAI takes; no plugin that runs tools (EPS) or parses much


def read_picture(raw: bytes, name: str = "image", budget: int = MAX_PIXELS) -> np.ndarray:
    """An RGB picture as float32 [H, W, 3] in 0..1; refused before decoding when over `budget` pixels."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=FORMATS) as pic:
                width, height = pic.size  # from the header; nothing decoded yet
                if width * height > budget:
                    raise InputError(name, f"{name} is {width}x{height} pixels, over the budget of {budget} "
                                           f"pixels ({_side(budget)}); scale it down first (the model sees a "
                                           "few hundred pixels a side anyway)")
                pixels = np.asarray(pic.convert("RGB"), dtype=np.float32)
                pixels /= 255.0
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(name, f"{name} says it holds more pixels than Pillow decodes safely, far over the budget "
                               f"of {budget} pixels ({_side(budget)}); scale it down first") from None
    except UnidentifiedImageError as err:
        raise InputError(name, f"{name} is not a readable {'/'.join(FORMATS)} picture ({_clip(err)}); send the "
                               "file's bytes unchanged") from None
    except (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error, MemoryError) as err:  # broken
        raise InputError(name, f"{name} could not be decoded ({type(err).__name__}: {_clip(err)}); the file is "
                               "truncated or corrupt, send it whole") from None
    return pixels


def _side(budget: int) -> str:
    side = int(budget ** 0.5)
    return f"{side}x{side}"


def _clip(err: BaseException) -> str:
    text = str(err)
    return text if len(text) <= 120 else text[:117] + "..."
