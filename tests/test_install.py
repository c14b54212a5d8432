"""install.py reports, installs only what is missing, and pins ComfyUI's own packages."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from conftest import REPO

spec = importlib.util.spec_from_file_location("pack_install", REPO / "install.py")
install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install)


def test_satisfied_environment_installs_nothing():
    done = subprocess.run([sys.executable, str(REPO / "install.py"), "--dry-run"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all requirements satisfied" in done.stdout and "ok        transformers" in done.stdout


def test_missing_or_old_packages_are_installed_with_core_pins_and_no_file_is_left(monkeypatch, capsys):
    monkeypatch.setattr(install, "read_requirements", lambda path: ["transformers>=99", "no-such-package-xyz>=1"])
    seen = {}

    def pip(command):
        seen["path"] = Path(command[command.index("--constraint") + 1])
        seen["pins"] = seen["path"].read_text()
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(install.subprocess, "run", pip)
    assert install.main([]) == 0
    out = capsys.readouterr().out
    assert "install   transformers>=99 (found 5." in out and "(found nothing)" in out
    command = [line for line in out.splitlines() if "running:" in line][0]
    assert "--constraint" in command and command.endswith("transformers>=99 no-such-package-xyz>=1")
    assert "torch==" in seen["pins"] and "numpy==" in seen["pins"]
    assert not seen["path"].exists() and not seen["path"].parent.exists()


def test_registry_metadata_is_complete():
    import tomllib
    from PIL import Image

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == {"file": "LICENSE"}
    head = (REPO / "LICENSE").read_text().split()[:5]
    assert head == ["GNU", "GENERAL", "PUBLIC", "LICENSE", "Version"] and "Version 3, 29 June 2007" in \
        (REPO / "LICENSE").read_text()[:200]
    assert any("GPLv3+" in c for c in project["project"]["classifiers"])
    comfy = project["tool"]["comfy"]
    assert comfy["requires-comfyui"].startswith(">=") and comfy["PublisherId"] and comfy["DisplayName"]
    icon = REPO / comfy["Icon"].split("/main/", 1)[1]
    with Image.open(icon) as image:
        assert image.format == "PNG" and image.width == image.height <= 400
