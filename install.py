"""Install what this pack needs into the Python that runs it, without touching ComfyUI's own packages.

ComfyUI-Manager runs this file with ComfyUI's interpreter after requirements.txt. It reports the
versions it finds, installs only what is missing or too old, and pins every package ComfyUI core
ships (torch, numpy, pillow, ...) at its installed version so pip can neither downgrade nor
upgrade them. Run it by hand the same way: `path/to/comfy/python install.py` (`--dry-run` to see).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

try:
    from packaging.requirements import Requirement
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
KEEP = ("torch", "torchvision", "torchaudio", "numpy", "pillow")  # what ComfyUI core ships and needs
TAG = "[ComfyUI-DiffusionGemma install]"


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def plan(requirements: list[str]) -> tuple[list[str], list[str]]:
    """(report lines, requirement strings to install)."""
    lines, todo = [f"{TAG} python {sys.version.split()[0]} at {sys.executable}"], []
    for text in requirements:
        req = Requirement(text)
        version = installed(req.name)
        if version is not None and req.specifier.contains(version, prereleases=True):
            lines.append(f"{TAG} ok        {req.name} {version}")
        else:
            lines.append(f"{TAG} install   {req} (found {version or 'nothing'})")
            todo.append(str(req))
    return lines, todo


def read_requirements(path: Path) -> list[str]:
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    requirements = read_requirements(HERE / "requirements.txt")
    lines, todo = plan(requirements)
    print("\n".join(lines))
    if not todo:
        print(f"{TAG} all requirements satisfied")
        return 0
    pins = [f"{name}=={v}" for name in KEEP if (v := installed(name))]
    with tempfile.TemporaryDirectory(prefix="dgemma-install-") as folder:  # removed however pip ends
        constraints = Path(folder) / "constraints.txt"
        constraints.write_text("\n".join(pins) + "\n")
        command = [sys.executable, "-m", "pip", "install", "--constraint", str(constraints), *todo]
        print(f"{TAG} keeping {', '.join(pins) or 'nothing'} as installed")
        print(f"{TAG} running: {' '.join(command)}")
        if dry:
            return 0
        done = subprocess.run(command)
    if done.returncode != 0:
        print(f"{TAG} FAILED; run by hand with the Python that runs ComfyUI:\n"
              f"  {sys.executable} -m pip install {' '.join(repr(t) for t in todo)}")
        return 1
    print(f"{TAG} done; restart ComfyUI")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
