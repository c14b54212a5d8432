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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_page_on_another_origin_cannot_drive_the_server():
    """tests/browser/csrf.test.mjs: a page at another loopback origin gets no answer and starts nothing;
    the same page is served when the server names its origin with --allow-origin."""
    import json

    from remote_server import served
    from serve_client import health

    missing = _missing()
    if missing and os.environ.get("CI", "").lower() in ("", "0", "false"):
        pytest.skip(missing)
    assert missing is None, missing
    page = _free_port()
    with served() as (url, _), served("--allow-origin", f"http://127.0.0.1:{page}") as (open_url, _):
        proc = subprocess.run([shutil.which("node"), str(BROWSER_DIR / "csrf.test.mjs"), url, open_url, str(page)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=180)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"csrf.test.mjs exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        got = json.loads(lines[0][len("RESULT "):])
        print(json.dumps(got, indent=1)[:3000])
        after, after_open = health(url), health(open_url)
    attacks, allowed = got["attacks"], got["allowed"]
    for name, answer in attacks.items():  # a failed fetch, or an opaque answer the page cannot read
        assert "error" in answer or (answer["type"] == "opaque" and answer["body"] == ""), (name, answer)
    assert after["started"] == 0 and after["contexts"] == 0 and after["busy"] == 0, after
    assert got["rebound"]["status"] == 403 and "Host header" in got["rebound"]["body"], got["rebound"]
    assert got["reboundHealth"]["status"] == 403 and got["localhost"]["status"] == 200
    assert allowed["jsonChat"]["status"] == 200 and '"seven"' in allowed["jsonChat"]["body"], allowed
    assert allowed["plainChat"]["status"] == 415 and allowed["readModels"]["status"] == 200, allowed
    assert after_open["started"] == 1 and after_open["contexts"] == 0, after_open
