#!/usr/bin/env bash
# Make sure a headless-capable Chromium exists, for the real-browser check of report.html
# (tests/readers/test_report_browser.py).
#
# Idempotent: does nothing when `chromium` (or $CHROMIUM) is already on PATH. Otherwise, as root on
# Debian/Ubuntu, installs the Debian package `chromium` without recommends. No service is started.
# Exit status: 0 when chromium is available at the end, 1 when it is not (with a message saying why);
# the browser test then skips with that reason.
set -euo pipefail

CHROMIUM=${CHROMIUM:-chromium}

say() { printf 'ensure-chromium: %s\n' "$*"; }

if command -v "$CHROMIUM" >/dev/null 2>&1; then
    say "found $(command -v "$CHROMIUM") ($("$CHROMIUM" --version 2>/dev/null | head -n1 || true)); nothing to do"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "$CHROMIUM is missing and this is not root: install it yourself (Debian:"
    say "  sudo apt-get install -y --no-install-recommends chromium) or the browser check is skipped"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "$CHROMIUM is missing and apt-get is not available: install Chromium by hand"
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
say "installing chromium (apt-get install -y --no-install-recommends chromium)"
if ! apt-get install -y --no-install-recommends chromium; then
    say "install failed; refreshing the package lists (apt-get update) and trying once more"
    apt-get update
    apt-get install -y --no-install-recommends chromium
fi

if command -v "$CHROMIUM" >/dev/null 2>&1; then
    say "installed $(command -v "$CHROMIUM") ($("$CHROMIUM" --version 2>/dev/null | head -n1 || true))"
    exit 0
fi
say "the chromium package is installed but $CHROMIUM is still not on PATH"
exit 1
