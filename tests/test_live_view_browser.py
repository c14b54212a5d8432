"""The live view in a real browser: runs tests/browser/live_view.test.mjs (chromium + playwright-core).

Under CI (the CI variable set, as .ci/run does) a missing browser or playwright-core fails the
test; elsewhere it is skipped with the reason, so a newcomer's `python -m pytest` passes. Install
them with `apt-get install -y chromium` and `npm install` in tests/browser (or run .ci/browser.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

BROWSER_DIR = Path(__file__).resolve().parent / "browser"
SCRIPT = BROWSER_DIR / "live_view.test.mjs"
HOW = ("install them with `apt-get install -y chromium` and `cd tests/browser && npm install` "
       "(or run .ci/browser.sh)")


def _missing() -> str | None:
    """What the browser test lacks, or None."""
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    if not shutil.which("node"):
        return f"node is not on PATH; the browser test needs Node.js 20+, chromium and playwright-core: {HOW}"
    if not Path(chromium).is_file():
        return f"chromium is missing at {chromium}: {HOW}"
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir():
        return f"playwright-core is missing from {BROWSER_DIR / 'node_modules'}: {HOW}"
    return None


def test_live_view_in_chromium():
    missing = _missing()
    if missing and os.environ.get("CI", "").lower() in ("", "0", "false"):
        pytest.skip(missing)
    assert missing is None, missing
    node = shutil.which("node")
    proc = subprocess.run([node, str(SCRIPT)], cwd=BROWSER_DIR, capture_output=True, text=True,
                          timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"live_view.test.mjs exited {proc.returncode}:\n{output}"
    print(output)
