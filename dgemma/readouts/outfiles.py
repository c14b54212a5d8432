"""Output files that are written whole or not at all, numbered like ComfyUI's SaveImage.

A file is written to a temporary name, then hard-linked to the first free numbered name (a
link refuses an existing name, so nothing is overwritten), so a failure midway leaves nothing.
Everything a prefix or the output folder could get wrong is refused before a byte is written.
"""

from __future__ import annotations

import os
import re
import reprlib
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

DEFAULT_NAME = "dgemma"  # for a prefix that names only a folder: "runs/", ".", "runs/."
MAX_NAME_BYTES = 200     # per component: leaves room for "_00001_.png" and the temp name under 255
MAX_PATH_BYTES = 4000    # under Linux's 4096, with room for the counter and suffix
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 80
short = _repr.repr  # a prefix quoted in a message, cut so a huge one cannot flood it


def _check_prefix(prefix) -> list[str]:
    """The prefix's components, once it is text a file system can hold and stays inside."""
    if not isinstance(prefix, str):
        raise ValueError(f"filename_prefix must be text, got {short(prefix)} ({type(prefix).__name__}); give a "
                         "name such as 'dgemma_run_log'")
    if not prefix.strip():
        raise ValueError(f"filename_prefix is empty ({prefix!r}); give a name such as 'dgemma_run_log'")
    if "\0" in prefix:
        raise ValueError(f"filename_prefix {short(prefix)} contains a NUL character, which no file name can "
                         "hold; remove it")
    try:
        prefix.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"filename_prefix {short(prefix)} is not valid Unicode text (a lone surrogate); "
                         "retype it") from None
    parts = re.split(r"[\\/]", prefix)
    if os.path.isabs(prefix) or re.match(r"^[A-Za-z]:", prefix) or ".." in parts:
        raise ValueError(f"filename_prefix {short(prefix)} points outside the output folder; use a relative name "
                         "such as 'runs/dgemma_run_log'")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError(f"filename_prefix {short(prefix)} has a name of {len(part.encode('utf-8'))} bytes, "
                             f"over the {MAX_NAME_BYTES} allowed per folder or file name; shorten it")
    return parts


def check_output_dir(output_dir: Path) -> Path:
    """The output folder, resolved; refuses one that is a file."""
    base = Path(output_dir).resolve()
    if base.exists() and not base.is_dir():
        raise ValueError(f"output folder {str(base)!r} is a file, not a folder; move that file away or point "
                         "ComfyUI's output directory (--output-directory) at a folder")
    return base


def target_folder(output_dir: Path, prefix: str) -> tuple[Path, str]:
    """Split a SaveImage-style prefix ("sub/name") and refuse one that leaves the output folder.

    A prefix that ends in a folder ("runs/", ".", "runs/.") writes DEFAULT_NAME files in that folder.
    """
    parts = _check_prefix(prefix)
    base = check_output_dir(output_dir)
    folder = base.joinpath(*(p for p in parts[:-1] if p not in ("", "."))).resolve()  # symlinks followed
    name = parts[-1] if parts[-1] not in ("", ".") else DEFAULT_NAME
    if os.path.commonpath([base, folder]) != str(base):
        raise ValueError(f"filename_prefix {short(prefix)} points outside the output folder {str(base)!r}; "
                         "use a subfolder that is not a link out of it")
    if len(str(folder / name).encode("utf-8")) > MAX_PATH_BYTES:
        raise ValueError(f"filename_prefix {short(prefix)} makes a path over {MAX_PATH_BYTES} bytes; use fewer "
                         "or shorter subfolders")
    return folder, name


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a component is a file, or the folder is read-only
        raise ValueError(f"cannot create the output folder {str(folder)!r} ({exc.strerror}); make the output "
                         "folder writable or choose another filename_prefix") from None


def _temp_file(folder: Path, name: str) -> tuple[int, Path]:
    """A new hidden file; os.open's 0o666 lets the umask decide its mode, as for ComfyUI's own outputs."""
    while True:
        tmp = folder / f".{name}_{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise ValueError(f"cannot write in the output folder {str(folder)!r} ({exc.strerror}); make it "
                             "writable or choose another output folder") from None


def save_new(output_dir: Path, prefix: str, suffix: str, write: Callable[[BinaryIO], None]) -> Path:
    """Run `write` on a temporary file, then publish it as <prefix>_<counter><suffix>."""
    folder, name = target_folder(output_dir, prefix)
    _make_folder(folder)
    pattern = re.compile(re.escape(name) + r"_(\d{5,})" + re.escape(suffix) + "$")
    counter = 1 + max((int(m.group(1)) for p in folder.iterdir() if (m := pattern.match(p.name))), default=0)
    fd, tmp = _temp_file(folder, name)
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
