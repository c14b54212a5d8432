#!/usr/bin/env bash
# One-time setup for the demo and the tests outside ComfyUI: a virtual environment in .venv with
# requirements-dev.txt. A venv because Debian and Ubuntu refuse `pip install` into the system
# Python (PEP 668). Then: .venv/bin/python -m headless   and   .venv/bin/python -m pytest
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -m venv .venv; then
  echo "setup: '$PYTHON -m venv' failed; on Debian/Ubuntu install it with: sudo apt-get install -y python3-venv" >&2
  exit 1
fi
.venv/bin/python -m pip install --disable-pip-version-check -q -r requirements-dev.txt
echo "setup: ready. The demo: .venv/bin/python -m headless   The tests: .venv/bin/python -m pytest"
echo "setup: the browser test needs Debian's chromium and playwright-core (bash .ci/browser.sh); without them it is skipped"
