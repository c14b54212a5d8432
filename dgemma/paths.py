"""Paths as anyone is shown them: relative to a known folder (ComfyUI's output or models folder, the pack's
own), or the file's name alone; never the machine's absolute layout. A shared run log, GIF or error would
otherwise tell strangers the user's home folder and how their disk is laid out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ROOTS: dict[str, str] = {}  # absolute folder -> the label shown in its place ("" for none)
# An absolute path of two or more parts (POSIX or Windows), not the path part of a URL (after a host).
_ABSOLUTE = re.compile(r"(?<![\w.:/\\~#-])(?:/|[A-Za-z]:[\\/])(?:[^\s'\"/\\<>|]+[/\\])+[^\s'\"/\\<>|,;)]*")

_SERVER_PATHS = ("/v1/", "/health", "/api/")  # an HTTP server's paths, named in messages: no disk layout


def add_root(folder, label: str = "") -> None:
    """Show paths under `folder` relative to it, after `label` (ComfyUI's output folder: "output")."""
    try:
        resolved = str(Path(folder).expanduser().resolve())
    except (OSError, RuntimeError, ValueError):
        return
    if resolved not in ("/", "") and len(_ROOTS) < 64:
        _ROOTS[resolved] = label


def _roots() -> list[tuple[str, str]]:
    pack = str(Path(__file__).resolve().parents[1])
    home = os.path.expanduser("~")
    found = {**({home: "~"} if home not in ("/", "~", "") else {}), pack: "", **_ROOTS}
    return sorted(found.items(), key=lambda kv: len(kv[0]), reverse=True)  # the deepest folder first


def shown_path(path) -> str:
    """`path` as shown: relative to the deepest known folder holding it, else its last part."""
    text = str(path)
    if not (text.startswith(("/", "\\")) or re.match(r"[A-Za-z]:[\\/]", text)):
        return text
    for root, label in _roots():
        if text == root or text.startswith(root.rstrip("/\\") + os.sep) or text.startswith(root + "/"):
            rest = text[len(root):].lstrip("/\\")
            return "/".join(p for p in (label, rest) if p) or _name(text)
    return _name(text)


def _name(text: str) -> str:
    return re.split(r"[\\/]", text.rstrip("/\\"))[-1] or text


def _on_disk(path: str) -> bool:
    """Whether `path` is a path of this machine: a Windows one, or one whose first folder exists (a JSON
    pointer such as /$defs/a, or a server's /v1/models, is not)."""
    if not path.startswith("/"):
        return True
    return not path.startswith(_SERVER_PATHS) and os.path.isdir("/" + path[1:].split("/", 1)[0])


def scrub(text) -> str:
    """`text` with every absolute path of this machine in it shown as `shown_path` shows it."""
    return _ABSOLUTE.sub(lambda m: shown_path(m.group(0)) if _on_disk(m.group(0)) else m.group(0), str(text))
