#!/usr/bin/env bash
# The headless Chromium the suite opens report.html in (tests/browser.py), as a person would see it.
# Debian's chromium-headless-shell: the browser without a display server. Installed only where apt-get can
# (root on Debian or Ubuntu, as in CI); elsewhere the page tests are skipped, and say so.
set -euo pipefail
for exe in chromium-headless-shell chromium google-chrome; do
  if command -v "$exe" >/dev/null 2>&1; then exit 0; fi
done
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get install -y -q chromium-headless-shell >/dev/null 2>&1 || {
    apt-get update -q >/dev/null && apt-get install -y -q chromium-headless-shell >/dev/null; }
else
  echo "install_browser.sh: no headless Chromium and no root apt-get: the report.html tests will be skipped" \
       "(install chromium-headless-shell, or chromium, to run them)" >&2
fi
