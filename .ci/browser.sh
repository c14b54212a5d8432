#!/usr/bin/env bash
# Install what tests/test_live_view_browser.py needs on a fresh Debian machine:
# Debian's chromium at /usr/bin/chromium and playwright-core in tests/browser/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."

# --- browser live view (tests/browser) ---
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update
  $SUDO apt-get install -y chromium
fi
command -v node >/dev/null || { echo "node (Node.js 20+) is required for tests/browser" >&2; exit 1; }
if [ -f tests/browser/package-lock.json ]; then
  (cd tests/browser && npm ci --no-audit --no-fund)
else
  (cd tests/browser && npm install --no-audit --no-fund)
fi
