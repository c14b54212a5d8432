"""The live view in a real browser: runs tests/browser/live_view.test.mjs (chromium + playwright-core).

Fails, never skips, when the browser or playwright-core is missing: install them with
`apt-get install -y chromium` and `npm install` in tests/browser (or run .ci/browser.sh).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BROWSER_DIR = Path(__file__).resolve().parent / "browser"
SCRIPT = BROWSER_DIR / "live_view.test.mjs"
HOW = ("install them with `apt-get install -y chromium` and `cd tests/browser && npm install` "
       "(or run .ci/browser.sh)")


def test_live_view_in_chromium():
    node = shutil.which("node")
    assert node, f"node is not on PATH; the browser test needs Node.js 20+, chromium and playwright-core: {HOW}"
    chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    assert Path(chromium).is_file(), f"chromium is missing at {chromium}: {HOW}"
    assert (BROWSER_DIR / "node_modules" / "playwright-core").is_dir(), \
        f"playwright-core is missing from {BROWSER_DIR / 'node_modules'}: {HOW}"
    proc = subprocess.run([node, str(SCRIPT)], cwd=BROWSER_DIR, capture_output=True, text=True,
                          timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"live_view.test.mjs exited {proc.returncode}:\n{output}"
    print(output)
