"""Output files that are written whole or not at all, numbered like ComfyUI's SaveImage.

A file is written to a temporary name, then hard-linked to the first free numbered name (a
link refuses an existing name, so nothing is overwritten), so a failure midway leaves nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def target_folder(output_dir: Path, prefix: str) -> tuple[Path, str]:
    """Split a SaveImage-style prefix ("sub/name") and refuse one that leaves the output folder."""
    if not isinstance(prefix, str) or not prefix.strip():
        raise ValueError("filename_prefix is empty; give a name such as 'dgemma_run_log'")
    if os.path.isabs(prefix) or re.match(r"^[A-Za-z]:", prefix) or ".." in re.split(r"[\\/]", prefix):
        raise ValueError(f"filename_prefix {prefix!r} points outside the output folder; use a relative name "
                         "such as 'runs/dgemma_run_log'")
    base = Path(output_dir).resolve()
    full = (base / prefix).resolve()
    if os.path.commonpath([base, full]) != str(base):
        raise ValueError(f"filename_prefix {prefix!r} points outside the output folder {str(base)!r}")
    return full.parent, full.name


def save_new(output_dir: Path, prefix: str, suffix: str, write: Callable[[BinaryIO], None]) -> Path:
    """Run `write` on a temporary file, then publish it as <prefix>_<counter><suffix>."""
    folder, name = target_folder(output_dir, prefix)
    folder.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(re.escape(name) + r"_(\d{5,})" + re.escape(suffix) + "$")
    counter = 1 + max((int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))), default=0)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}_", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        while True:
            path = folder / f"{name}_{counter:05}{suffix}"
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                counter += 1
    finally:
        os.unlink(tmp)
